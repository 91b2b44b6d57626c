package backlog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// retryRig runs a worker for retrying DAGs by hand (docs/api-tour.md's "retry
// them too"): "pre" fails while failPre is set, else reports that it runs
// and waits for gate before it completes with its ID as its result; "val"
// waits for valGate and completes the same way; "dep" records the
// prerequisites it sees, and fails when one of them has not completed.
type retryRig struct {
	e       *env
	failPre atomic.Bool
	gate    chan struct{}
	valGate chan struct{}
	started chan uuid.UUID

	mu   sync.Mutex
	seen map[uuid.UUID][]backlog.Prerequisite
	ids  map[uuid.UUID][]uuid.UUID
}

type fromResult struct{ From uuid.UUID }

func newRetryRig(t *testing.T) *retryRig {
	r := &retryRig{e: newEnv(t), gate: make(chan struct{}), valGate: make(chan struct{}), started: make(chan uuid.UUID, 16),
		seen: map[uuid.UUID][]backlog.Prerequisite{}, ids: map[uuid.UUID][]uuid.UUID{}}
	r.failPre.Store(true)
	complete := func(ctx context.Context, job *backlog.Job, gate chan struct{}) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return job.SetResult(fromResult{From: job.ID})
	}
	mux := backlog.NewMux()
	mux.HandleFunc("pre", func(ctx context.Context, job *backlog.Job) error {
		if r.failPre.Load() {
			return backlog.Permanent(errors.New("pre: down"))
		}
		r.started <- job.ID
		return complete(ctx, job, r.gate)
	})
	mux.HandleFunc("val", func(ctx context.Context, job *backlog.Job) error { return complete(ctx, job, r.valGate) })
	mux.HandleFunc("dep", func(ctx context.Context, job *backlog.Job) error {
		ps, err := job.Prerequisites(ctx)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.seen[job.ID], r.ids[job.ID] = ps, job.PrerequisiteIDs()
		r.mu.Unlock()
		for _, p := range ps {
			if p.State != backlog.StateCompleted {
				return backlog.Permanent(fmt.Errorf("ran while prerequisite %s was %q", p.ID, p.State))
			}
		}
		return nil
	})
	work(t, r.e.q, mux, backlog.Concurrency(4))
	return r
}

