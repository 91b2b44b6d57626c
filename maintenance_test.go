package backlog_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

func TestRetentionDeletesOnlyExpiredFinishedJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithRetention(time.Hour, 48*time.Hour))
	ctx := context.Background()
	// Workers keep running other jobs while the cleaner works.
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("live"))
	mk := func(n int, state string, age time.Duration) {
		specs := make([]backlog.JobSpec, n)
		for i := range specs {
			specs[i] = backlog.JobSpec{Type: "old"}
		}
		ids, err := e.q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
		_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET state = $2,
			finished_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled') THEN now() - $3 * interval '1 second' END
			WHERE id = ANY($1)`, ids, state, age.Seconds())
		require.NoError(t, err)
	}
	mk(2500, "completed", 2*time.Hour)  // expired: 3 batches of ≤1000
	mk(10, "completed", 30*time.Minute) // kept
	mk(20, "failed", 72*time.Hour)      // expired
	mk(30, "failed", 24*time.Hour)      // kept (failed are kept 48h)
	mk(40, "cancelled", 50*time.Hour)   // expired
	mk(50, "available", 0)              // live: never touched
	for range 100 {
		_, err := e.q.Enqueue(ctx, "live", nil)
		require.NoError(t, err)
	}
	// periodic_runs: old rows go, except the latest of each schedule.
	_, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".periodic_runs (name, plan_time, job_id, created_at)
		SELECT 'a', now() - g * interval '1 hour', gen_random_uuid(), now() - g * interval '1 hour' + interval '30 minutes'
		FROM generate_series(1, 100) g
		UNION ALL SELECT 'b', now() - interval '30 days', gen_random_uuid(), now() - interval '30 days'`)
	require.NoError(t, err)

	r, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 2500+20+40, r.Jobs)
	require.GreaterOrEqual(t, r.Batches, 3, "deleted in batches")
	require.Equal(t, 100-48, r.PeriodicRuns, "rows older than 48h, except b's only (latest) row")
	require.Equal(t, 10, e.count("type = 'old' AND state = 'completed'"))
	require.Equal(t, 30, e.count("type = 'old' AND state = 'failed'"))
	require.Equal(t, 0, e.count("type = 'old' AND state = 'cancelled'"))
	require.Equal(t, 50, e.count("type = 'old' AND state = 'available'"))
	e.waitCount("type = 'live' AND state = 'completed'", 100, 30*time.Second)

	again, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, again.Jobs, "a second pass finds nothing")
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
