package faults_test

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/pgcluster"
	"github.com/backlogq/backlog/internal/worktest"
)

// TestOutageLogsTwoLines: a private PostgreSQL is stopped for a few
// seconds under a working Queue (producers, workers, the heartbeat, the
// completer, the sweep, the listener all failing at their own pace), then
// started again. The log tells the outage, not every failed statement:
// one line when it began, one when it ended (with the counts), and Stats
// counts the errors. Before, one outage logged hundreds of warnings.
func TestOutageLogsTwoLines(t *testing.T) {
	requireFaults(t)
	cl := pgcluster.Start(t, os.Getenv(ciEnv) == "1", nil)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(cl.URL())
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w := &warnings{}
	q, err := backlog.New(ctx, pool, backlog.WithLogger(slog.New(w)), backlog.WithPollInterval(200*time.Millisecond),
		backlog.WithSweepInterval(200*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.NoError(t, q.Migrate(ctx))

	var done atomic.Int64
	worktest.Run(t, func(ctx context.Context) error {
		return q.Work(ctx, backlog.HandlerFunc(func(ctx context.Context, j *backlog.Job) error {
			done.Add(1)
			return nil
		}), backlog.Types("o"), backlog.Concurrency(4))
	})
	// A producer: an enqueue every few milliseconds, errors and all.
	stop := make(chan struct{})
	produced := make(chan struct{})
	go func() { // awaited below
		defer close(produced)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				_, _ = q.Enqueue(ctx, "o", nil)
			}
		}
	}()
	defer func() { close(stop); <-produced }()
	waitDone := func(n int64, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for done.Load() < n {
			require.True(t, time.Now().Before(deadline), "jobs stopped running: %d of %d", done.Load(), n)
			<-time.After(10 * time.Millisecond)
		}
	}
	waitDone(50, 30*time.Second)

	require.NoError(t, cl.Stop())
	<-time.After(3 * time.Second) // the outage
	require.NoError(t, cl.Start())
	waitDone(done.Load()+50, time.Minute)
	// Every loop gets its turn to succeed again (the sweep, the heartbeat
	// at lease/3, the registry): the outage ends.
	deadline := time.Now().Add(time.Minute)
	var st *backlog.Stats
	for {
		st, err = q.Stats(ctx)
		if err == nil && st.DatabaseErrors.FailingSince == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the outage never ended: %+v, %v; warnings: %v", st, err, w.containing(""))
		<-time.After(50 * time.Millisecond)
	}
	t.Logf("warnings: %v; stats: %+v", w.containing(""), st.DatabaseErrors)
	require.Len(t, w.containing("database errors began"), 1)
	require.Len(t, w.containing("database errors ended"), 1)
	require.LessOrEqual(t, len(w.containing("")), 4, "the outage was logged line by line")
	require.Positive(t, st.DatabaseErrors.Total)
	require.Equal(t, int64(1), st.DatabaseErrors.Outages)
}
