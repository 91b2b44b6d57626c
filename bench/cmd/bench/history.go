package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// Workload 8 (backlog only, opt-in: -workloads history): what a day of
// finished jobs costs the hot paths. Two schemas: one whose job_history
// is empty before each run, one filled once with -history-rows rows (a
// busy day at the default 24 h retention of completed jobs) and the
// counters finish() would have written for them. In each, every run
// measures the burn-down (claim and finish, which moves each job into
// job_history), the bulk insert before it (EnqueueMany), single Enqueue
// calls, Stats, the first page of List (completed jobs) and Job of a
// finished job; the two schemas alternate within a run.

// historyArm is one of the two schemas.
type historyArm struct {
	key    string // row key suffix
	label  string // in row labels
	rows   int    // history rows filled in
	schema string
}

// The single calls measured per run.
const (
	histEnqueues = 2000
	histStats    = 200
	histLists    = 200
	histJobs     = 200
)

// historyMetrics are the measurements of each arm, in table order.
var historyMetrics = []struct {
	key, label string
	format     func(float64) string
}{
	{"burn", "burn-down jobs/s", fmtRate},
	{"pgcpu", "burn-down PostgreSQL CPU µs per job", fmtDec},
	{"wal", "burn-down WAL bytes per job", fmtInt},
	{"insert", "EnqueueMany (5,000 a call), jobs/s", fmtRate},
	{"enq50", "Enqueue p50 ms", fmtMs},
	{"enq99", "Enqueue p99 ms", fmtMs},
	{"stats50", "Stats p50 ms", fmtMs},
	{"stats99", "Stats p99 ms", fmtMs},
	{"list50", "List (first page of completed jobs) p50 ms", fmtMs},
	{"list99", "List (first page of completed jobs) p99 ms", fmtMs},
	{"job50", "Job(id) of a finished job p50 ms", fmtMs},
	{"job99", "Job(id) of a finished job p99 ms", fmtMs},
}

func historyArms(rows int) []*historyArm {
	return []*historyArm{
		{key: "empty", label: "empty history"},
		{key: "full", label: fmtInt(float64(rows)) + " rows", rows: rows},
	}
}

func defineHistoryRows(res *results, rows int) {
	for _, m := range historyMetrics {
		for _, a := range historyArms(rows) {
			res.define("hist."+m.key+"."+a.key, "history: "+m.label+" ("+a.label+")", m.format, false)
		}
	}
}

