package backlog

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/maintain"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestMeasureMaintenanceCost measures one periodic tick, one cleaner pass
// and one Stats call with 1M finished jobs in the table. It only runs with
// BACKLOG_MEASURE=1 (make measure): it is a measurement, not a test.
func TestMeasureMaintenanceCost(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	hist := `"` + schema + `".job_history`
	start := time.Now()
	// Finished jobs live in job_history: a day partition of expiries,
	// yesterday's (so the cleaner may drop it), holding 1M completed jobs.
	_, err = pool.Exec(ctx, `CREATE TABLE `+hist+`_p20000101 PARTITION OF `+hist+` FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')`)
	require.NoError(t, err)
	// UUIDv7s, one millisecond apart, as NewID makes them.
	v7 := `(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid`
	from := `FROM generate_series(1, 1000000) g,
		LATERAL (SELECT lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 2000000 + g), 12, '0') AS h,
		                md5(g::text) AS r) x`
	seed := func() {
		_, err = pool.Exec(ctx, `INSERT INTO `+hist+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
			errors, created_at, started_at, finished_at, expires_at)
		SELECT `+v7+`, 'report.' || (g % 10), '{"n": 1}', '{}', 'completed', 0, now(), 1, 25, 0, '[]',
		       now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour', '2000-01-01 12:00Z' `+from)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+hist)
		require.NoError(t, err)
	}
	seed()
	t.Logf("seeded 1,000,000 completed jobs in %s", time.Since(start).Round(time.Millisecond))

	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 7 {
			s := time.Now()
			f()
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}

	// A periodic tick with one due plan: Now, then BEGIN, claim the plan,
	// insert the job (with its NOTIFY), COMMIT.
	require.NoError(t, q.Every("measure", time.Second, "tick", nil))
	q.mu.Lock()
	s := q.sched
	q.mu.Unlock()
	s.TickNow(ctx) // loads the last plan
	tick := median(func() {
		s.Rewind("measure", time.Now().Add(-2*time.Second).Truncate(time.Second))
		s.TickNow(ctx)
	})
	t.Logf("periodic tick (1 due plan, 5 statements incl. BEGIN/COMMIT): median %s", tick)

	stats := median(func() {
		_, err := q.Stats(ctx)
		require.NoError(t, err)
	})
	t.Logf("Stats (live jobs, per-minute counters of finished jobs, paused types, oldest transaction: 5 statements): median %s", stats)

	// Job() of finished jobs: job_history's BRIN index on ID.
	var ids []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM `+hist+` TABLESAMPLE SYSTEM (1) LIMIT 7`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.NotEmpty(t, ids)
	i := 0
	lookup := median(func() {
		_, err := q.Job(ctx, ids[i%len(ids)])
		require.NoError(t, err)
		i++
	})
	t.Logf("Job of a finished job, 1,000,000 in job_history: median %s", lookup)

	// The cleaner pass that drops the expired partition of 1M jobs (one
	// DROP), then passes that find nothing to drop.
	s0 := time.Now()
	r, err := q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, r.Partitions)
	t.Logf("cleaner pass dropping a partition of 1,000,000 expired jobs: %s", time.Since(s0).Round(time.Microsecond))
	clean := median(func() {
		_, err := q.Clean(ctx)
		require.NoError(t, err)
	})
	t.Logf("cleaner pass, nothing expired (partitions ensured, drop, periodic_runs): median %s", clean)
}

// TestMeasureEnqueueNotify measures single-row enqueue throughput from 16
// goroutines: backlog's Enqueue with notifications (the default notifier)
// and without (WithPollOnly), against raw SQL inserts with and without a
// pg_notify in every insert's transaction. Only with BACKLOG_MEASURE=1.
func TestMeasureEnqueueNotify(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	defer testdb.Close()
	raw := func(notify bool) func(q *Queue) error {
		return func(q *Queue) error {
			sql := `INSERT INTO "` + q.cfg.schema + `".jobs (id, type, args) VALUES ($1, 'bench.enqueue', '{"n": 1}')`
			if notify {
				sql = `WITH ins AS (` + sql + ` RETURNING 1) SELECT pg_notify('` + q.store.Channel() + `', '{"type":"bench.enqueue"}') FROM ins`
			}
			_, err := pool.Exec(ctx, sql, NewID())
			return err
		}
	}
	viaQueue := func(q *Queue) error {
		_, err := q.Enqueue(ctx, "bench.enqueue", map[string]int{"n": 1})
		return err
	}
	modes := []struct {
		name string
		opt  Option
		do   func(q *Queue) error
	}{
		{"Enqueue, notifier (default)", queueOption(func(*config) {}), viaQueue},
		{"Enqueue, no NOTIFY (poll-only)", WithPollOnly(), viaQueue},
		{"raw INSERT + NOTIFY in each tx", queueOption(func(*config) {}), raw(true)},
		{"raw INSERT, no NOTIFY", queueOption(func(*config) {}), raw(false)},
	}
	const clients, window = 16, 5 * time.Second
	results := map[string][]float64{}
	for round := range 3 {
		for _, m := range modes {
			schema := testdb.Schema(t)
			q, err := New(ctx, pool, WithSchema(schema), m.opt)
			require.NoError(t, err)
			require.NoError(t, q.Migrate(ctx))
			var n atomic.Int64
			deadline := time.Now().Add(window)
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						if err := m.do(q); err != nil {
							t.Error(err)
							return
						}
						n.Add(1)
					}
				})
			}
			wg.Wait()
			require.NoError(t, q.Close())
			rate := float64(n.Load()) / window.Seconds()
			results[m.name] = append(results[m.name], rate)
			t.Logf("round %d: %-32s %8.0f inserts/s", round+1, m.name, rate)
		}
	}
	for _, m := range modes {
		r := results[m.name]
		sort.Float64s(r)
		t.Logf("median of 3: %-32s %8.0f inserts/s (16 clients, one job per transaction)", m.name, r[1])
	}
}

// TestMeasureBurnDown works off 100,000 pre-inserted no-op jobs with Work
// at its defaults and reports jobs/s and this process's CPU and
// allocations per job. With BACKLOG_PROFILE=dir it also writes CPU and
// allocation profiles of the burn-down there. Only with BACKLOG_MEASURE=1.
func TestMeasureBurnDown(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	const n = 100_000
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	specs := make([]JobSpec, 0, 5000)
	for i := 0; i < n; i += len(specs) {
		specs = specs[:0]
		for j := i; j < n && len(specs) < 5000; j++ {
			specs = append(specs, JobSpec{Type: "burn", Args: json.RawMessage(`{"n":1}`)})
		}
		_, err := q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
	}
	var done atomic.Int64
	all := make(chan struct{})
	h := HandlerFunc(func(context.Context, *Job) error {
		if done.Add(1) == n {
			close(all)
		}
		return nil
	})
	dir := os.Getenv("BACKLOG_PROFILE")
	if dir != "" {
		f, err := os.Create(filepath.Join(dir, "cpu.prof"))
		require.NoError(t, err)
		require.NoError(t, pprof.StartCPUProfile(f))
		defer f.Close()
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := processCPU()
	start := time.Now()
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- q.Work(wctx, h, Types("burn")) }()
	<-all
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&m1)
	if dir != "" {
		pprof.StopCPUProfile()
		f, err := os.Create(filepath.Join(dir, "allocs.prof"))
		require.NoError(t, err)
		require.NoError(t, pprof.Lookup("allocs").WriteTo(f, 0))
		f.Close()
	}
	stop()
	require.NoError(t, <-werr)
	t.Logf("burn-down of %d no-op jobs at the defaults: %.0f jobs/s; this process: %.1f µs CPU, %.1f allocations, %.0f bytes per job",
		n, float64(n)/elapsed.Seconds(), float64(cpu.Microseconds())/n, float64(m1.Mallocs-m0.Mallocs)/n, float64(m1.TotalAlloc-m0.TotalAlloc)/n)
}

// processCPU is the CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestMeasurePickupLatency enqueues single jobs at a fixed rate from 4
// goroutines while Work (at its defaults) runs no-op handlers, and reports
// percentiles of the time from Enqueue's return to the handler's start.
// Only with BACKLOG_MEASURE=1; BACKLOG_LATENCY_RATE sets the rate
// (default 1000/s).
func TestMeasurePickupLatency(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	rate := 1000
	if r := os.Getenv("BACKLOG_LATENCY_RATE"); r != "" {
		_, err := fmt.Sscan(r, &rate)
		require.NoError(t, err)
	}
	const secs = 4
	n := rate * secs
	warm := rate / 2 // the first half second (new connections, first plans) is not measured
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	base := time.Now()
	committed := make([]atomic.Int64, n)
	started := make([]atomic.Int64, n)
	h := HandlerFunc(func(_ context.Context, j *Job) error {
		var a struct{ Seq int }
		if err := json.Unmarshal(j.Args, &a); err == nil && a.Seq >= 0 && a.Seq < n {
			started[a.Seq].CompareAndSwap(0, int64(time.Since(base)))
		}
		return nil
	})
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- q.Work(wctx, h, Types("lat")) }()
	// Let Work start (its first claim parks the domain).
	_, err = q.Enqueue(ctx, "lat", map[string]int{"Seq": n + 1})
	require.NoError(t, err)
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	t0 := time.Now().Add(100 * time.Millisecond)
	for p := range 4 {
		wg.Go(func() {
			for i := p - warm; i < n; i += 4 {
				if d := time.Until(t0.Add(time.Duration(i+warm) * interval)); d > 0 {
					<-time.After(d)
				}
				seq := i
				if i < 0 {
					seq = n + 1 // warm-up: not recorded
				}
				if _, err := q.Enqueue(ctx, "lat", map[string]int{"Seq": seq}); err != nil {
					t.Error(err)
					return
				}
				if i >= 0 {
					committed[i].Store(int64(time.Since(base)))
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	var lat []time.Duration
	for i := range n {
		for started[i].Load() == 0 && time.Now().Before(deadline) {
			<-time.After(time.Millisecond)
		}
		lat = append(lat, time.Duration(started[i].Load()-committed[i].Load()))
	}
	stop()
	require.NoError(t, <-werr)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	t.Logf("pickup latency at %d/s (%d jobs): p50 %s p90 %s p99 %s max %s", rate, n, p(0.5), p(0.9), p(0.99), lat[len(lat)-1])
}

// TestMeasureScheduledJobs compares, with no scheduled job and with
// 1,000,000 jobs scheduled next week, the cost of a short claim (the one a
// domain makes before it parks), of a promoter pass and of a sweep check.
// Only with BACKLOG_MEASURE=1.
func TestMeasureScheduledJobs(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	spec, err := newDomainSpec([]string{"work"}, nil)
	require.NoError(t, err)
	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 21 {
			s := time.Now()
			f()
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	measure := func(label string) {
		claim := median(func() {
			_, err := q.store.Claim(ctx, spec.types, spec.tagsJ, 100, 100, time.Minute, "w", nil)
			require.NoError(t, err)
		})
		promote := median(func() {
			_, err := q.store.Promote(ctx, maintain.PromoteBatch)
			require.NoError(t, err)
		})
		expiry := median(func() {
			_, _, err := q.store.NextExpiry(ctx)
			require.NoError(t, err)
		})
		t.Logf("%s: short claim (k=100, nothing due) %s; promoter pass %s; sweep check %s", label, claim, promote, expiry)
	}
	measure("no scheduled job")
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, state, run_at)
		SELECT gen_random_uuid(), 'work', '{}', 'scheduled', now() + interval '7 days' + g * interval '1 millisecond'
		FROM generate_series(1, 1000000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE "`+schema+`".jobs`)
	require.NoError(t, err)
	measure("1,000,000 jobs scheduled next week")
}

