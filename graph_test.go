package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// recorder logs handler starts and ends in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
}

func (r *recorder) index(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.events {
		if e == s {
			return i
		}
	}
	return -1
}

func TestDiamondDependencies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	rec := &recorder{}
	mux := backlog.NewMux()
	mux.HandleFunc("step", func(ctx context.Context, job *backlog.Job) error {
		name := strings.Trim(string(job.Args), `"`)
		rec.add("start " + name)
		if name == "B2" {
			return backlog.Permanent(errors.New("B2 broke"))
		}
		<-time.After(time.Duration(rand.IntN(5)) * time.Millisecond) // simulated work, not a wait
		rec.add("end " + name)
		return nil
	})
	work(t, e.q, mux, backlog.Concurrency(4))

	// A → B, C → D, all in one batch, D listed first.
	a, b, c, d := backlog.NewID(), backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: d, Type: "step", Args: "D", Options: []backlog.EnqueueOption{backlog.DependsOn(b, c)}},
		{ID: b, Type: "step", Args: "B", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}},
		{ID: c, Type: "step", Args: "C", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}},
		{ID: a, Type: "step", Args: "A"},
	})
	require.NoError(t, err)
	info := e.waitState(d, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 1, info.Attempt)
	require.Less(t, rec.index("end A"), rec.index("start B"))
	require.Less(t, rec.index("end A"), rec.index("start C"))
	require.Less(t, rec.index("end B"), rec.index("start D"))
	require.Less(t, rec.index("end C"), rec.index("start D"))

	// A failed B cancels D (and D's own dependent E), naming B.
	a2, err := e.q.Enqueue(ctx, "step", "A2")
	require.NoError(t, err)
	b2, err := e.q.Enqueue(ctx, "step", "B2", backlog.DependsOn(a2))
	require.NoError(t, err)
	c2, err := e.q.Enqueue(ctx, "step", "C2", backlog.DependsOn(a2))
	require.NoError(t, err)
	d2, err := e.q.Enqueue(ctx, "step", "D2", backlog.DependsOn(b2, c2))
	require.NoError(t, err)
	e2, err := e.q.Enqueue(ctx, "step", "E2", backlog.DependsOn(d2))
	require.NoError(t, err)
	info = e.waitState(e2, 10*time.Second, backlog.StateCancelled)
	require.Contains(t, info.LastError, d2.String())
	info = e.waitState(d2, 10*time.Second, backlog.StateCancelled)
	require.Contains(t, info.LastError, "prerequisite "+b2.String()+" failed")
	require.Equal(t, 0, info.Attempt, "D2 never ran")
	require.Equal(t, -1, rec.index("start D2"))
	e.waitState(c2, 10*time.Second, backlog.StateCompleted)

	// Depending on a job that already failed cancels at once.
	late, err := e.q.Enqueue(ctx, "step", "late", backlog.DependsOn(b2))
	require.NoError(t, err)
	info, err = e.q.Job(ctx, late)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State)
	// Depending on a completed job runs at once.
	ok, err := e.q.Enqueue(ctx, "step", "ok", backlog.DependsOn(a2))
	require.NoError(t, err)
	e.waitState(ok, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 0, e.count("true AND id IN (SELECT job FROM \""+e.schema+"\".job_edges)"), "edges are consumed")
}

