package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// CleanResult counts what one cleaner statement deleted.
type CleanResult struct {
	Jobs int // finished jobs
	Runs int // periodic_runs rows
}

type maintSQL struct {
	cleanJobs, cleanRuns, stats, lastPlans, claimPlans string
}

func (s *Store) buildMaintenance() {
	m := &s.maint
	m.cleanJobs, m.cleanRuns = s.cleanSQL()
	runsT := pgx.Identifier{s.schema, "periodic_runs"}.Sanitize()
	m.stats = `SELECT state, type, '' AS worker, count(*),
	       COALESCE(max(extract(epoch FROM now() - run_at)) FILTER (WHERE state = 'available' AND run_at <= now()), 0)
FROM ` + s.jobs + ` GROUP BY state, type
UNION ALL
SELECT 'running', '', COALESCE(worker, ''), count(*), 0 FROM ` + s.jobs + ` WHERE state = 'running' GROUP BY worker`
	m.lastPlans = `SELECT name, max(plan_time) FROM ` + runsT + ` WHERE name = ANY($1::text[]) GROUP BY name`
	m.claimPlans = `INSERT INTO ` + runsT + ` (name, plan_time, job_id)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::uuid[]) ON CONFLICT DO NOTHING RETURNING job_id`
}

func (s *Store) cleanSQL() (jobs, runs string) {
	runsT := pgx.Identifier{s.schema, "periodic_runs"}.Sanitize()
	// Oldest finished jobs first, along the finished-jobs index; rows
	// someone holds (a Wait or a Job lookup does not lock) are skipped.
	jobs = `WITH d AS (
	SELECT id FROM ` + s.jobs + `
	WHERE state IN ('completed', 'failed', 'cancelled')
	  AND finished_at < now() - $2::bigint * interval '1 millisecond'
	  AND finished_at < now() - (CASE WHEN state = 'completed' THEN $1::bigint ELSE $4::bigint END) * interval '1 millisecond'
	ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
)
DELETE FROM ` + s.jobs + ` j USING d WHERE j.id = d.id`
	// The latest run of each schedule is kept whatever its age: it is the
	// schedule's memory of which plan was enqueued last.
	runs = `WITH d AS (
	SELECT r.name, r.plan_time FROM ` + runsT + ` r
	WHERE r.created_at < now() - $1::bigint * interval '1 millisecond'
	  AND r.plan_time < (SELECT max(m.plan_time) FROM ` + runsT + ` m WHERE m.name = r.name)
	LIMIT $2::integer FOR UPDATE SKIP LOCKED
)
DELETE FROM ` + runsT + ` r USING d WHERE r.name = d.name AND r.plan_time = d.plan_time`
	return jobs, runs
}

// Clean deletes up to limit completed jobs finished more than completed ago
// and failed or cancelled ones finished more than failed ago, plus up to
// limit periodic_runs rows older than failed (never a schedule's latest).
func (s *Store) Clean(ctx context.Context, completed, failed time.Duration, limit int) (CleanResult, error) {
	var r CleanResult
	tag, err := s.pool.Exec(ctx, s.maint.cleanJobs, Mode, completed.Milliseconds(), min(completed, failed).Milliseconds(), limit, failed.Milliseconds())
	if err != nil {
		return r, err
	}
	r.Jobs = int(tag.RowsAffected())
	tag, err = s.pool.Exec(ctx, s.maint.cleanRuns, Mode, failed.Milliseconds(), limit)
	if err != nil {
		return r, err
	}
	r.Runs = int(tag.RowsAffected())
	return r, nil
}

// StatsRow is one line of Stats: a (state, type) count, or a running count
// per worker (Worker set).
type StatsRow struct {
	State, Type, Worker string
	Count               int64
}

// Stats counts jobs by state and type and running jobs by worker, and
// returns the age of the oldest due available job, in one statement. It
// reads every row of the jobs table (an exact count): its cost grows with
// the rows kept for retention.
func (s *Store) Stats(ctx context.Context) (rows []StatsRow, oldest time.Duration, err error) {
	r, err := s.pool.Query(ctx, s.maint.stats, Mode)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	var maxAge float64
	for r.Next() {
		var row StatsRow
		var age float64
		if err := r.Scan(&row.State, &row.Type, &row.Worker, &row.Count, &age); err != nil {
			return nil, 0, err
		}
		maxAge = max(maxAge, age)
		rows = append(rows, row)
	}
	return rows, time.Duration(maxAge * float64(time.Second)), r.Err()
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
