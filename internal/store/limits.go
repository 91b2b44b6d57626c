package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// LimitRow is one row of job_limits: zero fields are no limit.
type LimitRow struct {
	Type           string
	Concurrency    int
	KeyConcurrency int
	Rate           int
	Per            time.Duration
	Burst          int
	RatePerKey     bool
	UpdatedAt      time.Time
}

func (s *Store) limitsTable() string { return pgx.Identifier{s.schema, "job_limits"}.Sanitize() }

// nullInt is n, or NULL for 0.
func nullInt(n int64) *int64 {
	if n == 0 {
		return nil
	}
	return &n
}

// SetLimit writes the limits of a type, replacing any it had.
func (s *Store) SetLimit(ctx context.Context, l LimitRow) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.limitsTable()+` AS l
	(type, concurrency, key_concurrency, rate, rate_period_ms, burst, rate_per_key, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, now())
ON CONFLICT (type) DO UPDATE SET concurrency = EXCLUDED.concurrency, key_concurrency = EXCLUDED.key_concurrency,
	rate = EXCLUDED.rate, rate_period_ms = EXCLUDED.rate_period_ms, burst = EXCLUDED.burst,
	rate_per_key = EXCLUDED.rate_per_key, updated_at = now()`, Mode,
		l.Type, nullInt(int64(l.Concurrency)), nullInt(int64(l.KeyConcurrency)), nullInt(int64(l.Rate)),
		nullInt(l.Per.Milliseconds()), nullInt(int64(l.Burst)), l.RatePerKey)
	return err
}

// RemoveLimit deletes the limits of a type and its rate state, and reports
// whether it had limits.
func (s *Store) RemoveLimit(ctx context.Context, typ string) (bool, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `WITH d AS (DELETE FROM `+s.limitsTable()+` WHERE type = $1 RETURNING 1),
r AS (DELETE FROM `+pgx.Identifier{s.schema, "job_rates"}.Sanitize()+` WHERE type = $1)
SELECT count(*) FROM d`, Mode, typ).Scan(&n)
	return n > 0, err
}

// Limits lists the limited types, by type.
func (s *Store) Limits(ctx context.Context) ([]LimitRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT type, COALESCE(concurrency, 0), COALESCE(key_concurrency, 0), COALESCE(rate, 0),
	COALESCE(rate_period_ms, 0), COALESCE(burst, 0), rate_per_key, updated_at FROM `+s.limitsTable()+` ORDER BY type`, Mode)
	if err != nil {
		return nil, err
	}
	var out []LimitRow
	var l LimitRow
	var perMS int64
	_, err = pgx.ForEachRow(rows, []any{&l.Type, &l.Concurrency, &l.KeyConcurrency, &l.Rate, &perMS, &l.Burst, &l.RatePerKey, &l.UpdatedAt},
		func() error {
			l.Per = time.Duration(perMS) * time.Millisecond
			out = append(out, l)
			return nil
		})
	return out, err
}

// CleanRates deletes rate states that carry nothing any more (their next
// start time has passed), skipping rows a claim holds, and returns how
// many.
func (s *Store) CleanRates(ctx context.Context) (int64, error) {
	t := pgx.Identifier{s.schema, "job_rates"}.Sanitize()
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+t+` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM `+t+` WHERE tat < now() LIMIT 10000 FOR UPDATE SKIP LOCKED))`, Mode)
	return tag.RowsAffected(), err
}
