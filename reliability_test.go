package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
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

// TestDependsOnChainPredecessor: "B after A, same key, and B needs A" gives
// B both edges, across calls and inside one batch; a failed A cancels B.
func TestDependsOnChainPredecessor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	a, err := e.q.Enqueue(ctx, "chain", "a", backlog.OrderingKey("k"))
	require.NoError(t, err)
	b, err := e.q.Enqueue(ctx, "chain", "b", backlog.OrderingKey("k"), backlog.DependsOn(a))
	require.NoError(t, err)
	x, y := backlog.NewID(), backlog.NewID()
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: x, Type: "chain", Args: "x", Options: []backlog.EnqueueOption{backlog.OrderingKey("k2")}},
		{ID: y, Type: "chain", Args: "y", Options: []backlog.EnqueueOption{backlog.OrderingKey("k2"), backlog.DependsOn(x)}},
	})
	require.NoError(t, err)
	fa, err := e.q.Enqueue(ctx, "chain.fails", nil, backlog.OrderingKey("k3"))
	require.NoError(t, err)
	fb, err := e.q.Enqueue(ctx, "chain", "fb", backlog.OrderingKey("k3"), backlog.DependsOn(fa))
	require.NoError(t, err)

	var mu sync.Mutex
	var order []string
	mux := backlog.NewMux()
	mux.Handle("chain", backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, s string) error {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
		return nil
	}))
	mux.HandleFunc("chain.fails", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("no")) })
	work(t, e.q, mux)
	for _, id := range []uuid.UUID{a, b, x, y} {
		e.waitState(id, 10*time.Second, backlog.StateCompleted)
	}
	info := e.waitState(fb, 10*time.Second, backlog.StateCancelled)
	require.Contains(t, info.LastError, fa.String())
	mu.Lock()
	defer mu.Unlock()
	require.Less(t, strings.Index(strings.Join(order, ""), "a"), strings.Index(strings.Join(order, ""), "b"))
	require.Less(t, strings.Index(strings.Join(order, ""), "x"), strings.Index(strings.Join(order, ""), "y"))
}

// TestCronEveryIsAlignedAcrossProcesses: "@every 2s" registered by two
// processes at different moments yields one job per plan, plans on the
// 2-second grid of the Unix epoch.
func TestCronEveryIsAlignedAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	q2 := e.queue(e.pool)
	require.NoError(t, e.q.Cron("tick", "@every 2s", "tick", nil))
	<-time.After(700 * time.Millisecond) // the second process starts later (load shaping, not a wait for a condition)
	require.NoError(t, q2.Cron("tick", "@every 2s", "tick", nil))
	e.waitCount("type = 'tick'", 3, 15*time.Second)
	rows, err := e.pool.Query(ctx, `SELECT run_at, count(*) FROM "`+e.schema+`".all_jobs WHERE type = 'tick' GROUP BY run_at`)
	require.NoError(t, err)
	type plan struct {
		at time.Time
		n  int
	}
	plans, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (plan, error) {
		var p plan
		return p, r.Scan(&p.at, &p.n)
	})
	require.NoError(t, err)
	for _, p := range plans {
		require.Equal(t, 1, p.n, "plan %s enqueued %d times", p.at, p.n)
		require.Zero(t, p.at.UnixNano()%int64(2*time.Second), "plan %s is not on the epoch's 2 s grid", p.at)
	}
}