func TestOrderingKeySerialisesPerKey(t *testing.T) {
	t.Parallel()
	const keys = 10
	perKey := 100
	if testing.Short() {
		perKey = 20
	}
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()

	type run struct {
		key, seq, attempt int
		start, end        time.Time
	}
	var mu sync.Mutex
	var runs []run
	var running [keys]atomic.Int32
	var overlap atomic.Int32
	var maxParallel, cur atomic.Int32
	mux := backlog.NewMux()
	mux.HandleFunc("ordered", func(ctx context.Context, job *backlog.Job) error {
		var a struct{ Key, Seq int }
		if err := json.Unmarshal(job.Args, &a); err != nil {
			return err
		}
		if running[a.Key].Add(1) > 1 {
			overlap.Add(1)
		}
		n := cur.Add(1)
		raisePeak(&maxParallel, n)
		r := run{key: a.Key, seq: a.Seq, attempt: job.Attempt, start: time.Now()}
		<-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond) // simulated work, not a wait
		r.end = time.Now()
		cur.Add(-1)
		running[a.Key].Add(-1)
		mu.Lock()
		runs = append(runs, r)
		mu.Unlock()
		if a.Seq%7 == 3 && job.Attempt == 1 {
			return errors.New("transient") // retried; the key stays blocked meanwhile
		}
		if a.Seq%50 == 11 {
			return backlog.Permanent(errors.New("gives up")) // failed: must not block the key
		}
		return nil
	}, backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}))

	var specs []backlog.JobSpec
	for s := range perKey {
		for k := range keys {
			specs = append(specs, backlog.JobSpec{Type: "ordered", Args: map[string]int{"Key": k, "Seq": s},
				Options: []backlog.EnqueueOption{backlog.OrderingKey(fmt.Sprintf("account:%d", k))}})
		}
	}
	// Half in one batch, the rest one by one: both paths build the chains.
	half := len(specs) / 2
	_, err := e.q.EnqueueMany(ctx, specs[:half])
	require.NoError(t, err)
	work(t, e.q, mux, backlog.Concurrency(16))
	t0 := time.Now()
	for _, s := range specs[half:] {
		_, err := e.q.Enqueue(ctx, s.Type, s.Args, s.Options...)
		require.NoError(t, err)
	}
	t.Logf("%d single enqueues with ordering keys took %s", len(specs)-half, time.Since(t0))
	e.waitCount("state IN ('completed', 'failed')", keys*perKey, 2*time.Minute)
	t.Logf("all %d jobs finished after %s", len(specs), time.Since(t0))

	require.Zero(t, overlap.Load(), "two jobs of one key ran at once")
	require.Greater(t, maxParallel.Load(), int32(1), "keys progress in parallel")
	mu.Lock()
	defer mu.Unlock()
	last := map[int]run{}
	for _, r := range runs {
		if p, ok := last[r.key]; ok {
			require.True(t, r.seq > p.seq || (r.seq == p.seq && r.attempt > p.attempt),
				"key %d: seq %d (attempt %d) ran after seq %d (attempt %d)", r.key, r.seq, r.attempt, p.seq, p.attempt)
		}
		last[r.key] = r
	}
	require.Equal(t, 0, e.count("state = 'blocked'"))
}

