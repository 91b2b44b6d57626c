package backlog_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

func TestRetentionDropsExpiredHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithRetention(time.Hour, 48*time.Hour))
	ctx := context.Background()
	s := `"` + e.schema + `"`
	// Workers keep running other jobs while the cleaner works.
	mux := backlog.NewMux()
	mux.HandleFunc("live", func(context.Context, *backlog.Job) error { return nil })
	mux.HandleFunc("bad", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("no")) })
	work(t, e.q, mux)

	// Finished jobs move to job_history with their state's retention.
	ok, err := e.q.Enqueue(ctx, "live", nil)
	require.NoError(t, err)
	bad, err := e.q.Enqueue(ctx, "bad", nil)
	require.NoError(t, err)
	e.waitState(ok, 10*time.Second, backlog.StateCompleted)
	e.waitState(bad, 10*time.Second, backlog.StateFailed)
	keep := func(id uuid.UUID) time.Duration {
		var ms float64
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - finished_at) * 1000 FROM `+s+`.job_history WHERE id = $1`, id).Scan(&ms))
		return time.Duration(ms) * time.Millisecond
	}
	require.Equal(t, time.Hour, keep(ok))
	require.Equal(t, 48*time.Hour, keep(bad))
	require.Zero(t, e.countLive("true"), "finished jobs left the hot table")

	// An expired day partition (whole), rows in the default partition
	// (expired and not), and live jobs.
	hist := func(n int, state, expires string) {
		_, err := e.pool.Exec(ctx, `INSERT INTO `+s+`.job_history (id, type, args, tags, state, priority, run_at, attempt,
			max_attempts, timeout_ms, errors, created_at, finished_at, expires_at)
			SELECT gen_random_uuid(), 'old', '{}', '{}', $2, 0, now(), 1, 25, 0, '[]', now(), now(), `+expires+`
			FROM generate_series(1, $1)`, n, state)
		require.NoError(t, err)
	}
	_, err = e.pool.Exec(ctx, `CREATE TABLE `+s+`.job_history_p20000101 PARTITION OF `+s+`.job_history
		FOR VALUES FROM ('2000-01-01') TO ('2000-01-02')`)
	require.NoError(t, err)
	hist(2500, "completed", `'2000-01-01 12:00Z'`) // an expired partition: dropped whole
	hist(30, "failed", `'2000-01-01 13:00Z'`)
	hist(1200, "cancelled", `'1999-01-01'`) // expired, in the default partition: deleted in batches
	hist(40, "failed", `'infinity'`)        // the default partition's unexpired rows stay
	specs := make([]backlog.JobSpec, 50)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "later", Options: []backlog.EnqueueOption{backlog.Delay(time.Hour)}}
	}
	_, err = e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	for range 100 {
		_, err := e.q.Enqueue(ctx, "live", nil)
		require.NoError(t, err)
	}
	// periodic_runs: old rows go, except the latest of each schedule.
	_, err = e.pool.Exec(ctx, `INSERT INTO `+s+`.periodic_runs (name, plan_time, job_id, created_at)
		SELECT 'a', now() - g * interval '1 hour', gen_random_uuid(), now() - g * interval '1 hour' + interval '30 minutes'
		FROM generate_series(1, 100) g
		UNION ALL SELECT 'b', now() - interval '30 days', gen_random_uuid(), now() - interval '30 days'`)
	require.NoError(t, err)

	// A partition someone reads is left for the next pass (the drop never
	// waits behind a query), and nothing else waits for it.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE `+s+`.job_history_p20000101 IN ACCESS SHARE MODE`)
	require.NoError(t, err)
	r, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, r.Partitions, "a locked partition is not dropped")
	require.Equal(t, 1200, r.Jobs, "expired rows of the default partition")
	require.GreaterOrEqual(t, r.Batches, 2, "deleted in batches")
	require.Equal(t, 100-48, r.PeriodicRuns, "rows older than 48h, except b's only (latest) row")
	require.Equal(t, 2530, e.count("type = 'old' AND expires_at < '2000-01-02'"))
	require.NoError(t, tx.Rollback(ctx))

	// A later pass drops it: passes go on until it is gone. The first may
	// find it held again, by the queue's own maintenance summarizing
	// job_history's BRIN indexes (every 2 s while jobs finish; the drop
	// never waits behind a lock). The queue's cleaner itself runs next a
	// minute after Work started, so within the deadline it is these
	// passes that drop the partition.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err = e.q.Clean(ctx)
		require.NoError(t, err)
		var left bool
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s+`.job_history_p20000101`).Scan(&left))
		if !left {
			break
		}
		require.False(t, time.Now().After(deadline), "the expired partition was not dropped within 10 s of its reader's end")
		<-tick.C
	}
	require.Equal(t, 0, e.count("type = 'old' AND state IN ('completed', 'cancelled')"))
	require.Equal(t, 40, e.count("type = 'old' AND state = 'failed'"))
	require.Equal(t, 50, e.count("type = 'later' AND state = 'scheduled'"))
	e.waitCount("type = 'live' AND state = 'completed'", 101, 30*time.Second)

	again, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, again.Jobs+again.Partitions, "a second pass finds nothing")
}

func TestStatsMatchTheTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithWorkerID("stats-worker"))
	ctx := context.Background()
	hold := make(chan struct{})
	running := make(chan struct{}, 3)
	mux := backlog.NewMux()
	mux.HandleFunc("ok", func(context.Context, *backlog.Job) error { return nil })
	mux.HandleFunc("bad", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("no")) })
	mux.HandleFunc("hold", func(ctx context.Context, job *backlog.Job) error {
		running <- struct{}{}
		<-hold
		return nil
	})
	for range 5 {
		_, err := e.q.Enqueue(ctx, "ok", nil)
		require.NoError(t, err)
	}
	for range 2 {
		_, err := e.q.Enqueue(ctx, "bad", nil)
		require.NoError(t, err)
	}
	for range 3 {
		_, err := e.q.Enqueue(ctx, "hold", nil)
		require.NoError(t, err)
	}
	waiting, err := e.q.Enqueue(ctx, "nobody", nil) // no worker for this type
	require.NoError(t, err)
	_, err = e.q.Enqueue(ctx, "nobody", nil, backlog.DependsOn(waiting)) // blocked
	require.NoError(t, err)
	stop := work(t, e.q, mux, backlog.Concurrency(10))
	for range 3 {
		<-running
	}
	e.waitCount("state IN ('completed', 'failed')", 7, 10*time.Second)

	st, err := e.q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[backlog.State]int64{"completed": 5, "failed": 2, "running": 3, "available": 1, "blocked": 1}, st.ByState)
	require.Equal(t, int64(5), st.ByType["ok"][backlog.StateCompleted])
	require.Equal(t, int64(2), st.ByType["bad"][backlog.StateFailed])
	require.Equal(t, int64(3), st.ByType["hold"][backlog.StateRunning])
	require.Equal(t, int64(1), st.ByType["nobody"][backlog.StateBlocked])
	require.Equal(t, map[string]int64{"stats-worker": 3}, st.RunningByWorker)
	require.Positive(t, st.OldestAvailable)
	require.Less(t, st.OldestAvailable, time.Minute)
	close(hold)
	require.NoError(t, stop())
}

func TestHooksSeeEnqueuesAndOutcomes(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	outcomes := map[backlog.Outcome]int{}
	var enqueued, started atomic.Int32
	type ctxKey struct{}
	sawSpan := atomic.Bool{}
	e := newEnv(t, backlog.WithHooks(backlog.Hooks{
		Enqueued: func(ctx context.Context, ev backlog.EnqueueEvent) {
			if ev.Err == nil {
				enqueued.Add(int32(ev.Jobs))
			}
		},
		Started: func(ctx context.Context, job *backlog.Job) context.Context {
			started.Add(1)
			return context.WithValue(ctx, ctxKey{}, "span")
		},
		Finished: func(ctx context.Context, job *backlog.Job, ev backlog.JobEvent) {
			mu.Lock()
			outcomes[ev.Outcome]++
			mu.Unlock()
			if ev.QueueLatency < 0 || ev.Duration < 0 {
				panic("negative durations")
			}
		},
	}))
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("h", func(ctx context.Context, job *backlog.Job) error {
		if ctx.Value(ctxKey{}) == "span" {
			sawSpan.Store(true)
		}
		switch string(job.Args) {
		case `"fail"`:
			return backlog.Permanent(errors.New("x"))
		case `"retry"`:
			if job.Attempt == 1 {
				return errors.New("again")
			}
		case `"snooze"`:
			if job.Attempt == 1 && job.Priority == 0 {
				return backlog.Snooze(time.Millisecond)
			}
		}
		return nil
	}, backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond}))
	work(t, e.q, mux)
	ids, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "h", Args: "ok"}, {Type: "h", Args: "fail"}, {Type: "h", Args: "retry"}})
	require.NoError(t, err)
	for _, id := range ids {
		e.waitJob(id, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	}
	require.Equal(t, int32(3), enqueued.Load())
	require.Equal(t, int32(4), started.Load())
	require.True(t, sawSpan.Load(), "the handler got the context Started returned")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[backlog.Outcome]int{backlog.OutcomeCompleted: 2, backlog.OutcomeFailed: 1, backlog.OutcomeRetried: 1}, outcomes)
}