// requireSaw checks that dependent d ran once, after every one of prereqs
// completed, and read each one's result.
func (r *retryRig) requireSaw(d uuid.UUID, prereqs ...uuid.UUID) {
	r.e.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	want := slices.Clone(prereqs)
	slices.SortFunc(want, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	ids := slices.Clone(r.ids[d])
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	require.Equal(r.e.t, want, ids, "the dependent lists its prerequisites")
	require.Len(r.e.t, r.seen[d], len(prereqs))
	for _, p := range r.seen[d] {
		require.Equal(r.e.t, backlog.StateCompleted, p.State, "prerequisite %s", p.ID)
		var res fromResult
		require.NoError(r.e.t, json.Unmarshal(p.Result, &res))
		require.Equal(r.e.t, p.ID, res.From, "the prerequisite's result")
	}
}

// requireBlockedOn checks that job d is blocked and waits for exactly the
// given prerequisites (its live ones: Graph lists the finished ones too).
func (r *retryRig) requireBlockedOn(d uuid.UUID, prereqs ...uuid.UUID) {
	r.e.t.Helper()
	info, err := r.e.q.Job(context.Background(), d)
	require.NoError(r.e.t, err)
	require.Equal(r.e.t, backlog.StateBlocked, info.State, "the dependent waits while its prerequisite runs")
	g, err := r.e.q.Graph(context.Background(), d)
	require.NoError(r.e.t, err)
	var got []uuid.UUID
	for _, n := range g.Prerequisites {
		if !n.State.Terminal() {
			got = append(got, n.ID)
		}
	}
	require.ElementsMatch(r.e.t, prereqs, got, "its edges are back")
}

func (r *retryRig) runningPre(within time.Duration) uuid.UUID {
	r.e.t.Helper()
	select {
	case id := <-r.started:
		return id
	case <-time.After(within):
		r.e.t.Fatal("the retried prerequisite did not start")
		return uuid.Nil
	}
}

// failedDAG enqueues a prerequisite that fails and a dependent of it,
// and waits until the dependent is cancelled.
func (r *retryRig) failedDAG() (pre, dep uuid.UUID) {
	r.e.t.Helper()
	ctx := context.Background()
	pre, err := r.e.q.Enqueue(ctx, "pre", nil, backlog.MaxAttempts(1))
	require.NoError(r.e.t, err)
	dep, err = r.e.q.Enqueue(ctx, "dep", nil, backlog.DependsOn(pre))
	require.NoError(r.e.t, err)
	r.e.waitState(pre, 10*time.Second, backlog.StateFailed)
	r.e.waitState(dep, 10*time.Second, backlog.StateCancelled)
	return pre, dep
}

// The advice of docs/dags.md, followed with RetryWhere: the failed prerequisite
// and its cancelled dependent are retried in one call; the dependent
// waits for the prerequisite, which runs and completes, then runs and
// reads its result.
func TestRetryWhereRunsTheDependentAfterItsPrerequisite(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	pre, dep := r.failedDAG()

	r.failPre.Store(false)
	n, err := r.e.q.RetryWhere(ctx, backlog.Filter{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, pre, r.runningPre(10*time.Second))
	r.requireBlockedOn(dep, pre)

	close(r.gate)
	r.e.waitState(pre, 10*time.Second, backlog.StateCompleted)
	r.e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	r.requireSaw(dep, pre)
}

// Retry of the dependent alone while its prerequisite is still failed is
// refused (it would wait for nothing that can end); once the prerequisite
// is retried, the dependent waits for it, in separate calls and in either
// order. A second prerequisite that completed after the dependent was
// cancelled is still one of its prerequisites: its result is given to it.
func TestRetryDependentInSeparateCalls(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	pre, err := r.e.q.Enqueue(ctx, "pre", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	val, err := r.e.q.Enqueue(ctx, "val", nil)
	require.NoError(t, err)
	dep, err := r.e.q.Enqueue(ctx, "dep", nil, backlog.DependsOn(pre, val))
	require.NoError(t, err)
	r.e.waitState(dep, 10*time.Second, backlog.StateCancelled)
	close(r.valGate) // val completes after its dependent was cancelled
	r.e.waitState(val, 10*time.Second, backlog.StateCompleted)

	_, err = r.e.q.Retry(ctx, dep)
	require.ErrorIs(t, err, backlog.ErrPrerequisiteFailed)
	require.ErrorContains(t, err, pre.String())
	n, err := r.e.q.RetryWhere(ctx, backlog.Filter{IDs: []uuid.UUID{dep}})
	require.NoError(t, err)
	require.Zero(t, n, "skipped: its prerequisite is not retried")
	info, err := r.e.q.Job(ctx, dep)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State)

	r.failPre.Store(false)
	st, err := r.e.q.Retry(ctx, pre)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, st)
	require.Equal(t, pre, r.runningPre(10*time.Second))
	st, err = r.e.q.Retry(ctx, dep)
	require.NoError(t, err)
	require.Equal(t, backlog.StateBlocked, st)
	r.requireBlockedOn(dep, pre)

	close(r.gate)
	r.e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	r.requireSaw(dep, pre, val)
}

// A dependent retried first, then its prerequisite (the prerequisite
// retried while queued, before any worker took it): the dependent waits.
func TestRetryDependentOfARetriedQueuedPrerequisite(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	pre, dep := r.failedDAG()
	r.failPre.Store(false)
	require.NoError(t, r.e.q.Pause(ctx, "pre"))
	st, err := r.e.q.Retry(ctx, pre)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, st)
	st, err = r.e.q.Retry(ctx, dep)
	require.NoError(t, err)
	require.Equal(t, backlog.StateBlocked, st)
	r.requireBlockedOn(dep, pre)
	require.NoError(t, r.e.q.Resume(ctx, "pre"))
	require.Equal(t, pre, r.runningPre(10*time.Second))
	r.requireBlockedOn(dep, pre)
	close(r.gate)
	r.e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	r.requireSaw(dep, pre)
}