// TestDependentAddedWhileFinishing races enqueueing a dependent against
// the prerequisite's finish: no dependent may be left blocked.
func TestDependentAddedWhileFinishing(t *testing.T) {
	t.Parallel()
	rounds := 1500
	if testing.Short() {
		rounds = 200
	}
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("pre", func(ctx context.Context, job *backlog.Job) error { return nil })
	mux.HandleFunc("dep", func(ctx context.Context, job *backlog.Job) error { return nil })
	work(t, e.q, mux, backlog.Concurrency(8))

	withDeps := 0 // dependents that arrived while their prerequisite was unfinished
	// The jitter spans about twice the time a prerequisite takes to
	// finish, measured every 16th round (which waits for it): on a loaded
	// machine that is far longer than on a quiet one, and a fixed span
	// would land every dependent before the finish.
	span := 3 * time.Millisecond
	// Up to rounds rounds, or 30 s once 200 are done: a busy machine runs
	// fewer, each as sharp.
	budget := time.Now().Add(30 * time.Second)
	for r := range rounds {
		if r >= 200 && time.Now().After(budget) {
			rounds = r
			break
		}
		enqueued := time.Now()
		pre, err := e.q.Enqueue(ctx, "pre", nil)
		require.NoError(t, err)
		if r%16 == 15 {
			e.waitState(pre, 30*time.Second, backlog.StateCompleted)
			span = max(3*time.Millisecond, (span+2*time.Since(enqueued))/2)
		} else {
			// Jitter (not a wait): lands the dependent's enqueue before,
			// during or after the prerequisite's finish.
			<-time.After(rand.N(span))
		}
		res, err := e.q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "dep", Options: []backlog.EnqueueOption{backlog.DependsOn(pre)}}})
		require.NoError(t, err)
		var blocked bool
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT COALESCE((SELECT blocked_by > 0 OR state = 'blocked' FROM "`+e.schema+`".jobs WHERE id = $1), false)`, res[0].ID).Scan(&blocked))
		if blocked {
			withDeps++
		}
	}
	e.waitCount("type = 'dep' AND state = 'completed'", rounds, 2*time.Minute)
	require.Equal(t, 0, e.count("state = 'blocked'"))
	t.Logf("%d rounds: %d prerequisites were unfinished when their dependent was added, %d had finished",
		rounds, withDeps, rounds-withDeps)
	require.Positive(t, withDeps, "the race was exercised from one side")
	require.Positive(t, rounds-withDeps, "the race was exercised from the other side")
}

func TestCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	started := make(chan uuid.UUID, 4)
	causes := make(chan error, 4)
	mux := backlog.NewMux()
	mux.HandleFunc("long", func(ctx context.Context, job *backlog.Job) error {
		started <- job.ID
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	})
	work(t, e.q, mux, backlog.Types("long"), backlog.Concurrency(2))

	// Available (nobody works "queued"), with a dependent that is blocked.
	queued, err := e.q.Enqueue(ctx, "queued", nil)
	require.NoError(t, err)
	dependent, err := e.q.Enqueue(ctx, "queued", nil, backlog.DependsOn(queued))
	require.NoError(t, err)
	blocked, err := e.q.Enqueue(ctx, "queued", nil, backlog.DependsOn(dependent))
	require.NoError(t, err)
	st, err := e.q.Cancel(ctx, blocked)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, st)
	st, err = e.q.Cancel(ctx, queued)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, st)
	info, err := e.q.Job(ctx, dependent)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State, "cancel cascades to dependents")
	require.Contains(t, info.LastError, queued.String())

	// Running: the handler observes ctx.Done with cause ErrCancelled.
	running, err := e.q.Enqueue(ctx, "long", nil)
	require.NoError(t, err)
	require.Equal(t, running, <-started)
	t0 := time.Now()
	st, err = e.q.Cancel(ctx, running)
	require.NoError(t, err)
	require.Equal(t, backlog.StateRunning, st)
	select {
	case c := <-causes:
		require.ErrorIs(t, c, backlog.ErrCancelled)
		t.Logf("running handler cancelled %s after Cancel", time.Since(t0))
	case <-time.After(5 * time.Second):
		t.Fatal("running handler was not cancelled")
	}
	info = e.waitState(running, 10*time.Second, backlog.StateCancelled)
	require.Contains(t, info.LastError, "cancelled")

	// Finished: a no-op reporting the state.
	st, err = e.q.Cancel(ctx, running)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, st)
	_, err = e.q.Cancel(ctx, backlog.NewID())
	require.ErrorIs(t, err, backlog.ErrNotFound)
}

func TestUniqueKeyUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	const n = 50
	results := make(chan backlog.Inserted, n)
	errs := make(chan error, n)
	var start sync.WaitGroup
	start.Add(1)
	for range n {
		go func() {
			start.Wait()
			res, err := e.q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "once", Options: []backlog.EnqueueOption{backlog.UniqueKey("nightly-report")}}})
			if err != nil {
				errs <- err
				return
			}
			results <- res[0]
		}()
	}
	start.Done()
	var ids = map[uuid.UUID]int{}
	dups := 0
	for range n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case r := <-results:
			ids[r.ID]++
			if r.Duplicate {
				dups++
			}
		}
	}
	require.Len(t, ids, 1, "every caller got the same job")
	require.Equal(t, n-1, dups)
	require.Equal(t, 1, e.count("unique_key = 'nightly-report'"))

	// Once the job has finished, the key is free again.
	var first uuid.UUID
	for id := range ids {
		first = id
	}
	_, err := e.q.Cancel(ctx, first)
	require.NoError(t, err)
	again, err := e.q.Enqueue(ctx, "once", nil, backlog.UniqueKey("nightly-report"))
	require.NoError(t, err)
	require.NotEqual(t, first, again)
}

func TestWaitReturnsWhenJobFinishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	release := make(chan struct{})
	mux := backlog.NewMux()
	mux.HandleFunc("slowish", func(ctx context.Context, job *backlog.Job) error {
		<-release
		return job.SetResult(42)
	})
	q2 := e.queue(e.pool) // the waiter is another Queue (process)
	id, err := e.q.Enqueue(ctx, "slowish", nil)
	require.NoError(t, err)
	got := make(chan *backlog.JobInfo, 1)
	go func() {
		info, err := q2.Wait(ctx, id)
		if err != nil {
			t.Error(err)
		}
		got <- info
	}()
	work(t, e.q, mux)
	close(release)
	select {
	case info := <-got:
		require.Equal(t, backlog.StateCompleted, info.State)
		require.JSONEq(t, "42", string(info.Result))
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	_, err = q2.Wait(ctx, backlog.NewID())
	require.ErrorIs(t, err, backlog.ErrNotFound)
	info, err := q2.Wait(ctx, id) // already finished
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State)
}

func TestGraphBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	x, y, z := backlog.NewID(), backlog.NewID(), backlog.NewID()
	long := strings.Repeat("k", backlog.MaxKeyBytes+1)
	cases := []struct {
		name, field string
		specs       []backlog.JobSpec
	}{
		{"unknown dependency", "depends on", []backlog.JobSpec{{Type: "t", Options: []backlog.EnqueueOption{backlog.DependsOn(backlog.NewID())}}}},
		{"self-dependency", "depends on", []backlog.JobSpec{{ID: x, Type: "t", Options: []backlog.EnqueueOption{backlog.DependsOn(x)}}}},
		{"cycle in batch", "depends on", []backlog.JobSpec{
			{ID: x, Type: "t", Options: []backlog.EnqueueOption{backlog.DependsOn(z)}},
			{ID: y, Type: "t", Options: []backlog.EnqueueOption{backlog.DependsOn(x)}},
			{ID: z, Type: "t", Options: []backlog.EnqueueOption{backlog.DependsOn(y)}},
		}},
		{"over-long ordering key", "ordering key", []backlog.JobSpec{{Type: "t", Options: []backlog.EnqueueOption{backlog.OrderingKey(long)}}}},
		{"over-long unique key", "unique key", []backlog.JobSpec{{Type: "t", Options: []backlog.EnqueueOption{backlog.UniqueKey(long)}}}},
		{"NUL in ordering key", "ordering key", []backlog.JobSpec{{Type: "t", Options: []backlog.EnqueueOption{backlog.OrderingKey("a\x00")}}}},
		{"NUL in unique key", "unique key", []backlog.JobSpec{{Type: "t", Options: []backlog.EnqueueOption{backlog.UniqueKey("a\x00")}}}},
		{"nil dependency", "depends on", []backlog.JobSpec{{Type: "t", Options: []backlog.EnqueueOption{backlog.DependsOn(uuid.Nil)}}}},
	}
	for _, c := range cases {
		_, err := e.q.EnqueueMany(ctx, c.specs)
		require.ErrorIs(t, err, backlog.ErrInvalid, c.name)
		var ie *backlog.InputError
		require.True(t, errors.As(err, &ie), c.name)
		require.Equal(t, c.field, ie.Field, c.name)
	}
	// Unknown dependency inside the caller's transaction writes nothing either.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = e.q.EnqueueTx(ctx, tx, "t", nil, backlog.DependsOn(backlog.NewID()))
	require.ErrorIs(t, err, backlog.ErrInvalid)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 0, e.count("true"), "nothing was written")
}

// TestSweepReleasesDependents: a job whose worker died with its last
// attempt fails by the sweep, and its dependents are cancelled in the same
// transaction.
func TestSweepReleasesDependents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	started := make(chan struct{})
	mux := backlog.NewMux()
	mux.HandleFunc("dies", func(ctx context.Context, job *backlog.Job) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	work(t, e.q, mux, backlog.Concurrency(1), backlog.GracePeriod(50*time.Millisecond))
	a, err := e.q.Enqueue(ctx, "dies", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	b, err := e.q.Enqueue(ctx, "after", nil, backlog.DependsOn(a))
	require.NoError(t, err)
	plain, err := e.q.Enqueue(ctx, "dies", nil) // expires too, no dependents
	require.NoError(t, err)
	<-started
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET state = 'running', attempt = 1,
		lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second' WHERE id IN ($1, $2)`, a, plain)
	require.NoError(t, err)
	// The working queue's own sweep may get there first: either way, both
	// expired leases end.
	q2 := e.queue(e.pool)
	_, err = q2.SweepExpired(ctx)
	require.NoError(t, err)
	for deadline := time.Now().Add(10 * time.Second); e.countLive(`id IN ($1, $2) AND state = 'running' AND lease_expires_at < now()`, a, plain) > 0; {
		require.False(t, time.Now().After(deadline), "expired leases not swept within 10 s")
		<-time.After(10 * time.Millisecond)
	}
	info, err := e.q.Job(ctx, a)
	require.NoError(t, err)
	require.Equal(t, backlog.StateFailed, info.State)
	require.Contains(t, info.LastError, "lease expired")
	info, err = e.q.Job(ctx, b)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State)
	require.Contains(t, info.LastError, a.String())
}