func runHistory(ctx context.Context, env *benchEnv, k kind, res *results) {
	if k.key != "backlog" {
		return
	}
	arms := historyArms(env.cfg.historyRows)
	failAll := func(a *historyArm, err error) {
		for _, m := range historyMetrics {
			res.fail("hist."+m.key+"."+a.key, k.key, statusOf(err))
		}
	}
	for _, a := range arms {
		a.schema = env.newSchema("history")
		defer env.dropSchema(ctx, a.schema)
		if err := historySetup(ctx, env, a, res); err != nil {
			logf("history: setting up %s: %v", a.label, err)
			res.note("history: setting up the schema with %s failed: %v", a.label, err)
			for _, b := range arms {
				failAll(b, err)
			}
			return
		}
	}
	for run := range env.cfg.runs {
		order := arms
		if run%2 == 1 {
			order = []*historyArm{arms[1], arms[0]}
		}
		for _, a := range order {
			logf("history: %s, run %d/%d", a.label, run+1, env.cfg.runs)
			from := time.Now()
			vals, err := historyRun(ctx, env, a)
			var keys []string
			for _, m := range historyMetrics {
				keys = append(keys, "hist."+m.key+"."+a.key)
			}
			flagNoise(env, res, "history ("+a.label+")", k, from, keys...)
			if err != nil {
				logf("history: %s: %v", a.label, err)
				res.note("history (%s) failed: %v", a.label, err)
				failAll(a, err)
				continue
			}
			for key, v := range vals {
				res.add("hist."+key+"."+a.key, k.key, v)
			}
		}
	}
	var ratios []string
	for _, m := range historyMetrics {
		e, f := res.cell("hist."+m.key+".empty", k.key), res.cell("hist."+m.key+".full", k.key)
		if e.ok() && f.ok() && e.median() != 0 {
			ratios = append(ratios, fmt.Sprintf("%s ×%.2f", m.label, f.median()/e.median()))
		}
	}
	if len(ratios) > 0 {
		res.note("history: %s ÷ empty history, medians: %s.", arms[1].label, strings.Join(ratios, ", "))
	}
	res.note("history: two schemas, one whose job_history is emptied (TRUNCATE, with the counters) before each run, one filled once with %s rows (see the fill note); each run measures both, in alternating order, after VACUUM ANALYZE of jobs (autovacuum is off here; the previous run's dead rows would otherwise be read): a burn-down of %s no-op jobs at backlog's defaults (its bulk insert is the EnqueueMany row; its rows join job_history, so the empty history holds that run's %s jobs when the calls after it run), VACUUM of jobs and job_counts, ANALYZE of job_history and summarize_history() (what autovacuum and the maintenance loop would have done within seconds), then one after the other on a fresh Queue with no workers: Stats ×%d, List(Filter{States: completed}) first page (50 jobs) ×%d, Job(id) of %d finished jobs sampled from job_history (TABLESAMPLE SYSTEM), single Enqueue ×%d (then deleted); percentiles of each run's calls, medians of %d runs.",
		fmtInt(float64(env.cfg.historyRows)), fmtInt(float64(env.cfg.burnJobs)), fmtInt(float64(env.cfg.burnJobs)), histStats, histLists, histJobs, histEnqueues, env.cfg.runs)
}

// historySetup migrates an arm's schema, makes its job_history partitions
// and fills it.
func historySetup(ctx context.Context, env *benchEnv, a *historyArm, res *results) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	q, pool, closeAll, err := historyQueue(ctx, env, a.schema)
	if err != nil {
		return err
	}
	defer closeAll()
	if err := q.Migrate(ctx); err != nil {
		return err
	}
	// The partitions the maintenance loop makes ahead (store
	// EnsurePartitions: today and the next 9 days at the default
	// retention), so the rows land where finish() puts them, not in the
	// default partition.
	if _, err := pool.Exec(ctx, `SELECT `+pgx.Identifier{a.schema, "history_partition"}.Sanitize()+`((now() AT TIME ZONE 'UTC')::date + d) FROM generate_series(0, 9) d`); err != nil {
		return fmt.Errorf("partitions: %w", err)
	}
	if a.rows == 0 {
		return nil
	}
	logf("history: filling job_history with %d rows", a.rows)
	took, err := fillHistory(ctx, env, a.schema, a.rows)
	if err != nil {
		return err
	}
	after := "VACUUM (ANALYZE) of job_history and the counters, as autovacuum does an insert-only table once a fifth of it is new (it also records every page's free space: rows that finish later go into the room left at the end of the filled pages, not after them)"
	if !env.cfg.historyVacuum {
		after = "ANALYZE of job_history and the counters and summarize_history(), no VACUUM (-history-vacuum=false: as if autovacuum never vacuumed job_history)"
	}
	ckpt := "no CHECKPOINT after it (the role may not): the first runs may pay for flushing the fill"
	if took.checkpoint > 0 {
		ckpt = fmt.Sprintf("a CHECKPOINT %s, so that flushing the fill does not fall in the first measured runs", took.checkpoint.Round(100*time.Millisecond))
	}
	res.note("history: fill of %s rows: %s (INSERT … SELECT FROM generate_series, one statement); the counters finish() would have written for them (%s minute and %s hour rows, from job_history) %s; %s %s; %s; %s of table and indexes.",
		fmtInt(float64(a.rows)), took.insert.Round(100*time.Millisecond), fmtInt(float64(took.minutes)), fmtInt(float64(took.hours)),
		took.counters.Round(100*time.Millisecond), after, took.vacuum.Round(100*time.Millisecond), ckpt, took.size)
	logf("history: filled in %s (insert %s, counters %s, vacuum %s, checkpoint %s), %s", took.insert+took.counters+took.vacuum+took.checkpoint, took.insert, took.counters, took.vacuum, took.checkpoint, took.size)
	return nil
}