// RetryWhere keeps the graph's order whatever order it visits the jobs
// in: here dependents come first in the listing (lower IDs, the same
// finish time) and the prerequisite takes the one-at-a-time path (an
// ordering key), over a chain of three.
func TestRetryWhereVisitingDependentsFirst(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	ids := []uuid.UUID{backlog.NewID(), backlog.NewID(), backlog.NewID()}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	last, mid, pre := ids[0], ids[1], ids[2]
	_, err := r.e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: pre, Type: "pre", Options: []backlog.EnqueueOption{backlog.MaxAttempts(1), backlog.OrderingKey("pre")}},
		{ID: mid, Type: "dep", Options: []backlog.EnqueueOption{backlog.DependsOn(pre)}},
		{ID: last, Type: "dep", Options: []backlog.EnqueueOption{backlog.DependsOn(mid)}},
	})
	require.NoError(t, err)
	r.e.waitState(last, 10*time.Second, backlog.StateCancelled)

	r.failPre.Store(false)
	n, err := r.e.q.RetryWhere(ctx, backlog.Filter{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, pre, r.runningPre(10*time.Second))
	r.requireBlockedOn(mid, pre)
	r.requireBlockedOn(last, mid)
	close(r.gate)
	r.e.waitState(last, 10*time.Second, backlog.StateCompleted)
	r.mu.Lock()
	require.Equal(t, []uuid.UUID{pre}, r.ids[mid])
	require.Equal(t, []uuid.UUID{mid}, r.ids[last])
	r.mu.Unlock()
}

