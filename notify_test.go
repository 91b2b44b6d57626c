package backlog_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// startTimes returns a handler that reports each job's start time.
func startTimes() (backlog.Handler, chan time.Time) {
	ch := make(chan time.Time, 1000)
	return backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		ch <- time.Now()
		return nil
	}), ch
}

// awaitStart returns the next handler start, failing the test with msg
// when none comes within 10 s.
func awaitStart(t *testing.T, starts chan time.Time, msg string) time.Time {
	t.Helper()
	select {
	case s := <-starts:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
		return time.Time{}
	}
}

// waitIdle makes sure the Work call's domain has claimed once and parked,
// by running one job through it.
func waitIdle(t *testing.T, e *env, typ string, starts chan time.Time) {
	t.Helper()
	id, err := e.q.Enqueue(context.Background(), typ, nil)
	require.NoError(t, err)
	awaitStart(t, starts, "warm-up job did not run")
	e.waitState(id, 10*time.Second, backlog.StateCompleted)
}

func TestNotifyWakesIdleWorkers(t *testing.T) {
	t.Parallel()
	// A backup poll of an hour: only a notification can start these jobs.
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("ping"), backlog.Concurrency(4))
	waitIdle(t, e, "ping", starts)

	var lat []time.Duration
	for range 20 {
		_, err := e.q.Enqueue(context.Background(), "ping", nil)
		require.NoError(t, err)
		committed := time.Now()
		lat = append(lat, awaitStart(t, starts, "idle workers were not woken by the notification").Sub(committed))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("commit → handler start, 20 jobs one at a time: p50 %s, max %s", lat[10], lat[19])
}

func TestBackupPollFindsJobsInsertedWithoutNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(300*time.Millisecond), backlog.WithPollJitter(0))
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("raw"))
	waitIdle(t, e, "raw", starts)
	_, err := e.pool.Exec(context.Background(),
		`INSERT INTO "`+e.schema+`".jobs (id, type, args) VALUES (gen_random_uuid(), 'raw', '{}')`)
	require.NoError(t, err)
	inserted := time.Now()
	s := awaitStart(t, starts, "backup poll did not find the job")
	t.Logf("raw insert (no NOTIFY) picked up after %s (backup poll 300ms)", s.Sub(inserted))
}

func TestScheduledJobStartsOnTimeWithoutPolling(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("later"))
	waitIdle(t, e, "later", starts)

	_, err := e.q.Enqueue(context.Background(), "later", nil, backlog.Delay(400*time.Millisecond))
	require.NoError(t, err)
	enq := time.Now()
	s := awaitStart(t, starts, "scheduled job did not start (no run_at timer?)")
	require.GreaterOrEqual(t, s.Sub(enq), 350*time.Millisecond, "not before run_at")
	t.Logf("job delayed 400ms started after %s", s.Sub(enq))

	// Scheduled before the workers parked: the claim reports the next run_at.
	_, err = e.q.Enqueue(context.Background(), "later", nil, backlog.Delay(600*time.Millisecond))
	require.NoError(t, err)
	awaitStart(t, starts, "second scheduled job did not start")
}

func TestListenerReconnectsAndWorkContinues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("relisten"))
	waitIdle(t, e, "relisten", starts)

	// Kill the LISTEN connection (only it listens on this schema's channel).
	var killed int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE pid IN (SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN "`+e.schema+`.backlog"')`).Scan(&killed))
	require.Equal(t, 1, killed)
	// A job inserted while the listener is down, with no NOTIFY: the
	// reconnect wakes every domain, which finds it.
	_, err := e.pool.Exec(context.Background(),
		`INSERT INTO "`+e.schema+`".jobs (id, type, args) VALUES (gen_random_uuid(), 'relisten', '{}')`)
	require.NoError(t, err)
	awaitStart(t, starts, "job not picked up after the listener reconnected")
	// And notifications work again.
	_, err = e.q.Enqueue(context.Background(), "relisten", nil)
	require.NoError(t, err)
	awaitStart(t, starts, "notifications do not wake workers after the reconnect")
}

func TestPollOnlyModeWakesLocalWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollOnly(), backlog.WithPollInterval(time.Hour))
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("local"))
	waitIdle(t, e, "local", starts)
	_, err := e.q.Enqueue(context.Background(), "local", nil)
	require.NoError(t, err)
	awaitStart(t, starts, "poll-only mode: a local enqueue did not wake the local workers")
	var listeners int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN "`+e.schema+`.backlog"'`).Scan(&listeners))
	require.Zero(t, listeners)
}

// TestCloseSendsHeldPostings: a producer whose notifier holds a posting
// back (WithNotifyInterval: one NOTIFY a second) closes right after its
// last enqueue. Close sends what it holds, so the worker of another
// process, whose backup poll is an hour, starts the job at once instead
// of an hour later.
func TestCloseSendsHeldPostings(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("held"), backlog.Concurrency(2), backlog.Prefetch(0))
	waitIdle(t, e, "held", starts)

	producer, err := backlog.New(context.Background(), e.pool, backlog.WithSchema(e.schema), backlog.WithLogger(logger(t)),
		backlog.WithNotifyInterval(time.Second))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = producer.Enqueue(ctx, "other", nil) // its posting goes at once; the next waits out the interval
	require.NoError(t, err)
	_, err = producer.Enqueue(ctx, "held", nil)
	require.NoError(t, err)
	require.NoError(t, producer.Close())
	awaitStart(t, starts, "the job enqueued just before Close did not start: its posting was dropped")
}
