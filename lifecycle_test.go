package backlog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	started := make(chan string, 2)
	release := make(chan struct{})
	mux := backlog.NewMux()
	// "finishes" completes within the grace period once released.
	mux.HandleFunc("finishes", func(ctx context.Context, job *backlog.Job) error {
		started <- "finishes"
		<-release
		return nil
	})
	// "hangs" only returns when its context is cancelled.
	causes := make(chan error, 1)
	mux.HandleFunc("hangs", func(ctx context.Context, job *backlog.Job) error {
		started <- "hangs"
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	})
	finishes, err := e.q.Enqueue(ctx, "finishes", nil)
	require.NoError(t, err)
	hangs, err := e.q.Enqueue(ctx, "hangs", nil)
	require.NoError(t, err)

	stop := work(t, e.q, mux, backlog.Concurrency(2), backlog.GracePeriod(300*time.Millisecond))
	<-started
	<-started

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Work is stopping: a job enqueued now must not be claimed.
	later, err := e.q.Enqueue(ctx, "finishes", nil)
	require.NoError(t, err)
	close(release)
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not return")
	}
	require.ErrorIs(t, <-causes, backlog.ErrShutdown)

	info, err := e.q.Job(ctx, finishes)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State, "a handler that finished within the grace period is recorded")
	info, err = e.q.Job(ctx, hangs)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, info.State, "an unfinished job is released")
	require.Equal(t, 0, info.Attempt, "a release does not spend the attempt")
	require.False(t, info.RunAt.After(time.Now()), "released jobs are due at once")
	var keptPlace bool
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT run_at = created_at FROM "`+e.schema+`".jobs WHERE id = $1`, hangs).Scan(&keptPlace))
	require.True(t, keptPlace, "a released job keeps its place in the queue (run_at unchanged)")
	info, err = e.q.Job(ctx, later)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, info.State)
	require.Equal(t, 0, info.Attempt, "nothing was claimed after shutdown began")
	require.Equal(t, 0, e.count("state = 'running'"))
}

func TestCloseStopsWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	done := make(chan error, 1)
	go func() {
		done <- e.q.Work(context.Background(), backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
			backlog.Types("x"))
	}()
	// Wait until Work is running: a job enqueued now completes.
	id, err := e.q.Enqueue(context.Background(), "x", nil)
	require.NoError(t, err)
	e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.NoError(t, e.q.Close())
	require.ErrorIs(t, <-done, backlog.ErrClosed)
	require.ErrorIs(t, e.q.Work(context.Background(), backlog.NewMux(), backlog.Types("x")), backlog.ErrClosed)
}

func TestLeaseLostStaleWorkerCannotFinish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithLease(time.Second))
	ctx := context.Background()

	staleStarted := make(chan struct{})
	staleCause := make(chan error, 1)
	staleReturn := make(chan struct{})
	var returnOnce sync.Once
	letStaleReturn := func() { returnOnce.Do(func() { close(staleReturn) }) }
	mux := backlog.NewMux()
	mux.HandleFunc("contested", func(ctx context.Context, job *backlog.Job) error {
		close(staleStarted)
		<-ctx.Done()
		staleCause <- context.Cause(ctx)
		<-staleReturn // come back only after the other worker finished
		_ = job.SetResult("stale")
		return nil
	})
	work(t, e.q, mux, backlog.Concurrency(1))
	// Registered after work's, so it runs first (cleanups run last in,
	// first out): a failed assertion must not leave the handler blocked,
	// and Work's cleanup waits for its handlers.
	t.Cleanup(letStaleReturn)
	id, err := e.q.Enqueue(ctx, "contested", nil)
	require.NoError(t, err)
	<-staleStarted

	// Another process takes the job over: expire the lease as if the first
	// worker had been cut off (a token it does not hold, so that its
	// heartbeat cannot renew it meanwhile), and sweep. The first process's
	// own sweep may get there first; either way the job becomes available.
	// Waited for: when the first process's sweep holds the row, this sweep
	// skips it (SKIP LOCKED) and returns before that one commits.
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET lease_expires_at = now() - interval '1 second',
		lease_token = gen_random_uuid() WHERE id = $1`, id)
	require.NoError(t, err)
	q2 := e.queue(e.pool, backlog.WithWorkerID("second"))
	n, err := q2.SweepExpired(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 1)
	e.waitState(id, 10*time.Second, backlog.StateAvailable)
	require.Equal(t, 1, e.countLive("id = $1 AND state = 'available'", id))
	mux2 := backlog.NewMux()
	mux2.HandleFunc("contested", func(ctx context.Context, job *backlog.Job) error {
		return job.SetResult("fresh")
	})
	work(t, q2, mux2)
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 2, info.Attempt)

	// The stale worker's heartbeat found the lease gone.
	select {
	case c := <-staleCause:
		require.ErrorIs(t, c, backlog.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("stale handler was not cancelled")
	}
	letStaleReturn()
	// Its late success changes nothing.
	require.NoError(t, e.q.Close())
	info, err = q2.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State)
	require.JSONEq(t, `"fresh"`, string(info.Result))
	require.Equal(t, 2, info.Attempt)
}