// TestOrderingKeyBehindRunningPredecessor: a job enqueued with the key of a
// running job is blocked behind it, stays blocked through that job's
// failed attempt and retry, and runs only after it completed. From Go and
// from SQL's enqueue(). (A running tail taken for no tail makes the new
// job available at once: only the unique index of running jobs per key
// would then stand between the two.)
func TestOrderingKeyBehindRunningPredecessor(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"Go", "SQL"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, backlog.WithPollInterval(time.Hour))
			ctx := context.Background()
			events := make(chan string, 16)
			proceed := make(chan struct{}) // ends A's current attempt
			mux := backlog.NewMux()
			mux.HandleFunc("ord", func(ctx context.Context, job *backlog.Job) error {
				name := strings.Trim(string(job.Args), `"`)
				events <- fmt.Sprintf("start %s %d", name, job.Attempt)
				if name == "A" {
					select {
					case <-proceed:
					case <-ctx.Done():
						return ctx.Err()
					}
					if job.Attempt == 1 {
						return errors.New("A's first attempt fails")
					}
				}
				events <- fmt.Sprintf("end %s %d", name, job.Attempt)
				return nil
			}, backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}))
			work(t, e.q, mux, backlog.Concurrency(4))
			next := func(want string) {
				t.Helper()
				select {
				case got := <-events:
					require.Equal(t, want, got)
				case <-time.After(20 * time.Second):
					t.Fatalf("no %q", want)
				}
			}
			blocked := func(b, a uuid.UUID) {
				t.Helper()
				info, err := e.q.Job(ctx, b)
				require.NoError(t, err)
				require.Equal(t, backlog.StateBlocked, info.State, "B must wait while A is live")
				require.Equal(t, 1, e.countLive(`id = $1 AND blocked_by = 1 AND id IN (SELECT job FROM "`+e.schema+`".job_edges
					WHERE prereq = $2 AND kind = 'order')`, b, a), "B follows A in the key's chain")
			}

			a, err := e.q.Enqueue(ctx, "ord", "A", backlog.OrderingKey("k"))
			require.NoError(t, err)
			next("start A 1")
			var b uuid.UUID
			if via == "Go" {
				b, err = e.q.Enqueue(ctx, "ord", "B", backlog.OrderingKey("k"))
			} else {
				b, err = e.sqlEnqueue(e.pool, `'ord', '"B"', ordering_key => 'k'`)
			}
			require.NoError(t, err)
			blocked(b, a)
			proceed <- struct{}{} // A's first attempt fails: A is retried
			next("start A 2")
			blocked(b, a)
			proceed <- struct{}{}
			next("end A 2")
			next("start B 1")
			next("end B 1")
			e.waitState(b, 10*time.Second, backlog.StateCompleted)
			info := e.waitState(a, 10*time.Second, backlog.StateCompleted)
			require.Equal(t, 2, info.Attempt)
		})
	}
}