// TestOpenCallerTransactionOnAPrerequisite: a caller's transaction that
// enqueued a dependent of a running job and stays open for several leases
// neither costs the running job its lease (it runs once) nor delays any
// other job's outcome.
func TestOpenCallerTransactionOnAPrerequisite(t *testing.T) {
	t.Parallel()
	// A 2 s lease: renewed every 0.67 s, it outlives a renewal held up by
	// a loaded machine (with 1 s, one renewal late by a few hundred
	// milliseconds lost it, for a reason that is not the caller's lock).
	e := newEnv(t, backlog.WithLease(2*time.Second))
	ctx := context.Background()
	started := make(chan struct{}, 1)
	finishP := make(chan struct{})
	var pRuns atomic.Int32
	mux := backlog.NewMux()
	mux.HandleFunc("p", func(ctx context.Context, job *backlog.Job) error {
		pRuns.Add(1)
		started <- struct{}{}
		select {
		case <-finishP:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	mux.HandleFunc("other", func(context.Context, *backlog.Job) error { return nil })
	mux.HandleFunc("dep", func(context.Context, *backlog.Job) error { return nil })
	work(t, e.q, mux, backlog.Concurrency(8))
	p, err := e.q.Enqueue(ctx, "p", nil)
	require.NoError(t, err)
	<-started

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit: a no-op
	dep, err := e.q.EnqueueTx(ctx, tx, "dep", nil, backlog.DependsOn(p))
	require.NoError(t, err)
	// While the transaction stays open (several leases), P finishes and
	// other jobs come and go: each completes before the commit, so none
	// waited for the caller's transaction.
	close(finishP)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		id, err := e.q.Enqueue(ctx, "other", nil)
		require.NoError(t, err)
		e.waitState(id, 10*time.Second, backlog.StateCompleted)
	}
	info, err := e.q.Job(ctx, p)
	require.NoError(t, err)
	require.Equal(t, backlog.StateRunning, info.State, "P's finish waits for the caller's transaction (only P's)")
	require.NoError(t, tx.Commit(ctx))
	e.waitState(p, 10*time.Second, backlog.StateCompleted)
	e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	info, err = e.q.Job(ctx, p)
	require.NoError(t, err)
	require.Equal(t, int32(1), pRuns.Load(), "P ran twice: its lease was lost to the caller's lock (errors: %v)", info.Errors)
	require.Equal(t, 1, info.Attempt)
}

// logRecorder keeps the messages (and errors) a Queue logs at Warn or
// above.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	r.mu.Lock()
	r.msgs = append(r.msgs, b.String())
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) matching(s string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

// TestGraphLockOrderUnderRaces races cancels of blocked chain members
// against their predecessors' finishes, and enqueues on a chain against
// failures that cascade into it: nothing may deadlock or fail.
func TestGraphLockOrderUnderRaces(t *testing.T) {
	t.Parallel()
	rec := &logRecorder{}
	e := newEnv(t, backlog.WithLogger(slog.New(rec)))
	ctx := context.Background()
	const rounds = 300
	var as, bs []uuid.UUID
	for i := range rounds {
		key := backlog.OrderingKey("chain-" + uuid.NewString())
		a, err := e.q.Enqueue(ctx, "a", nil, key)
		require.NoError(t, err)
		b, err := e.q.Enqueue(ctx, "b", nil, key)
		require.NoError(t, err)
		_, err = e.q.Enqueue(ctx, "c", nil, key)
		require.NoError(t, err)
		as, bs = append(as, a), append(bs, b)
		_ = i
	}
	mux := backlog.NewMux()
	for _, typ := range []string{"a", "b", "c", "d"} {
		mux.HandleFunc(typ, func(context.Context, *backlog.Job) error { return nil })
	}
	mux.HandleFunc("f", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("fails")) })
	work(t, e.q, mux, backlog.Concurrency(16))

	var wg sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for i := range rounds {
		wg.Go(func() {
			<-time.After(time.Duration(rand.IntN(2000)) * time.Microsecond)
			if _, err := e.q.Cancel(ctx, bs[i]); err != nil {
				errs <- err
			}
		})
	}
	// Chains fed while failures cascade into them.
	for i := range rounds / 3 {
		wg.Go(func() {
			key := backlog.OrderingKey("cascade-" + string(rune('a'+i%7)))
			f, err := e.q.Enqueue(ctx, "f", nil)
			if err != nil {
				errs <- err
				return
			}
			if _, err := e.q.Enqueue(ctx, "d", nil, key, backlog.DependsOn(f)); err != nil {
				errs <- err
			}
			if _, err := e.q.Enqueue(ctx, "d", nil, key); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// A liveness bound, not a speed one: 23 s alone, 1,091 of 1,200 after
	// 60 s inside a full make test on 2 cores (a deadlock or a lost wake-up
	// still never finishes).
	t.Cleanup(func() {
		if t.Failed() {
			e.logUnfinished()
			for _, m := range rec.matching("") {
				t.Logf("logged: %s", m)
			}
		}
	})
	e.waitCount("state IN ('completed', 'failed', 'cancelled')", e.count("true"), 3*time.Minute)
	require.Empty(t, rec.matching("deadlock"), "deadlocks were logged")
	require.Empty(t, rec.matching("recording job outcomes failed"))
	for _, a := range as {
		info, err := e.q.Job(ctx, a)
		require.NoError(t, err)
		require.Equal(t, backlog.StateCompleted, info.State)
	}
}

// TestUniqueKeyRacingTheHolderFinish: enqueueing a duplicate while the live
// holder keeps failing and retrying never returns an error.
func TestUniqueKeyRacingTheHolderFinish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	var n atomic.Int32
	mux.HandleFunc("u", func(context.Context, *backlog.Job) error {
		if n.Add(1)%2 == 0 {
			return backlog.Permanent(errors.New("fails"))
		}
		return errors.New("retry")
	})
	work(t, e.q, mux, backlog.Concurrency(4), backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: time.Millisecond}))
	var wg sync.WaitGroup
	var calls, bad atomic.Int32
	for range 4 {
		wg.Go(func() {
			for range 500 {
				calls.Add(1)
				if _, err := e.q.Enqueue(ctx, "u", nil, backlog.UniqueKey("only")); err != nil {
					bad.Add(1)
					t.Errorf("enqueue: %v (retryable: %v)", err, errors.Is(err, backlog.ErrRetryable))
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, bad.Load())
	require.LessOrEqual(t, e.count("unique_key = 'only' AND state IN ('blocked', 'available', 'running')"), 1)
}

// TestBadInputIsRejectedNamingTheField covers inputs that were truncated,
// accepted or answered with raw database errors.
func TestBadInputIsRejectedNamingTheField(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cases := []struct {
		name  string
		args  any
		opts  []backlog.EnqueueOption
		field string
	}{
		{"max attempts over int32", nil, []backlog.EnqueueOption{backlog.MaxAttempts(1<<32 + 1)}, "max attempts"},
		{"max attempts 2^31", nil, []backlog.EnqueueOption{backlog.MaxAttempts(1 << 31)}, "max attempts"},
		{"sub-millisecond timeout", nil, []backlog.EnqueueOption{backlog.Timeout(500 * time.Microsecond)}, "timeout"},
		{"args with invalid UTF-8", json.RawMessage("\"\xff\""), nil, "args"},
		{"args with a lone surrogate", json.RawMessage(`"\ud800"`), nil, "args"},
		{"args with a NUL escape", json.RawMessage(`{"a":"\u0000"}`), nil, "args"},
		{"run at year 300000", nil, []backlog.EnqueueOption{backlog.RunAt(time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC))}, "run at"},
	}
	for _, c := range cases {
		_, err := e.q.Enqueue(ctx, "bad", c.args, c.opts...)
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie, c.name)
		require.Equal(t, c.field, ie.Field, c.name)
	}
	_, err := e.q.EnqueueMany(ctx, make([]backlog.JobSpec, backlog.MaxBatchJobs+1))
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "jobs", ie.Field)
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{ID: uuid.New(), Type: "bad"}})
	require.ErrorAs(t, err, &ie, "a version 4 UUID")
	require.Equal(t, "id", ie.Field)
	require.Zero(t, e.count("true"), "nothing was written")

	_, err = backlog.New(ctx, e.pool, backlog.WithWorkerID("w\x00id"))
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "worker id", ie.Field)

	// A unique job arriving cancelled (its prerequisite failed) while a
	// live job holds its key is a duplicate of that job.
	holder, err := e.q.Enqueue(ctx, "held", nil, backlog.UniqueKey("u1"))
	require.NoError(t, err)
	failed, err := e.q.Enqueue(ctx, "doomed", nil)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET state = 'failed', finished_at = now() WHERE id = $1`, failed)
	require.NoError(t, err)
	res, err := e.q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "held", Options: []backlog.EnqueueOption{
		backlog.UniqueKey("u1"), backlog.DependsOn(failed)}}})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate)
	require.Equal(t, holder, res[0].ID)
	require.Equal(t, 1, e.count("unique_key = 'u1'"))
}

// TestWorkReturnsAfterEveryOutcome: when Work returns, no job it claimed
// is still running, however the stop lands.
func TestWorkReturnsAfterEveryOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for round := range 10 {
		specs := make([]backlog.JobSpec, 2000)
		for i := range specs {
			specs[i] = backlog.JobSpec{Type: "quick"}
		}
		_, err := e.q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- e.q.Work(wctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
				backlog.Types("quick"), backlog.Concurrency(64))
		}()
		<-time.After(time.Duration(5+rand.IntN(40)) * time.Millisecond) // stop at a random moment
		cancel()
		require.NoError(t, <-done)
		require.Zero(t, e.count("state = 'running'"), "round %d: jobs still running after Work returned", round)
	}
}

// TestOutcomeWrittenAfterLocalLeaseLoss: a handler stopped because its
// lease could not be renewed in time still has its outcome written when the
// database holds the job under its token, sparing a re-run.
func TestOutcomeWrittenAfterLocalLeaseLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithLease(time.Second), backlog.WithSweepInterval(time.Hour))
	ctx := context.Background()
	causes := make(chan error, 2)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil // done anyway
	}), backlog.Types("held"))
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	id, err := e.q.Enqueue(ctx, "held", nil)
	require.NoError(t, err)
	e.waitState(id, 5*time.Second, backlog.StateRunning)
	// Hold the row so renewals skip it until the local deadline passes;
	// the same transaction keeps the database's lease for an hour, so that
	// the database still holds the job under its token whenever the
	// outcome comes (with the second lease, the expiry-timed sweep could
	// take the job first on a loaded machine: attempt 2).
	_, err = tx.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET lease_expires_at = now() + interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	require.ErrorIs(t, <-causes, backlog.ErrLeaseLost)
	require.NoError(t, tx.Commit(ctx))
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 1, info.Attempt, "the outcome was dropped and the job ran again")
}

// TestPollOnlyEnqueueTxWakesLocalWorkers: with no LISTEN and a backup poll
// of an hour, a job enqueued inside a caller's transaction starts once the
// transaction commits, and a periodic job on time.
func TestPollOnlyEnqueueTxWakesLocalWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollOnly(), backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	ran := make(chan string, 4)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		ran <- job.Type
		return nil
	}), backlog.Types("tx", "every"))
	// Let the domain park first.
	first, err := e.q.Enqueue(ctx, "tx", nil)
	require.NoError(t, err)
	e.waitState(first, 5*time.Second, backlog.StateCompleted)
	<-ran

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	id, err := e.q.EnqueueTx(ctx, tx, "tx", nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	select {
	case <-ran:
	case <-time.After(3 * time.Second):
		t.Fatal("a job enqueued in a committed transaction did not start")
	}
	e.waitState(id, 5*time.Second, backlog.StateCompleted)

	require.NoError(t, e.q.Every("every", time.Second, "every", nil))
	select {
	case typ := <-ran:
		require.Equal(t, "every", typ)
	case <-time.After(5 * time.Second):
		t.Fatal("a periodic job did not start")
	}
}

// TestStaleTokenWritesChangeNothing: the database-side fence, without the
// client's own checks: a finish and a renewal carrying an old token are
// refused.
func TestStaleTokenWritesChangeNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	id, err := e.q.Enqueue(ctx, "fenced", nil)
	require.NoError(t, err)
	// Claim it twice through the claim function: the second claim stands
	// for a new attempt after the first's lease expired.
	claim := func() uuid.UUID {
		var tok uuid.UUID
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT lease_token FROM "`+e.schema+`".claim('{fenced}', '{}', 1, 60000, 'w') WHERE id IS NOT NULL`).Scan(&tok))
		return tok
	}
	old := claim()
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET state = 'available', lease_token = NULL WHERE id = $1`, id)
	require.NoError(t, err)
	fresh := claim()
	require.NotEqual(t, old, fresh)
	for _, graph := range []bool{false, true} {
		require.NoError(t, backlog.FinishForTest(ctx, e.q, id, old, "completed", graph))
		info, err := e.q.Job(ctx, id)
		require.NoError(t, err)
		require.Equal(t, backlog.StateRunning, info.State, "a stale token's finish was written (graph path: %v)", graph)
	}
	renewed, err := backlog.ExtendForTest(ctx, e.q, id, old)
	require.NoError(t, err)
	require.False(t, renewed, "a stale token's renewal was written")
	require.NoError(t, backlog.FinishForTest(ctx, e.q, id, fresh, "completed", false))
	e.waitState(id, time.Second, backlog.StateCompleted)
}

// TestPromoterLooksEveryPollIntervalWhateverItKnows: a job scheduled by a
// process whose posting never reaches this one (poll-only, a producer with
// no Work) starts within about a poll interval of being due, though this
// process's promoter knows of a job due only in an hour.
func TestPromoterLooksEveryPollIntervalWhateverItKnows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollOnly(), backlog.WithPollInterval(time.Second))
	ctx := context.Background()
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("far", "soon"))
	_, err := e.q.Enqueue(ctx, "far", nil, backlog.Delay(time.Hour))
	require.NoError(t, err)
	// Once a job due shortly has run, the promoter has looked since the
	// far job was enqueued: it knows of nothing sooner than in an hour.
	probe, err := e.q.Enqueue(ctx, "soon", nil, backlog.Delay(100*time.Millisecond))
	require.NoError(t, err)
	e.waitState(probe, 5*time.Second, backlog.StateCompleted)
	producer := e.queue(e.pool, backlog.WithPollOnly())
	id, err := producer.Enqueue(ctx, "soon", nil, backlog.Delay(500*time.Millisecond))
	require.NoError(t, err)
	e.waitState(id, 5*time.Second, backlog.StateCompleted)
}

// TestEnqueueRefusesAnExistingJobsID: an ID set by the caller that names a
// job, finished or live, is refused and nothing is written.
func TestEnqueueRefusesAnExistingJobsID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("x"))
	done := backlog.NewID()
	_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{{ID: done, Type: "x"}})
	require.NoError(t, err)
	e.waitState(done, 10*time.Second, backlog.StateCompleted)
	live := backlog.NewID()
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{ID: live, Type: "x", Options: []backlog.EnqueueOption{backlog.Delay(time.Hour)}}})
	require.NoError(t, err)
	for _, id := range []uuid.UUID{done, live} {
		fresh := backlog.NewID()
		_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{ID: fresh, Type: "x"}, {ID: id, Type: "x"}})
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie)
		require.Contains(t, ie.Field, "id")
		require.Equal(t, 0, e.count("id = $1", fresh), "nothing was written")
		require.Equal(t, 1, e.count("id = $1", id))
	}
}