// TestMeasureOperator measures the operator API with a large history:
// Stats and Throughput with 10,000,000 finished jobs (of 10 types, over a
// week), List pages for several filters, and a bulk retry of 100,000
// failed jobs while workers keep running other jobs. Only with
// BACKLOG_MEASURE=1; BACKLOG_MEASURE_ROWS changes the 10,000,000.
func TestMeasureOperator(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	rows := 10_000_000
	if r := os.Getenv("BACKLOG_MEASURE_ROWS"); r != "" {
		_, err := fmt.Sscan(r, &rows)
		require.NoError(t, err)
	}
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	s := `"` + schema + `"`
	start := time.Now()
	// A week of history, in finish order, as finish() writes it: UUIDv7
	// IDs, 10 types, one job in 100 failed, and the counters.
	const chunk = 1_000_000
	span := int64(7 * 24 * time.Hour / time.Millisecond)
	for from := 0; from < rows; from += chunk {
		_, err := pool.Exec(ctx, `INSERT INTO `+s+`.job_history (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
			timeout_ms, errors, last_error, created_at, started_at, finished_at, expires_at)
		SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid,
		       'type.' || (g % 10), '{"n":1}', '{}', CASE WHEN g % 100 = 0 THEN 'failed' ELSE 'completed' END, 0, f, 1, 1, 0, '[]',
		       CASE WHEN g % 100 = 0 THEN 'upstream timeout ' || g END, f, f, f, now() + interval '1 day'
		FROM generate_series($1::bigint, $2::bigint) g,
		LATERAL (SELECT now() - (($3::bigint - g * $3::bigint / $4::bigint) || ' milliseconds')::interval AS f) t,
		LATERAL (SELECT lpad(to_hex((extract(epoch FROM f) * 1000)::bigint), 12, '0') AS h, md5(g::text) AS r) x`,
			from+1, min(from+chunk, rows), span, rows)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.job_counts_hourly (bucket, type, state, n, wait_ms, run_ms)
		SELECT date_trunc('hour', finished_at), type, state, count(*), 0, 0 FROM `+s+`.job_history
		WHERE finished_at < date_trunc('hour', now()) - interval '1 hour' GROUP BY 1, 2, 3`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.job_counts (bucket, type, state, shard, n, wait_ms, run_ms)
		SELECT date_trunc('minute', finished_at), type, state, 0, count(*), 0, 0 FROM `+s+`.job_history
		WHERE finished_at >= date_trunc('hour', now()) - interval '1 hour' GROUP BY 1, 2, 3`)
	require.NoError(t, err)
	_, err = q.store.SummarizeHistory(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.job_history`)
	require.NoError(t, err)
	t.Logf("seeded %d finished jobs (and their counters) in %s", rows, time.Since(start).Round(time.Second))

	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 11 {
			s := time.Now()
			f()
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	t.Logf("Stats: median %s", median(func() {
		_, err := q.Stats(ctx)
		require.NoError(t, err)
	}))
	t.Logf("Throughput, last hour by minute: median %s", median(func() {
		_, err := q.Throughput(ctx, time.Now().Add(-time.Hour), time.Minute)
		require.NoError(t, err)
	}))
	t.Logf("Throughput, last day by hour: median %s", median(func() {
		_, err := q.Throughput(ctx, time.Now().Add(-24*time.Hour), time.Hour)
		require.NoError(t, err)
	}))
	for _, c := range []struct {
		name string
		f    Filter
	}{
		{"everything", Filter{}},
		{"failed", Filter{States: []State{StateFailed}}},
		{"failed, error text", Filter{States: []State{StateFailed}, ErrorContains: "timeout 77"}},
		{"one type", Filter{Types: []string{"type.3"}}},
		{"finished in an hour a day ago", Filter{FinishedAfter: time.Now().Add(-25 * time.Hour), FinishedBefore: time.Now().Add(-24 * time.Hour)}},
		{"error text, any state", Filter{ErrorContains: "timeout"}},
	} {
		n := 0
		d := median(func() {
			p, err := q.List(ctx, c.f, ListOptions{})
			require.NoError(t, err)
			n = len(p.Jobs)
		})
		t.Logf("List page (%s): %d jobs, median %s", c.name, n, d)
	}

	// Bulk retry of 100,000 failed jobs while workers run other jobs.
	failed := min(100_000, rows/100)
	var other atomic.Int64
	mux := NewMux()
	for i := range 10 {
		mux.HandleFunc(fmt.Sprintf("type.%d", i), func(context.Context, *Job) error { return nil })
	}
	mux.HandleFunc("other", func(context.Context, *Job) error { other.Add(1); return nil })
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- q.Work(wctx, mux, Types("other")) }()
	feed := make(chan struct{})
	go func() {
		defer close(feed)
		for wctx.Err() == nil {
			specs := make([]JobSpec, 100)
			for i := range specs {
				specs[i] = JobSpec{Type: "other"}
			}
			if _, err := q.EnqueueMany(wctx, specs); err != nil {
				return
			}
			<-time.After(20 * time.Millisecond) // about 5,000 jobs/s of other work
		}
	}()
	before := other.Load()
	s0 := time.Now()
	n, err := q.RetryWhere(ctx, Filter{States: []State{StateFailed}})
	require.NoError(t, err)
	took := time.Since(s0)
	during := other.Load() - before
	stop()
	<-feed
	require.NoError(t, <-werr)
	t.Logf("RetryWhere of %d failed jobs (of %d finished): %s; meanwhile workers completed %d other jobs (%.0f/s)",
		n, rows, took.Round(time.Millisecond), during, float64(during)/took.Seconds())
	require.Equal(t, failed, n)
}

// TestMeasurePickupStages traces where pickup latency goes: for every job
// (5 s at 1,000 jobs/s from 4 producers, producer and workers in one
// process, as TestMeasurePickupLatency) it splits the time from the
// insert's commit to the handler's start at the claim's start (the
// database's started_at, the claim statement's now()), and counts the
// claim statements and their durations. Only with BACKLOG_MEASURE=1;
// BACKLOG_LATENCY_RATE sets the rate.
func TestMeasurePickupStages(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	rate := 1000
	if r := os.Getenv("BACKLOG_LATENCY_RATE"); r != "" {
		_, err := fmt.Sscan(r, &rate)
		require.NoError(t, err)
	}
	n := rate * 5
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	claims := &stmtTimer{match: `claim_jobs"(`}
	cfg.ConnConfig.Tracer = claims
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))

	var mu sync.Mutex
	commits := make(map[uuid.UUID]time.Time, n)
	starts := make(map[uuid.UUID]time.Time, n)
	all := make(chan struct{})
	h := HandlerFunc(func(_ context.Context, j *Job) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		starts[j.ID] = now
		if len(starts) == n {
			close(all)
		}
		return nil
	})
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- q.Work(wctx, h, Types("lat")) }()
	interval := time.Second / time.Duration(rate)
	t0 := time.Now().Add(500 * time.Millisecond) // Work's first claim parks the domain meanwhile
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := p; i < n; i += 4 {
				if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
					<-time.After(d) // pacing, not waiting for an event
				}
				id, err := q.Enqueue(ctx, "lat", map[string]int{"Seq": i})
				at := time.Now()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				commits[id] = at
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatal("not every job started within 30 s")
	}
	stop()
	require.NoError(t, <-werr)

	rows, err := pool.Query(ctx, `SELECT id, started_at FROM `+pgx.Identifier{schema, "all_jobs"}.Sanitize())
	require.NoError(t, err)
	var toClaim, toHandler, total []time.Duration
	for rows.Next() {
		var id uuid.UUID
		var claimed time.Time
		require.NoError(t, rows.Scan(&id, &claimed))
		c, ok := commits[id]
		if !ok {
			continue
		}
		toClaim = append(toClaim, claimed.Sub(c))
		toHandler = append(toHandler, starts[id].Sub(claimed))
		total = append(total, starts[id].Sub(c))
	}
	require.NoError(t, rows.Err())
	pct := func(name string, v []time.Duration) {
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		p := func(q float64) time.Duration { return v[min(len(v)-1, int(q*float64(len(v))))] }
		t.Logf("%-40s p50 %8s p90 %8s p99 %8s max %8s", name, p(0.5), p(0.9), p(0.99), v[len(v)-1])
	}
	t.Logf("pickup at %d/s, %d jobs; the database's clock and this process's are the same machine's", rate, len(total))
	pct("commit → claim statement start", toClaim)
	pct("claim statement start → handler start", toHandler)
	pct("commit → handler start (pickup)", total)
	d := claims.durations()
	pct(fmt.Sprintf("claim statements (%d, %.2f per job)", len(d), float64(len(d))/float64(n)), d)
}

// stmtTimer is a pgx tracer that records the durations of the statements
// whose text contains match.
type stmtTimer struct {
	match string
	mu    sync.Mutex
	d     []time.Duration
}

type stmtTimerKey struct{}

func (s *stmtTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, s.match) {
		return ctx
	}
	return context.WithValue(ctx, stmtTimerKey{}, time.Now())
}

func (s *stmtTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if at, ok := ctx.Value(stmtTimerKey{}).(time.Time); ok {
		s.mu.Lock()
		s.d = append(s.d, time.Since(at))
		s.mu.Unlock()
	}
}

func (s *stmtTimer) durations() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}