// TestNoLossNoDoubleFinish pushes 10,000 jobs through two Queues (separate
// pools, as two processes would have) with 16 workers each; every job must
// be executed and completed exactly once.
func TestNoLossNoDoubleFinish(t *testing.T) {
	t.Parallel()
	n := 10000
	if testing.Short() {
		n = 1000
	}
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `CREATE TABLE "`+e.schema+`".execs (job_id uuid NOT NULL, attempt int NOT NULL, worker text NOT NULL)`)
	require.NoError(t, err)

	specs := make([]backlog.JobSpec, n)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "count", Args: map[string]int{"i": i}}
	}
	start := time.Now()
	var ids []uuid.UUID
	for i := 0; i < n; i += 2500 {
		got, err := e.q.EnqueueMany(ctx, specs[i:min(i+2500, n)])
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	require.Len(t, ids, n)
	enqueued := time.Since(start)

	start = time.Now()
	for _, name := range []string{"a", "b"} {
		pool := testdb.NewPool(t, 8)
		q := e.queue(pool, backlog.WithWorkerID(name))
		mux := backlog.NewMux()
		mux.HandleFunc("count", func(ctx context.Context, job *backlog.Job) error {
			_, err := pool.Exec(ctx, `INSERT INTO "`+e.schema+`".execs VALUES ($1, $2, $3)`, job.ID, job.Attempt, name)
			return err
		})
		work(t, q, mux, backlog.Concurrency(16))
	}
	e.waitCount("state = 'completed'", n, 2*time.Minute)
	elapsed := time.Since(start)
	t.Logf("%d jobs: enqueued in %s (%.0f/s), worked in %s (%.0f jobs/s) by 2 queues x 16 workers",
		n, enqueued.Round(time.Millisecond), float64(n)/enqueued.Seconds(), elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())

	var execs, distinct, maxAttempt int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT job_id), max(attempt) FROM "`+e.schema+`".execs`).
		Scan(&execs, &distinct, &maxAttempt))
	require.Equal(t, n, execs, "each job executed exactly once")
	require.Equal(t, n, distinct)
	require.Equal(t, 1, maxAttempt)
	require.Equal(t, n, e.count("state = 'completed' AND attempt = 1 AND finished_at IS NOT NULL"))
	var perWorker []string
	rows, err := e.pool.Query(ctx, `SELECT worker || '=' || count(*) FROM "`+e.schema+`".execs GROUP BY worker ORDER BY worker`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		perWorker = append(perWorker, s)
	}
	require.NoError(t, rows.Err())
	t.Logf("executions per queue: %v", perWorker)
}

// TestWorkersOfOneQueueShareClaims checks that many Work calls on one Queue
// and many workers never run a job twice and the handler sees every field.
func TestHandlerSeesJobFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	got := make(chan *backlog.Job, 1)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		got <- job
		return nil
	}), backlog.Types("fields"), backlog.WorkerTags{"region": "eu", "tier": "gold"})
	id, err := e.q.Enqueue(ctx, "fields", map[string]string{"k": "v"}, backlog.Tags{"region": "eu"},
		backlog.Priority(7), backlog.MaxAttempts(4), backlog.Timeout(time.Minute))
	require.NoError(t, err)
	select {
	case j := <-got:
		require.Equal(t, id, j.ID)
		require.Equal(t, "fields", j.Type)
		require.JSONEq(t, `{"k":"v"}`, string(j.Args))
		require.Equal(t, map[string]string{"region": "eu"}, j.Tags)
		require.Equal(t, 1, j.Attempt)
		require.Equal(t, 4, j.MaxAttempts)
		require.Equal(t, 7, j.Priority)
		require.Equal(t, time.Minute, j.Timeout)
		require.False(t, j.CreatedAt.IsZero())
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not run")
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	big := make([]byte, backlog.MaxArgsBytes+1)
	for i := range big {
		big[i] = 'a'
	}
	bigJSON := append(append([]byte{'"'}, big...), '"')
	cases := []struct {
		name  string
		field string
		run   func() error
	}{
		{"empty type", "type", func() error { _, err := e.q.Enqueue(ctx, "", nil); return err }},
		{"long type", "type", func() error { _, err := e.q.Enqueue(ctx, string(big[:backlog.MaxTypeBytes+1]), nil); return err }},
		{"NUL in type", "type", func() error { _, err := e.q.Enqueue(ctx, "a\x00b", nil); return err }},
		{"NUL in tag key", "tags", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.Tags{"a\x00": "b"}); return err }},
		{"NUL in tag value", "tags", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.Tags{"a": "b\x00"}); return err }},
		{"invalid raw JSON", "args", func() error { _, err := e.q.Enqueue(ctx, "t", json.RawMessage(`{"a":`)); return err }},
		{"unmarshalable args", "args", func() error { _, err := e.q.Enqueue(ctx, "t", make(chan int)); return err }},
		{"NUL in args", "args", func() error { _, err := e.q.Enqueue(ctx, "t", "a\x00b"); return err }},
		{"oversized args", "args", func() error { _, err := e.q.Enqueue(ctx, "t", json.RawMessage(bigJSON)); return err }},
		{"negative priority", "priority", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.Priority(-1)); return err }},
		{"priority too high", "priority", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.Priority(101)); return err }},
		{"zero max attempts", "max attempts", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.MaxAttempts(0)); return err }},
		{"negative delay", "delay", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.Delay(-time.Second)); return err }},
		{"negative timeout", "timeout", func() error { _, err := e.q.Enqueue(ctx, "t", nil, backlog.Timeout(-time.Second)); return err }},
		{"one bad spec rejects the batch", "type", func() error {
			_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "ok"}, {Type: ""}})
			return err
		}},
		{"duplicate id in batch", "id", func() error {
			id := backlog.NewID()
			_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{{ID: id, Type: "ok"}, {ID: id, Type: "ok"}})
			return err
		}},
		{"empty batch", "jobs", func() error { _, err := e.q.EnqueueMany(ctx, nil); return err }},
		{"nil tx", "tx", func() error { _, err := e.q.EnqueueTx(ctx, nil, "t", nil); return err }},
		{"zero concurrency", "concurrency", func() error {
			return e.q.Work(ctx, backlog.NewMux(), backlog.Types("t"), backlog.Concurrency(0))
		}},
		{"nil handler", "handler", func() error { return e.q.Work(ctx, nil, backlog.Types("t")) }},
		{"no types", "types", func() error { return e.q.Work(ctx, backlog.NewMux()) }},
		{"NUL in worker tag", "worker tags", func() error {
			return e.q.Work(ctx, backlog.NewMux(), backlog.Types("t"), backlog.WorkerTags{"a": "\x00"})
		}},
	}
	for _, c := range cases {
		err := c.run()
		require.Error(t, err, c.name)
		require.ErrorIs(t, err, backlog.ErrInvalid, c.name)
		var ie *backlog.InputError
		require.True(t, errors.As(err, &ie), c.name)
		require.Equal(t, c.field, ie.Field, c.name)
		require.Contains(t, err.Error(), c.field, c.name)
	}
	require.Equal(t, 0, e.count("true"), "nothing was written")

	for _, schema := range []string{"", "1abc", "a-b", `a"b`, "a b", "x;drop table y"} {
		_, err := backlog.New(ctx, e.pool, backlog.WithSchema(schema))
		var ie *backlog.InputError
		require.True(t, errors.As(err, &ie), "schema %q", schema)
		require.Equal(t, "schema", ie.Field)
	}
	_, err := backlog.New(ctx, nil)
	require.ErrorIs(t, err, backlog.ErrInvalid)
}

