package store

import (
	"context"
	"errors"
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

// lockLimit takes the type's limit lock (exclusive) in tx: claims hold it
// shared, so once the change commits, every claim that had not finished
// has, and every later claim sees it.
func (s *Store) lockLimit(ctx context.Context, tx pgx.Tx, typ string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`, Mode, s.schema+".job_limits", typ)
	return err
}

// SetLimit writes the limits of a type, replacing any it had, and reports
// whether they may hold back jobs the old ones allowed (a new or lower
// concurrency, a new or changed rate): such a change is recorded under a
// new flow epoch (FlowChanges), and jobs of the type claimed ahead must be
// given back. Writing the limits a type has already changes nothing. The
// bound on its running jobs is forgotten: the next claim counts them.
func (s *Store) SetLimit(ctx context.Context, l LimitRow) (tightened bool, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		if err := s.lockLimit(ctx, tx, l.Type); err != nil {
			return err
		}
		var old LimitRow
		var perMS int64
		err := tx.QueryRow(ctx, `SELECT COALESCE(concurrency, 0), COALESCE(key_concurrency, 0), COALESCE(rate, 0),
	COALESCE(rate_period_ms, 0), COALESCE(burst, 0), rate_per_key FROM `+s.limitsTable()+` WHERE type = $1`, Mode, l.Type).
			Scan(&old.Concurrency, &old.KeyConcurrency, &old.Rate, &perMS, &old.Burst, &old.RatePerKey)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			tightened = true
		case err != nil:
			return err
		default:
			old.Type, old.Per = l.Type, time.Duration(perMS)*time.Millisecond
			if old == l {
				return nil // nothing changes: no new epoch, the bound stays
			}
			tightened = tighter(old, l)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s.limitsTable()+` AS l
	(type, concurrency, key_concurrency, rate, rate_period_ms, burst, rate_per_key, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, now())
ON CONFLICT (type) DO UPDATE SET concurrency = EXCLUDED.concurrency, key_concurrency = EXCLUDED.key_concurrency,
	rate = EXCLUDED.rate, rate_period_ms = EXCLUDED.rate_period_ms, burst = EXCLUDED.burst,
	rate_per_key = EXCLUDED.rate_per_key, updated_at = now(), running_bound = DEFAULT`, Mode,
			l.Type, nullInt(int64(l.Concurrency)), nullInt(int64(l.KeyConcurrency)), nullInt(int64(l.Rate)),
			nullInt(l.Per.Milliseconds()), nullInt(int64(l.Burst)), l.RatePerKey)
		if err != nil || !tightened {
			return err
		}
		return s.bumpFlow(ctx, tx, []string{l.Type})
	})
	return tightened, err
}

// tighter reports whether limits l may hold back a job that limits old
// allowed: a concurrency (or key concurrency) that is new or lower, or a
// rate that is new or changed in any way (a changed period or burst can
// allow fewer starts in some window even at a higher rate).
func tighter(old, l LimitRow) bool {
	lower := func(o, n int) bool { return n > 0 && (o == 0 || n < o) }
	rateChanged := l.Rate > 0 && (old.Rate != l.Rate || old.Per != l.Per || old.Burst != l.Burst || old.RatePerKey != l.RatePerKey)
	return lower(old.Concurrency, l.Concurrency) || lower(old.KeyConcurrency, l.KeyConcurrency) || rateChanged
}

// readCommitted: SetLimit and Pause wait for the flow epoch's row lock
// and then update the row as it is (an update under REPEATABLE READ, as a
// pool may make its default, would fail with a serialization error).
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// bumpFlow records, in tx, a new flow epoch for types (flow_epoch's row
// lock orders epochs by commit: see migration 15).
func (s *Store) bumpFlow(ctx context.Context, tx pgx.Tx, types []string) error {
	_, err := tx.Exec(ctx, `WITH e AS (UPDATE `+pgx.Identifier{s.schema, "flow_epoch"}.Sanitize()+` SET epoch = epoch + 1 RETURNING epoch)
INSERT INTO `+pgx.Identifier{s.schema, "flow_changes"}.Sanitize()+` (type, epoch)
SELECT DISTINCT t.type, e.epoch FROM unnest($1::text[]) AS t(type), e
ON CONFLICT (type) DO UPDATE SET epoch = EXCLUDED.epoch`, Mode, types)
	return err
}

// FlowChanges returns the current flow epoch and the types whose limits
// were tightened or that were paused after epoch since, by type.
func (s *Store) FlowChanges(ctx context.Context, since int64) (epoch int64, types []string, err error) {
	err = s.pool.QueryRow(ctx, `SELECT f.epoch, ARRAY(SELECT c.type FROM `+pgx.Identifier{s.schema, "flow_changes"}.Sanitize()+` c
	WHERE c.epoch > $1 ORDER BY c.type) FROM `+pgx.Identifier{s.schema, "flow_epoch"}.Sanitize()+` f`, Mode, since).Scan(&epoch, &types)
	return epoch, types, err
}

// RemoveLimit deletes the limits of a type and its rate state, and reports
// whether it had limits.
func (s *Store) RemoveLimit(ctx context.Context, typ string) (bool, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.lockLimit(ctx, tx, typ); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{s.schema, "job_rates"}.Sanitize()+` WHERE type = $1`, Mode, typ); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `WITH d AS (DELETE FROM `+s.limitsTable()+` WHERE type = $1 RETURNING 1) SELECT count(*) FROM d`, Mode, typ).Scan(&n)
	})
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