type fillTimes struct {
	insert, counters, vacuum time.Duration
	checkpoint               time.Duration // 0: none (the role may not)
	minutes, hours           int64         // counter rows
	size                     string
}

// fillHistory writes rows finished jobs into schema's job_history, as
// finish() would have written them over the last 24 hours, and the
// counters it would have kept for them.
//
// Row i of n finished at now - 24 h + (i - ½)·24 h/n, so rows enter the
// table in finish order, as finish() writes them. 94 % completed, 5 %
// failed (3 attempts, 3 error entries), 1 % cancelled; ten types, four in
// ten of them the benchmark's; args {"seq": i} (plus a field for the
// other types); a result for one completed job in ten, tags for one in
// five, a unique key for one in fifty; waits of 2–501 ms and runs of
// 1–200 ms. IDs are UUIDv7s of the creation time (run_at), unique by i.
// expires_at is finished_at plus the default retention (24 h completed,
// 7 days failed and cancelled), so every row is in a day partition.
func fillHistory(ctx context.Context, env *benchEnv, schema string, rows int) (fillTimes, error) {
	var ft fillTimes
	conn, err := env.connect(ctx)
	if err != nil {
		return ft, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off; SET maintenance_work_mem = '256MB'; SET work_mem = '64MB'`); err != nil {
		return ft, err
	}
	t := time.Now()
	_, err = conn.Exec(ctx, `INSERT INTO `+id("job_history")+` (id, type, args, tags, state, priority, run_at, attempt,
	max_attempts, timeout_ms, worker, ordering_key, unique_key, result, last_error, errors, created_at, started_at,
	finished_at, expires_at, concurrency_key, meta, progress, prereqs)
SELECT (lpad(to_hex((extract(epoch FROM r.run_at) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g.i % 4096), 3, '0')
        || '8' || lpad(to_hex(g.i), 15, '0'))::uuid,
       g.type,
       CASE WHEN g.type = 'bench' THEN jsonb_build_object('seq', g.i)
            ELSE jsonb_build_object('seq', g.i, 'tenant', 't-' || (g.i % 500)) END,
       CASE WHEN g.h % 5 = 0 THEN jsonb_build_object('tenant', 't-' || (g.i % 50)) ELSE '{}'::jsonb END,
       g.state, 0, r.run_at,
       CASE g.state WHEN 'failed' THEN 3 WHEN 'cancelled' THEN 1 ELSE 1 + (g.h % 20 = 0)::int END,
       CASE g.state WHEN 'failed' THEN 3 ELSE 25 END, 0, NULL, NULL,
       CASE WHEN g.h % 50 = 7 THEN g.type || '-' || g.i END,
       CASE WHEN g.state = 'completed' AND g.h % 10 = 0 THEN jsonb_build_object('ok', true, 'n', g.i) END,
       CASE g.state WHEN 'failed' THEN 'sending: dial tcp 10.0.0.7:443: connect: connection refused'
                    WHEN 'cancelled' THEN 'cancelled by request' END,
       CASE WHEN g.state = 'failed' THEN (SELECT jsonb_agg(jsonb_build_object('attempt', a, 'at', g.fin - (3 - a) * interval '1 minute',
                'error', 'sending: dial tcp 10.0.0.7:443: connect: connection refused', 'worker', NULL,
                'started_at', g.fin - (3 - a) * interval '1 minute' - g.run_ms * interval '1 millisecond',
                'ms', g.run_ms, 'outcome', 'error')) FROM generate_series(1, 3) a)
            WHEN g.state = 'completed' AND g.h % 20 = 0 THEN jsonb_build_array(jsonb_build_object('attempt', 1,
                'at', g.fin - interval '30 seconds', 'error', 'timeout awaiting response headers', 'worker', NULL,
                'started_at', g.fin - interval '30 seconds' - g.run_ms * interval '1 millisecond', 'ms', g.run_ms, 'outcome', 'error'))
            ELSE '[]'::jsonb END,
       r.run_at, r.started_at, g.fin,
       g.fin + CASE WHEN g.state = 'completed' THEN interval '24 hours' ELSE interval '7 days' END,
       NULL, NULL, NULL, NULL
FROM (
	SELECT i, h, fin, 1 + (h * 37) % 200 AS run_ms, 2 + (h * 13) % 500 AS wait_ms,
	       (ARRAY['bench', 'bench', 'bench', 'bench', 'email.send', 'email.send', 'webhook.deliver', 'webhook.deliver',
	              'report.render', 'image.resize'])[1 + (i * 7) % 10] AS type,
	       CASE WHEN h < 940 THEN 'completed' WHEN h < 990 THEN 'failed' ELSE 'cancelled' END AS state
	FROM (SELECT i, (i * 2654435761) % 1000 AS h,
	             $2::timestamptz - ($1 - i + 0.5) * (interval '24 hours' / $1) AS fin
	      FROM generate_series(1::bigint, $1::bigint) i) s
) g
CROSS JOIN LATERAL (SELECT g.fin - g.run_ms * interval '1 millisecond' AS started_at,
                           g.fin - (g.run_ms + g.wait_ms) * interval '1 millisecond' AS run_at) r`, rows, time.Now())
	if err != nil {
		return ft, fmt.Errorf("filling job_history: %w", err)
	}
	ft.insert = time.Since(t)

	// The counters: shard 0 of each closed minute of the last two hours
	// (the cleaner folds the shards of a closed minute into shard 0), hour
	// rows before that (it rolls minutes older than two whole hours into
	// hours), with their histograms, as finish() and the cleaner write
	// them.
	t = time.Now()
	hist := id("latency_hist")
	_, err = conn.Exec(ctx, `WITH h AS (
	SELECT finished_at, type, state, date_part('epoch', started_at - run_at) * 1000 AS wait_ms,
	       date_part('epoch', finished_at - started_at) * 1000 AS run_ms,
	       finished_at >= date_trunc('hour', now()) - interval '1 hour' AS recent
	FROM `+id("job_history")+`
), m AS (
	INSERT INTO `+id("job_counts")+` (bucket, type, state, shard, n, wait_ms, run_ms, wait_hist, run_hist)
	SELECT date_trunc('minute', finished_at), type, state, 0, count(*), sum(wait_ms)::bigint, sum(run_ms)::bigint,
	       `+hist+`(array_agg(wait_ms)), `+hist+`(array_agg(run_ms))
	FROM h WHERE recent GROUP BY 1, 2, 3
)
INSERT INTO `+id("job_counts_hourly")+` (bucket, type, state, n, wait_ms, run_ms, wait_hist, run_hist)
SELECT date_trunc('hour', finished_at), type, state, count(*), sum(wait_ms)::bigint, sum(run_ms)::bigint,
       `+hist+`(array_agg(wait_ms)), `+hist+`(array_agg(run_ms))
FROM h WHERE NOT recent GROUP BY 1, 2, 3`)
	if err != nil {
		return ft, fmt.Errorf("filling the counters: %w", err)
	}
	ft.counters = time.Since(t)

	// What autovacuum would have done to an insert-only table (hint bits,
	// visibility map, the BRIN summaries, the free space map) and its
	// planner statistics. -history-vacuum=false: statistics and summaries
	// only, as if autovacuum never vacuumed job_history.
	t = time.Now()
	fill := `VACUUM (ANALYZE) ` + id("job_history") + `, ` + id("job_counts") + `, ` + id("job_counts_hourly")
	if !env.cfg.historyVacuum {
		fill = `ANALYZE ` + id("job_history") + `, ` + id("job_counts") + `, ` + id("job_counts_hourly") + `; SELECT ` + id("summarize_history") + `()`
	}
	if _, err := conn.Exec(ctx, fill); err != nil {
		return ft, fmt.Errorf("vacuum: %w", err)
	}
	ft.vacuum = time.Since(t)
	// The fill's gigabytes sit in dirty buffers and WAL: flushed by a
	// checkpoint now, not by one that would run during the first measured
	// runs (which took 55,000 jobs/s against the empty schema's 69,700 in
	// the run where this was found; the third, after the checkpoint, 67,200).
	// Best effort: the role may not checkpoint (PostgreSQL 15: superuser or
	// pg_checkpoint).
	t = time.Now()
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		logf("history: CHECKPOINT after the fill failed (%v); the first runs may pay for flushing it", err)
	} else {
		ft.checkpoint = time.Since(t)
	}
	if err := conn.QueryRow(ctx, `SELECT (SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass),
		(SELECT count(*) FROM `+id("job_counts")+`), (SELECT count(*) FROM `+id("job_counts_hourly")+`)`, id("job_history")).Scan(&ft.size, &ft.minutes, &ft.hours); err != nil {
		return ft, err
	}
	return ft, nil
}

// historyQueue opens a Queue on schema (no workers) with its own pool.
func historyQueue(ctx context.Context, env *benchEnv, schema string) (*backlog.Queue, *pgxpool.Pool, func(), error) {
	var counter stmtCounter
	pool, err := env.newPool(ctx, &counter)
	if err != nil {
		return nil, nil, nil, err
	}
	q, err := backlog.New(ctx, pool, backlog.WithSchema(schema))
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return q, pool, func() { _ = q.Close(); pool.Close() }, nil
}

// historySys is backlog whose monitor counts only the jobs completed since
// a moment (job_history holds others).
type historySys struct {
	*backlogSys
	since time.Time
}

func (s *historySys) Tables() jobTables {
	t := s.backlogSys.Tables()
	t.completed = `SELECT count(*) FROM ` + pgx.Identifier{s.schema, "job_history"}.Sanitize() +
		` WHERE state = 'completed' AND finished_at >= '` + s.since.UTC().Format(time.RFC3339Nano) + `'::timestamptz`
	return t
}

// historyRun measures one arm once.
func historyRun(ctx context.Context, env *benchEnv, a *historyArm) (map[string]float64, error) {
	id := func(name string) string { return pgx.Identifier{a.schema, name}.Sanitize() }
	if a.rows == 0 {
		if err := env.exec(ctx, `TRUNCATE `+id("job_history")+`, `+id("job_counts")+`, `+id("job_counts_hourly")); err != nil {
			return nil, err
		}
	}
	if err := env.exec(ctx, `VACUUM (ANALYZE) `+id("jobs")+`, `+id("job_counts")); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	var since time.Time
	if err := env.queryRow(ctx, `SELECT now()`, &since); err != nil {
		return nil, err
	}
	sys := &historySys{backlogSys: newBacklog(env, a.schema, false), since: since}
	r, err := burndownIn(ctx, env, "backlog, "+a.label, sys, env.cfg.burnJobs, env.cfg.burnTimeout)
	if err != nil {
		return nil, fmt.Errorf("burn-down: %w", err)
	}
	if r.timeout != "" {
		return nil, &timeoutError{"burn-down: " + r.timeout}
	}
	out["burn"], out["insert"], out["wal"] = r.rate, r.insertRate, r.wal
	if r.pgCPUok {
		out["pgcpu"] = r.pgCPU
	}
	logf("history: %s: burn-down %.0f jobs/s, %.1f µs/job, EnqueueMany %.0f jobs/s", a.label, r.rate, r.pgCPU, r.insertRate)
	// What autovacuum (were it on) and a running Queue's maintenance do
	// within seconds: clean up the burn-down's dead rows, give job_history
	// planner statistics (TRUNCATE left the empty history's without: its
	// lookups by ID would be sequential scans), and summarize its BRIN
	// ranges filled since the last pass (every 2 s while jobs finish: the
	// burn-down's last seconds are not yet).
	for _, sql := range []string{`VACUUM ` + id("jobs") + `, ` + id("job_counts"), `ANALYZE ` + id("job_history"), `SELECT ` + id("summarize_history") + `()`} {
		if err := env.exec(ctx, sql); err != nil {
			return nil, err
		}
	}

	q, _, closeAll, err := historyQueue(ctx, env, a.schema)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	lat := func(name string, n int, call func(i int) error) error {
		ms, err := timeCalls(ctx, n, call)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		out[name+"50"], out[name+"99"] = percentile(ms, 50), percentile(ms, 99)
		logf("history: %s: %s p50 %.3f ms, p99 %.3f ms", a.label, name, out[name+"50"], out[name+"99"])
		return nil
	}
	if err := lat("stats", histStats, func(int) error { _, err := q.Stats(ctx); return err }); err != nil {
		return nil, err
	}
	completed := backlog.Filter{States: []backlog.State{backlog.StateCompleted}}
	if err := lat("list", histLists, func(int) error {
		p, err := q.List(ctx, completed, backlog.ListOptions{})
		if err == nil && len(p.Jobs) != backlog.DefaultListLimit {
			err = fmt.Errorf("the first page holds %d jobs, not %d", len(p.Jobs), backlog.DefaultListLimit)
		}
		return err
	}); err != nil {
		return nil, err
	}
	ids, err := sampleHistory(ctx, env, a.schema, histJobs)
	if err != nil {
		return nil, err
	}
	if err := lat("job", len(ids), func(i int) error {
		j, err := q.Job(ctx, ids[i])
		if err == nil && !j.State.Terminal() {
			err = fmt.Errorf("job %s is %s", ids[i], j.State)
		}
		return err
	}); err != nil {
		return nil, err
	}
	if err := lat("enq", histEnqueues, func(i int) error {
		_, err := q.Enqueue(ctx, benchType, json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i)))
		return err
	}); err != nil {
		return nil, err
	}
	if err := env.exec(ctx, `DELETE FROM `+id("jobs")); err != nil {
		return nil, err
	}
	return out, nil
}

// timeCalls calls call n times, one after the other, and returns each
// call's duration in milliseconds, sorted.
func timeCalls(ctx context.Context, n int, call func(i int) error) ([]float64, error) {
	ms := make([]float64, 0, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t := time.Now()
		if err := call(i); err != nil {
			return nil, err
		}
		ms = append(ms, float64(time.Since(t).Nanoseconds())/1e6)
	}
	slices.Sort(ms)
	return ms, nil
}

// sampleHistory returns n IDs of job_history, spread over the table: the
// rows of about 600 random pages (TABLESAMPLE SYSTEM), n of them at
// random.
func sampleHistory(ctx context.Context, env *benchEnv, schema string, n int) ([]uuid.UUID, error) {
	conn, err := env.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	hist := pgx.Identifier{schema, "job_history"}.Sanitize()
	var pages float64
	if err := conn.QueryRow(ctx, `SELECT COALESCE(sum(pg_relation_size(i.inhrelid)), 0) / 8192 FROM pg_inherits i
		WHERE i.inhparent = $1::regclass`, hist).Scan(&pages); err != nil {
		return nil, err
	}
	pct := min(100, max(0.0001, 100*600/max(pages, 1)))
	rows, err := conn.Query(ctx, `SELECT id FROM `+hist+` TABLESAMPLE SYSTEM ($1) ORDER BY random() LIMIT $2`, pct, n)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	if len(ids) < n/2 {
		return nil, fmt.Errorf("sampled %d finished jobs from %.0f pages, wanted %d", len(ids), pages, n)
	}
	return ids, nil
}
