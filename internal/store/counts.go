package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Counts of jobs: live ones from the jobs table (small: finished jobs are
// elsewhere), finished ones from the per-minute and per-hour counters that
// finish() and retire() write (job_counts, job_counts_hourly), so no read
// here ever scans job_history.

type countsSQL struct {
	live, finished, series, rollup, fold, trim, latency string
}

// countedState is a counter row's state as readers count it: a job
// deleted at completion ('discarded') is a completed one.
const countedState = `CASE WHEN state = 'discarded' THEN 'completed' ELSE state END AS state`

func (s *Store) buildCounts() {
	c := &s.counts
	minutes := pgx.Identifier{s.schema, "job_counts"}.Sanitize()
	hours := pgx.Identifier{s.schema, "job_counts_hourly"}.Sanitize()
	hsum, hadd := pgx.Identifier{s.schema, "hist_sum"}.Sanitize(), pgx.Identifier{s.schema, "hist_add"}.Sanitize()
	c.live = `SELECT state, type, '' AS worker, count(*),
	       COALESCE(max(extract(epoch FROM now() - run_at)) FILTER (WHERE state = 'available'), 0)
FROM ` + s.jobs + ` GROUP BY state, type
UNION ALL
SELECT 'running', '', COALESCE(worker, ''), count(*), 0 FROM ` + s.jobs + ` WHERE state = 'running' GROUP BY worker`
	// Finished since $1: whole hours from the hourly rows, the rest from
	// the minute rows (the cleaner folds minutes older than two hours into
	// hours, so the two never overlap).
	// Jobs deleted at completion (WithDiscardCompleted, migration 21) are
	// counted under 'discarded': completed ones.
	c.finished = `SELECT state, type, sum(n)::bigint FROM (
	SELECT ` + countedState + `, type, n FROM ` + hours + ` WHERE bucket >= date_trunc('hour', $1::timestamptz)
	UNION ALL
	SELECT ` + countedState + `, type, n FROM ` + minutes + ` WHERE bucket >= $1
) c GROUP BY state, type`
	// One point per bucket of $2 seconds (60: minutes, 3600: hours), type
	// and state, since $1.
	c.series = `SELECT to_timestamp(floor(extract(epoch FROM bucket) / $2) * $2) AS at, type, state,
       sum(n)::bigint, sum(wait_ms)::bigint, sum(run_ms)::bigint
FROM (
	SELECT bucket, type, ` + countedState + `, n, wait_ms, run_ms FROM ` + hours + ` WHERE bucket >= date_trunc('hour', $1::timestamptz)
	UNION ALL
	SELECT bucket, type, ` + countedState + `, n, wait_ms, run_ms FROM ` + minutes + ` WHERE bucket >= $1
) c GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`
	// Minutes older than two whole hours become hour rows, in one
	// statement (a reader sees them in one table or the other).
	c.rollup = `WITH m AS (
	DELETE FROM ` + minutes + ` WHERE bucket < date_trunc('hour', now()) - interval '1 hour'
	RETURNING bucket, type, state, n, wait_ms, run_ms, wait_hist, run_hist
), h AS (
	INSERT INTO ` + hours + ` AS h (bucket, type, state, n, wait_ms, run_ms, wait_hist, run_hist)
	SELECT date_trunc('hour', bucket), type, state, sum(n), sum(wait_ms), sum(run_ms), ` + hsum + `(wait_hist), ` + hsum + `(run_hist)
	FROM m GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
	ON CONFLICT (bucket, type, state) DO UPDATE
	SET n = h.n + EXCLUDED.n, wait_ms = h.wait_ms + EXCLUDED.wait_ms, run_ms = h.run_ms + EXCLUDED.run_ms,
	    wait_hist = ` + hadd + `(h.wait_hist, EXCLUDED.wait_hist), run_hist = ` + hadd + `(h.run_hist, EXCLUDED.run_hist)
	RETURNING 1
)
SELECT count(*) FROM m`
	// The wait and run time histograms (migration 23) of the jobs
	// finished since $1, summed by type; rows written without them (by a
	// previous version's roll-up) are skipped.
	c.latency = `SELECT type, ` + hsum + `(wait_hist), ` + hsum + `(run_hist) FROM (
	SELECT type, wait_hist, run_hist FROM ` + hours + ` WHERE bucket >= date_trunc('hour', $1::timestamptz)
	UNION ALL
	SELECT type, wait_hist, run_hist FROM ` + minutes + ` WHERE bucket >= $1
) c GROUP BY type ORDER BY type`
	// The shards of each closed minute (finished a minute ago: only the
	// retirer, rarely, still counts into it) folded into shard 0, so that
	// readers of the last hours (the percentiles above all) read one row
	// per minute, type and state rather than one per writer.
	c.fold = `WITH m AS (
	DELETE FROM ` + minutes + ` WHERE shard <> 0 AND bucket < date_trunc('minute', now()) - interval '1 minute'
	RETURNING bucket, type, state, n, wait_ms, run_ms, wait_hist, run_hist
), f AS (
	INSERT INTO ` + minutes + ` AS c (bucket, type, state, shard, n, wait_ms, run_ms, wait_hist, run_hist)
	SELECT bucket, type, state, 0, sum(n), sum(wait_ms), sum(run_ms), ` + hsum + `(wait_hist), ` + hsum + `(run_hist)
	FROM m GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
	ON CONFLICT (bucket, type, state, shard) DO UPDATE
	SET n = c.n + EXCLUDED.n, wait_ms = c.wait_ms + EXCLUDED.wait_ms, run_ms = c.run_ms + EXCLUDED.run_ms,
	    wait_hist = ` + hadd + `(c.wait_hist, EXCLUDED.wait_hist), run_hist = ` + hadd + `(c.run_hist, EXCLUDED.run_hist)
	RETURNING 1
)
SELECT count(*) FROM m`
	c.trim = `DELETE FROM ` + hours + ` WHERE bucket < now() - $1::bigint * interval '1 millisecond'`
}

// LiveCounts counts the jobs of the jobs table by state and type, and
// running jobs by worker, and returns the age of the oldest available job.
func (s *Store) LiveCounts(ctx context.Context) (rows []StatsRow, oldest time.Duration, err error) {
	r, err := s.pool.Query(ctx, s.counts.live, Mode)
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

// FinishedCounts counts the jobs that finished since `since` (to the hour
// when `since` is more than two hours ago), by state and type.
func (s *Store) FinishedCounts(ctx context.Context, since time.Time) ([]StatsRow, error) {
	rows, err := s.pool.Query(ctx, s.counts.finished, Mode, since)
	if err != nil {
		return nil, err
	}
	var out []StatsRow
	var row StatsRow
	_, err = pgx.ForEachRow(rows, []any{&row.State, &row.Type, &row.Count}, func() error {
		out = append(out, row)
		return nil
	})
	return out, err
}

// SeriesPoint is the count of one state of one type in one bucket.
type SeriesPoint struct {
	At            time.Time
	Type, State   string
	N             int64
	WaitMS, RunMS int64 // sums over the N jobs
}

// Series returns finished-job counts since `since`, in buckets of `bucket`
// (a whole number of minutes).
func (s *Store) Series(ctx context.Context, since time.Time, bucket time.Duration) ([]SeriesPoint, error) {
	rows, err := s.pool.Query(ctx, s.counts.series, Mode, since, int64(bucket/time.Second))
	if err != nil {
		return nil, err
	}
	var out []SeriesPoint
	var p SeriesPoint
	_, err = pgx.ForEachRow(rows, []any{&p.At, &p.Type, &p.State, &p.N, &p.WaitMS, &p.RunMS}, func() error {
		out = append(out, p)
		return nil
	})
	return out, err
}

// RollUpCounts folds the shards of each closed minute into one row,
// minute counters older than two whole hours into hour counters, and
// deletes hour counters older than keep. It returns how many minute rows
// it folded into hours.
func (s *Store) RollUpCounts(ctx context.Context, keep time.Duration) (int, error) {
	if _, err := s.pool.Exec(ctx, s.counts.fold, Mode); err != nil {
		return 0, err
	}
	var n int
	if err := s.pool.QueryRow(ctx, s.counts.rollup, Mode).Scan(&n); err != nil {
		return 0, err
	}
	_, err := s.pool.Exec(ctx, s.counts.trim, Mode, keep.Milliseconds())
	return n, err
}

// LatencyHists are the summed histograms of one type's wait and run times
// (milliseconds; slot i counts 2^(i/4)-1 <= ms < 2^((i+1)/4)-1; nil: none
// recorded).
type LatencyHists struct {
	Type      string
	Wait, Run []int64
}

// Latency returns, by type, the histograms of the wait and run times of
// the jobs finished since `since` (to the hour when `since` is more than
// two hours ago).
func (s *Store) Latency(ctx context.Context, since time.Time) ([]LatencyHists, error) {
	rows, err := s.pool.Query(ctx, s.counts.latency, Mode, since)
	if err != nil {
		return nil, err
	}
	var out []LatencyHists
	var h LatencyHists
	_, err = pgx.ForEachRow(rows, []any{&h.Type, &h.Wait, &h.Run}, func() error {
		out = append(out, h)
		h = LatencyHists{}
		return nil
	})
	return out, err
}

// LatencySlotsPerDoubling is the number of slots of a latency histogram
// per doubling of milliseconds (latency_hist() of migration 23).
const LatencySlotsPerDoubling = 4