// A dependent enqueued from SQL (enqueue()) keeps its prerequisites too.
func TestRetrySQLEnqueuedDependent(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	pre, err := r.e.q.Enqueue(ctx, "pre", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	val, err := r.e.q.Enqueue(ctx, "val", nil)
	require.NoError(t, err)
	var dep uuid.UUID
	require.NoError(t, r.e.pool.QueryRow(ctx, `SELECT "`+r.e.schema+`".enqueue('dep', depends_on => $1)`,
		[]uuid.UUID{pre, val}).Scan(&dep))
	r.e.waitState(dep, 10*time.Second, backlog.StateCancelled)
	close(r.valGate)
	r.e.waitState(val, 10*time.Second, backlog.StateCompleted)

	r.failPre.Store(false)
	n, err := r.e.q.RetryWhere(ctx, backlog.Filter{States: []backlog.State{backlog.StateFailed, backlog.StateCancelled}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, pre, r.runningPre(10*time.Second))
	r.requireBlockedOn(dep, pre)
	close(r.gate)
	r.e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	r.requireSaw(dep, pre, val)
}

// A dependent cancelled by hand while its prerequisite ran, retried while
// that prerequisite still runs, waits for it (its edge was never
// consumed: it is counted once).
func TestRetryCancelledDependentOfARunningPrerequisite(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	r.failPre.Store(false)
	pre, err := r.e.q.Enqueue(ctx, "pre", nil)
	require.NoError(t, err)
	dep, err := r.e.q.Enqueue(ctx, "dep", nil, backlog.DependsOn(pre))
	require.NoError(t, err)
	require.Equal(t, pre, r.runningPre(10*time.Second))
	st, err := r.e.q.Cancel(ctx, dep)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, st)
	n, err := r.e.q.RetryWhere(ctx, backlog.Filter{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r.requireBlockedOn(dep, pre)
	close(r.gate)
	r.e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	r.requireSaw(dep, pre)
}

// Retried jobs of an ordering key take their place at the end of the
// key's queue: behind its live job, one at a time, never beside each
// other or beside the live job.
func TestRetryWhereKeepsTheOrderingKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	gate := make(chan struct{})
	var running, most atomic.Int32
	var mu sync.Mutex
	var order []uuid.UUID
	mux := backlog.NewMux()
	mux.HandleFunc("keyed", func(ctx context.Context, job *backlog.Job) error {
		n := running.Add(1)
		defer running.Add(-1)
		raisePeak(&most, n)
		if fail.Load() {
			return backlog.Permanent(errors.New("down"))
		}
		mu.Lock()
		order = append(order, job.ID)
		mu.Unlock()
		var args struct{ Hold bool }
		if err := json.Unmarshal(job.Args, &args); err != nil {
			return err
		}
		if args.Hold {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	work(t, e.q, mux, backlog.Concurrency(4))
	var failed []uuid.UUID
	for range 3 {
		id, err := e.q.Enqueue(ctx, "keyed", nil, backlog.OrderingKey("k"), backlog.MaxAttempts(1))
		require.NoError(t, err)
		failed = append(failed, id)
	}
	for _, id := range failed {
		e.waitState(id, 10*time.Second, backlog.StateFailed)
	}
	fail.Store(false)
	head, err := e.q.Enqueue(ctx, "keyed", map[string]bool{"Hold": true}, backlog.OrderingKey("k"))
	require.NoError(t, err)
	e.waitState(head, 10*time.Second, backlog.StateRunning)

	n, err := e.q.RetryWhere(ctx, backlog.Filter{OrderingKey: "k"})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for _, id := range failed {
		info, err := e.q.Job(ctx, id)
		require.NoError(t, err)
		require.Equal(t, backlog.StateBlocked, info.State, "behind the key's running job")
	}
	close(gate)
	for _, id := range failed {
		e.waitState(id, 10*time.Second, backlog.StateCompleted)
	}
	require.EqualValues(t, 1, most.Load(), "one job of the key at a time")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, head, order[0])
	require.ElementsMatch(t, failed, order[1:])
}

// A job of an ordering key cancelled while it waited in the chain, and
// retried while the job it waited for still runs, goes to the end of the
// key's queue: it does not run when the job it used to wait for ends,
// but after the job that was behind it.
func TestRetryOfACancelledChainMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	gates := map[string]chan struct{}{"x": make(chan struct{}), "s": make(chan struct{})}
	started := make(chan string, 4)
	mux := backlog.NewMux()
	mux.HandleFunc("keyed", func(ctx context.Context, job *backlog.Job) error {
		var args struct{ Name string }
		if err := json.Unmarshal(job.Args, &args); err != nil {
			return err
		}
		started <- args.Name
		if g := gates[args.Name]; g != nil {
			select {
			case <-g:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	work(t, e.q, mux, backlog.Concurrency(4))
	enq := func(name string) uuid.UUID {
		id, err := e.q.Enqueue(ctx, "keyed", map[string]string{"Name": name}, backlog.OrderingKey("k"))
		require.NoError(t, err)
		return id
	}
	next := func() string {
		select {
		case n := <-started:
			return n
		case <-time.After(10 * time.Second):
			t.Fatal("no job of the key started")
			return ""
		}
	}
	x := enq("x")
	require.Equal(t, "x", next())
	k, s := enq("k"), enq("s")
	st, err := e.q.Cancel(ctx, k)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, st)
	st, err = e.q.Retry(ctx, k)
	require.NoError(t, err)
	require.Equal(t, backlog.StateBlocked, st)

	close(gates["x"])
	e.waitState(x, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, "s", next())
	info, err := e.q.Job(ctx, k)
	require.NoError(t, err)
	require.Equal(t, backlog.StateBlocked, info.State, "behind s, which runs")
	close(gates["s"])
	require.Equal(t, "k", next())
	e.waitState(s, 10*time.Second, backlog.StateCompleted)
	e.waitState(k, 10*time.Second, backlog.StateCompleted)
}

// A dependent enqueued by a version before migration 0018 lists only the
// prerequisites that completed (here none): the reason of its
// cancellation names the one that failed, and its retry waits for it.
func TestRetryDependentEnqueuedByAnEarlierVersion(t *testing.T) {
	t.Parallel()
	r := newRetryRig(t)
	ctx := context.Background()
	pre, dep := r.failedDAG()
	for _, table := range []string{"jobs", "job_history"} {
		_, err := r.e.pool.Exec(ctx, `UPDATE "`+r.e.schema+`".`+table+` SET prereqs = NULL WHERE id = $1`, dep)
		require.NoError(t, err)
	}
	r.failPre.Store(false)
	n, err := r.e.q.RetryWhere(ctx, backlog.Filter{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, pre, r.runningPre(10*time.Second))
	r.requireBlockedOn(dep, pre)
	close(r.gate)
	r.e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	r.requireSaw(dep, pre)
}

// Retries of failed DAGs by hand racing the workers, each other and a
// RetryWhere: prerequisites and dependents retried in either order, some
// of them on shared ordering keys. Every dependent runs once its
// prerequisite completed, sees its result, and everything completes; no
// deadlock, no claim failing.
func TestRetryDAGsRacingTheWorkers(t *testing.T) {
	t.Parallel()
	rec := &logRecorder{}
	e := newEnv(t, backlog.WithLogger(slog.New(rec)))
	ctx := context.Background()
	var bad atomic.Int64
	var badMsg atomic.Value
	mux := backlog.NewMux()
	mux.HandleFunc("p", func(ctx context.Context, job *backlog.Job) error {
		if job.Attempt == 1 {
			return backlog.Permanent(errors.New("first attempt fails"))
		}
		<-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond) // the handler's work
		return job.SetResult(fromResult{From: job.ID})
	})
	mux.HandleFunc("d", func(ctx context.Context, job *backlog.Job) error {
		ps, err := job.Prerequisites(ctx)
		if err != nil {
			return err
		}
		if len(ps) != 1 || ps[0].State != backlog.StateCompleted || !strings.Contains(string(ps[0].Result), ps[0].ID.String()) {
			bad.Add(1)
			badMsg.Store(fmt.Sprintf("%s ran with %+v", job.ID, ps))
		}
		return nil
	})
	work(t, e.q, mux, backlog.Concurrency(8))
	const n = 40
	pre, dep := make([]uuid.UUID, n), make([]uuid.UUID, n)
	for i := range n {
		var err error
		pre[i], err = e.q.Enqueue(ctx, "p", nil, backlog.MaxAttempts(1))
		require.NoError(t, err)
		var opts []backlog.EnqueueOption
		if i%2 == 0 {
			opts = append(opts, backlog.OrderingKey(fmt.Sprint("k", i%3)))
		}
		dep[i], err = e.q.Enqueue(ctx, "d", nil, append(opts, backlog.DependsOn(pre[i]))...)
		require.NoError(t, err)
	}
	for i := range n {
		e.waitState(dep[i], 20*time.Second, backlog.StateCancelled)
	}
	errs := make(chan error, 3*n+1)
	var wg sync.WaitGroup
	retry := func(id uuid.UUID) error {
		_, err := e.q.Retry(ctx, id)
		if errors.Is(err, backlog.ErrBlocked) || errors.Is(err, backlog.ErrRunning) {
			return nil // retried meanwhile by another caller
		}
		return err
	}
	for i := range n {
		wg.Go(func() {
			<-time.After(time.Duration(rand.IntN(5000)) * time.Microsecond) // spread the calls
			if i%2 == 0 {
				// The dependent first: refused, or (when the RetryWhere
				// retried the prerequisite meanwhile) waiting.
				if err := retry(dep[i]); err != nil && !errors.Is(err, backlog.ErrPrerequisiteFailed) {
					errs <- err
				}
			}
			if err := retry(pre[i]); err != nil {
				errs <- err
			}
			if err := retry(dep[i]); err != nil {
				errs <- err
			}
		})
	}
	wg.Go(func() {
		if _, err := e.q.RetryWhere(ctx, backlog.Filter{}); err != nil {
			errs <- err
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range n {
		e.waitState(dep[i], 30*time.Second, backlog.StateCompleted)
	}
	require.Zero(t, bad.Load(), "%v", badMsg.Load())
	require.Empty(t, rec.matching("deadlock"))
	require.Empty(t, rec.matching("claiming jobs failed"))
}

// attemptResult is a prerequisite's result naming the attempt that wrote
// it.
type attemptResult struct {
	From    uuid.UUID
	Attempt int
}

// blockedBehind waits until a statement of another session waits for a
// lock that tx's session holds.
func (e *env) blockedBehind(tx pgx.Tx, within time.Duration) {
	e.t.Helper()
	var pid int
	require.NoError(e.t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		require.NoError(e.t, e.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n))
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no statement waited for session %d within %s", pid, within)
		}
		<-tick.C
	}
}

// prerequisiteRig runs "p" (its result names its attempt) and "d" (it
// records what it read of its one prerequisite).
type prerequisiteRig struct {
	e    *env
	mu   sync.Mutex
	seen map[uuid.UUID]backlog.Prerequisite
}

func newPrerequisiteRig(t *testing.T) *prerequisiteRig {
	r := &prerequisiteRig{e: newEnv(t), seen: map[uuid.UUID]backlog.Prerequisite{}}
	mux := backlog.NewMux()
	mux.HandleFunc("p", func(ctx context.Context, job *backlog.Job) error {
		if job.Attempt == 1 && strings.Contains(string(job.Args), "fail") {
			return backlog.Permanent(errors.New("first attempt fails"))
		}
		return job.SetResult(attemptResult{From: job.ID, Attempt: job.Attempt})
	})
	mux.HandleFunc("d", func(ctx context.Context, job *backlog.Job) error {
		ps, err := job.Prerequisites(ctx)
		if err != nil || len(ps) != 1 {
			return backlog.Permanent(fmt.Errorf("prerequisites: %v %v", ps, err))
		}
		r.mu.Lock()
		r.seen[job.ID] = ps[0]
		r.mu.Unlock()
		return nil
	})
	work(t, r.e.q, mux, backlog.Concurrency(4))
	return r
}

// requireRead checks that dependent d completed after reading the result
// of its prerequisite's attempt.
func (r *prerequisiteRig) requireRead(d uuid.UUID, attempt int) {
	r.e.t.Helper()
	r.e.waitState(d, 20*time.Second, backlog.StateCompleted)
	r.mu.Lock()
	p := r.seen[d]
	r.mu.Unlock()
	require.Equal(r.e.t, backlog.StateCompleted, p.State, "the prerequisite as the dependent read it: %+v", p)
	var res attemptResult
	require.NoError(r.e.t, json.Unmarshal(p.Result, &res))
	require.Equal(r.e.t, attemptResult{From: p.ID, Attempt: attempt}, res, "the result the dependent was given")
}

// A dependent enqueued when its prerequisite had completed is given that
// result, even when the prerequisite is retried (its result cleared)
// while the enqueue is still under way: here the enqueue waits for
// another transaction holding its unique key.
func TestRetryOfACompletedPrerequisiteDuringAnEnqueue(t *testing.T) {
	t.Parallel()
	r := newPrerequisiteRig(t)
	e, ctx := r.e, context.Background()
	p, err := e.q.Enqueue(ctx, "p", nil)
	require.NoError(t, err)
	e.waitState(p, 10*time.Second, backlog.StateCompleted)

	holder, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = e.q.EnqueueTx(ctx, holder, "d", nil, backlog.UniqueKey("u"), backlog.RunAt(time.Now().Add(time.Hour)))
	require.NoError(t, err)
	type res struct {
		id  uuid.UUID
		err error
	}
	done := make(chan res, 1)
	go func() {
		id, err := e.q.Enqueue(ctx, "d", nil, backlog.DependsOn(p), backlog.UniqueKey("u"))
		done <- res{id, err}
	}()
	e.blockedBehind(holder, 10*time.Second)
	// The enqueue has read p as completed and holds KEY SHARE on it; the
	// retry does not wait for that.
	st, err := e.q.Retry(ctx, p)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, st)
	require.NoError(t, holder.Rollback(ctx))
	got := <-done
	require.NoError(t, got.err)
	r.requireRead(got.id, 1)
	e.waitJob(p, 20*time.Second, func(i *backlog.JobInfo) bool { return i.State == backlog.StateCompleted && i.Attempt == 2 })
}

// The same for a dependent retried by hand: it is given the result its
// prerequisite had when the retry read it, whatever a retry of the
// prerequisite does meanwhile.
func TestRetryOfACompletedPrerequisiteDuringARetryOfItsDependent(t *testing.T) {
	t.Parallel()
	r := newPrerequisiteRig(t)
	e, ctx := r.e, context.Background()
	p, err := e.q.Enqueue(ctx, "p", json.RawMessage(`"fail"`), backlog.MaxAttempts(1))
	require.NoError(t, err)
	d, err := e.q.Enqueue(ctx, "d", nil, backlog.DependsOn(p))
	require.NoError(t, err)
	e.waitState(d, 10*time.Second, backlog.StateCancelled)
	_, err = e.q.Retry(ctx, p)
	require.NoError(t, err)
	e.waitState(p, 10*time.Second, backlog.StateCompleted)

	// Hold d's row, wherever the retirer has put it: the retry of d reads
	// p, then waits for it.
	holder, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	var n int
	require.NoError(t, holder.QueryRow(ctx, `SELECT (SELECT count(*) FROM (SELECT 1 FROM "`+e.schema+`".jobs WHERE id = $1 FOR UPDATE) a)
	+ (SELECT count(*) FROM (SELECT 1 FROM "`+e.schema+`".job_history WHERE id = $1 FOR UPDATE) b)`, d).Scan(&n))
	require.Equal(t, 1, n)
	type res struct {
		st  backlog.State
		err error
	}
	done := make(chan res, 1)
	go func() {
		st, err := e.q.Retry(ctx, d)
		done <- res{st, err}
	}()
	e.blockedBehind(holder, 10*time.Second)
	st, err := e.q.Retry(ctx, p)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, st)
	require.NoError(t, holder.Commit(ctx))
	got := <-done
	require.NoError(t, got.err)
	require.Equal(t, backlog.StateAvailable, got.st)
	r.requireRead(d, 2)
	e.waitJob(p, 20*time.Second, func(i *backlog.JobInfo) bool { return i.State == backlog.StateCompleted && i.Attempt == 3 })
}