// TestStatsReportTheOldestTransaction: an open transaction keeps
// PostgreSQL from cleaning up dead job rows; Stats names it.
func TestStatsReportTheOldestTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	began := time.Now()
	// Other tests (other packages' too) run in the same database: until
	// this transaction is the oldest one, the one reported must be older;
	// wait for the others to end.
	deadline := time.Now().Add(4 * time.Minute)
	for {
		st, err := e.q.Stats(ctx)
		require.NoError(t, err)
		o := st.OldestTransaction
		require.NotNil(t, o, "an open transaction is reported")
		if o.PID == pid {
			require.Equal(t, "session", o.Kind)
			require.Equal(t, "idle in transaction", o.State)
			require.Contains(t, o.Query, "pg_backend_pid")
			return
		}
		require.GreaterOrEqual(t, o.Age, time.Since(began)-time.Second, "the reported transaction is younger than this one: %+v", o)
		require.True(t, time.Now().Before(deadline), "the open transaction was never the oldest: %+v", o)
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// TestDrainingBacklogVacuumsTheJobsTable: while jobs finish, the
// maintenance loop vacuums the jobs table once its statistics count the
// dead rows past the threshold (lowered here from 100,000 to 300, and the
// live rows it must hold from 100,000 to 1): a
// draining backlog's dead entries at the head of the claim indexes would
// otherwise slow every claim until autovacuum came by.
func TestDrainingBacklogVacuumsTheJobsTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithVacuumForTest(300, 1))
	ctx := context.Background()
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("vac"))
	jobs := pgx.Identifier{e.schema, "jobs"}.Sanitize()
	vacuums := func() int {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass`, jobs).Scan(&n))
		return n
	}
	require.Zero(t, vacuums())
	specs := make([]backlog.JobSpec, 200)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "vac"}
	}
	// Jobs keep finishing (the loop looks only then) until it vacuumed.
	deadline := time.Now().Add(40 * time.Second)
	for vacuums() == 0 {
		require.True(t, time.Now().Before(deadline), "the jobs table was never vacuumed")
		_, err := e.q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
		<-time.After(50 * time.Millisecond)
	}
}

// TestVacuumDoesNotHoldUpTheMaintenanceLoop: the loop's vacuum of the jobs
// table runs beside it, not in it: while a vacuum runs (slowed here by a
// cost delay to many seconds, as one of a large table on a busy server
// can be), a scheduled job still becomes due and runs, and closing the
// Queue stops the vacuum.
func TestVacuumDoesNotHoldUpTheMaintenanceLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.PoolWith(t, 8, map[string]string{"vacuum_cost_delay": "100", "vacuum_cost_limit": "1"})
	e := &env{t: t, pool: pool, schema: testdb.Schema(t)}
	e.q = e.queue(pool, backlog.WithVacuumForTest(300, 1))
	require.NoError(t, e.q.Migrate(ctx))
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("vac"))
	jobs := pgx.Identifier{e.schema, "jobs"}.Sanitize()
	vacuuming := func() bool {
		var running bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_progress_vacuum WHERE relid = $1::regclass)`, jobs).Scan(&running))
		return running
	}
	specs := make([]backlog.JobSpec, 200)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "vac"}
	}
	deadline := time.Now().Add(40 * time.Second)
	for !vacuuming() {
		require.True(t, time.Now().Before(deadline), "the jobs table was never vacuumed")
		_, err := e.q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
		<-time.After(50 * time.Millisecond)
	}
	id, err := e.q.Enqueue(ctx, "vac", nil, backlog.Delay(300*time.Millisecond))
	require.NoError(t, err)
	e.waitState(id, 20*time.Second, backlog.StateCompleted)
	require.True(t, vacuuming(), "the vacuum ended before the scheduled job ran: the test proves nothing (slow it more)")

	// Closing the Queue stops the vacuum on the server at once (a dropped
	// connection alone would leave it running, holding its lock: the
	// server does not notice a closed client while it vacuums), so Close
	// does not wait for the store's fallback (5 s, then the connection is
	// dropped).
	closing := time.Now()
	require.NoError(t, e.q.Close())
	require.Less(t, time.Since(closing), 4*time.Second, "Close waited for the vacuum")
	deadline = closing.Add(4 * time.Second)
	for vacuuming() {
		require.True(t, time.Now().Before(deadline), "the vacuum ran on after the Queue closed")
		<-time.After(20 * time.Millisecond)
	}
}
