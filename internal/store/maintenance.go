package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

type maintSQL struct {
	lastPlans, claimPlans string
}

func (s *Store) buildMaintenance() {
	m := &s.maint
	runsT := pgx.Identifier{s.schema, "periodic_runs"}.Sanitize()
	m.lastPlans = `SELECT name, max(plan_time) FROM ` + runsT + ` WHERE name = ANY($1::text[]) GROUP BY name`
	m.claimPlans = `INSERT INTO ` + runsT + ` (name, plan_time, job_id)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::uuid[]) ON CONFLICT DO NOTHING RETURNING job_id`
}

// StatsRow is one line of Stats: a (state, type) count, or a running count
// per worker (Worker set).
type StatsRow struct {
	State, Type, Worker string
	Count               int64
}

// LastPlans returns the latest recorded plan time of each named schedule.
func (s *Store) LastPlans(ctx context.Context, names []string) (map[string]time.Time, error) {
	rows, err := s.pool.Query(ctx, s.maint.lastPlans, Mode, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var n string
		var t time.Time
		if err := rows.Scan(&n, &t); err != nil {
			return nil, err
		}
		out[n] = t
	}
	return out, rows.Err()
}

// ClaimPlans records (name, plan time, job ID) rows inside tx and returns
// the job IDs of the rows this transaction inserted: the plans nobody had
// enqueued yet. It also returns the database's now().
func (s *Store) ClaimPlans(ctx context.Context, tx pgx.Tx, names []string, plans []time.Time, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, s.maint.claimPlans, Mode, names, plans, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// Snapshot is the oldest transaction that holds back the cleanup of dead
// rows in this database: a session's open transaction (its snapshot), or a
// prepared transaction.
type Snapshot struct {
	Kind        string // "session" or "prepared transaction"
	PID         int    // the session's process ID (0 for a prepared transaction)
	Age         time.Duration
	State       string // the session's state, e.g. "idle in transaction"
	Application string // application_name, or the prepared transaction's GID
	Query       string // the session's current or last statement (first 200 bytes), when visible
}

const oldestSnapshotSQL = `SELECT kind, pid, age_ms, state, app, query FROM (
	SELECT 'session' AS kind, pid, (extract(epoch FROM now() - xact_start) * 1000)::bigint AS age_ms,
	       COALESCE(state, '') AS state, COALESCE(application_name, '') AS app, COALESCE(left(query, 200), '') AS query
	FROM pg_stat_activity
	WHERE backend_xmin IS NOT NULL AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
	  AND datname = current_database() AND backend_type NOT LIKE 'autovacuum%'
	  -- An idle session holds no snapshot (one that reads notifications
	  -- shows a passing xmin, with the start of its last transaction); a
	  -- VACUUM's xmin holds back no other cleanup.
	  AND state IS DISTINCT FROM 'idle' AND pid NOT IN (SELECT v.pid FROM pg_stat_progress_vacuum v)
	UNION ALL
	SELECT 'prepared transaction', 0, (extract(epoch FROM now() - prepared) * 1000)::bigint, '', gid, ''
	FROM pg_prepared_xacts WHERE database = current_database()
) h ORDER BY age_ms DESC LIMIT 1`

// OldestSnapshot returns the oldest transaction holding back cleanup in
// this database, or nil when none is open. Sessions of other roles are
// seen only with the pg_read_all_stats role.
func (s *Store) OldestSnapshot(ctx context.Context) (*Snapshot, error) {
	var h Snapshot
	var pid *int32
	var ageMS int64
	err := s.pool.QueryRow(ctx, oldestSnapshotSQL, Mode).Scan(&h.Kind, &pid, &ageMS, &h.State, &h.Application, &h.Query)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if pid != nil {
		h.PID = int(*pid)
	}
	h.Age = time.Duration(ageMS) * time.Millisecond
	return &h, nil
}
