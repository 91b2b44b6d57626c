package faults_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/pgcluster"
	"github.com/backlogq/backlog/internal/worktest"
)

// TestServerCrashRunsNoAttemptTwice: a private PostgreSQL cluster
// (durable settings: fsync and synchronous_commit on) crashes (an
// immediate shutdown: nothing is flushed) right after claims committed,
// while every claimed job's handler runs, and restarts. No (job, attempt)
// may run twice: a claim whose handler started must survive the crash, or
// a user's idempotency key (job ID, attempt) means nothing. The server's
// WAL writer is slowed (wal_writer_delay = 10 s), so that nothing but the
// claim's own commit flushes its WAL before the crash: a claim committed
// with synchronous_commit = off (migrations 6 to 16) is lost, and its job
// runs again at the same attempt.
func TestServerCrashRunsNoAttemptTwice(t *testing.T) {
	requireFaults(t)
	const jobs = 50
	cl := pgcluster.Start(t, os.Getenv(ciEnv) == "1", pgcluster.Options{"wal_writer_delay=10000ms", "checkpoint_timeout=1h"})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cl.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	q, err := backlog.New(ctx, pool, backlog.WithLogger(logger(t, "crash")), backlog.WithPollInterval(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.NoError(t, q.Migrate(ctx))

	specs := make([]backlog.JobSpec, jobs)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "crash"}
	}
	ids, err := q.EnqueueMany(ctx, specs)
	require.NoError(t, err)

	type run struct {
		id      uuid.UUID
		attempt int
	}
	var mu sync.Mutex
	runs := map[run]int{}
	started := make(chan struct{}, 4*jobs)
	release := make(chan struct{})
	h := backlog.HandlerFunc(func(ctx context.Context, j *backlog.Job) error {
		mu.Lock()
		runs[run{j.ID, j.Attempt}]++
		mu.Unlock()
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Twice as many workers as jobs: jobs whose claims were lost would be
	// claimed again at once after the restart.
	worktest.Run(t, func(ctx context.Context) error {
		return q.Work(ctx, h, backlog.Concurrency(2*jobs), backlog.Types("crash"))
	})
	for n := range jobs {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d jobs started", n, jobs)
		}
	}
	require.NoError(t, cl.Crash())
	require.NoError(t, cl.Start())
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, cl.WaitReady(rctx))
	close(release)

	deadline := time.Now().Add(2 * time.Minute)
	for _, id := range ids {
		for {
			info, err := q.Job(ctx, id)
			if err == nil && info.State.Terminal() {
				require.Equal(t, backlog.StateCompleted, info.State, "job %s", id)
				break
			}
			require.True(t, time.Now().Before(deadline), "job %s not finished after the restart (last: %v, %v)", id, info, err)
			<-time.After(20 * time.Millisecond)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for r, n := range runs {
		if n > 1 {
			twice++
			t.Logf("job %s ran attempt %d %d times", r.id, r.attempt, n)
		}
	}
	report(t, summaryRow{Scenario: "server crash right after claims (immediate shutdown, restart)", Jobs: jobs,
		Faults: "1 crash", Lost: 0, Duplicates: fmt.Sprintf("%d (job, attempt) run twice", twice), Pickup: "-"})
	require.Zero(t, twice, "(job, attempt) pairs run twice: claims were lost in the crash")
}