// TestBusyProcessGivesItsBufferBack: a process whose only worker went into
// a long handler after quick ones gives back the jobs its prefetch buffer
// holds, so that another process's idle workers run them within seconds,
// not after the long handler. Before, the buffer kept them (leased, renewed)
// for as long as the handler ran: its size follows the rate measured when
// claims start, and no claim started while the worker was busy.
func TestBusyProcessGivesItsBufferBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var specs []backlog.JobSpec
	for i := range 300 {
		specs = append(specs, backlog.JobSpec{Type: "burst", Args: map[string]int{"i": i}})
	}
	specs = append(specs, backlog.JobSpec{Type: "burst", Args: map[string]bool{"long": true}})
	for i := range 30 {
		specs = append(specs, backlog.JobSpec{Type: "burst", Args: map[string]int{"tail": i}})
	}
	ids, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	long := ids[300]

	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if bytes.Contains(job.Args, []byte(`"long"`)) {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}), backlog.Types("burst"), backlog.Concurrency(1))
	t.Cleanup(letGo) // after work's, so it runs first
	e.waitState(long, 30*time.Second, backlog.StateRunning)

	// Another process with idle workers: every job after the long one runs
	// there (or ran before the long one started), within the flow watch
	// that gives the busy process's buffer back, and well before the long
	// handler ends.
	q2 := e.queue(testdb.NewPool(t, 4), backlog.WithWorkerID("idle"))
	work(t, q2, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
		backlog.Types("burst"), backlog.Concurrency(4))
	e.waitCount(`state = 'completed'`, len(specs)-1, 15*time.Second)
	info, err := e.q.Job(ctx, long)
	require.NoError(t, err)
	require.Equal(t, backlog.StateRunning, info.State, "the long handler is still running")
	letGo()
	e.waitState(long, 10*time.Second, backlog.StateCompleted)
}
