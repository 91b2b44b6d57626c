package sqltx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/worktest"
)

// Caller's transactions at REPEATABLE READ and SERIALIZABLE. Such a
// transaction reads everything on the snapshot its first statement took,
// so what other sessions committed since is invisible to the enqueue's
// reads. Each test takes the snapshot, has another session commit a
// change the enqueue depends on, then enqueues: the enqueue must either
// be right about the change or fail with an ErrRetryable error, after
// which the whole transaction is tried again (a retry inside the same
// transaction would see the same snapshot).

// levels are the isolation levels above READ COMMITTED, by test name.
var levels = []struct{ name, sql string }{
	{"RepeatableRead", "REPEATABLE READ"},
	{"Serializable", "SERIALIZABLE"},
}

// isolationTests are the suite's tests at each level of levels.
func isolationTests() []struct {
	name string
	run  func(*env)
} {
	var out []struct {
		name string
		run  func(*env)
	}
	for _, l := range levels {
		out = append(out, []struct {
			name string
			run  func(*env)
		}{
			{"OrderingKeyAfterSnapshot/" + l.name, testOrderingKeyAfterSnapshot(l.sql)},
			{"UniqueKeyAfterSnapshot/" + l.name, testUniqueKeyAfterSnapshot(l.sql)},
			{"DependsOnEndedAfterSnapshot/" + l.name, testDependsOnEndedAfterSnapshot(l.sql)},
			{"DependsOnEnqueuedAfterSnapshot/" + l.name, testDependsOnEnqueuedAfterSnapshot(l.sql)},
		}...)
	}
	return out
}

// txAt begins a transaction at level and takes its snapshot.
func (e *env) txAt(level string) *Tx {
	e.t.Helper()
	tx := e.tx()
	require.NoError(e.t, tx.Exec(e.ctx(), "SET TRANSACTION ISOLATION LEVEL "+level))
	_, err := tx.Int(e.ctx(), `SELECT count(*) FROM "`+e.schema+`".jobs`)
	require.NoError(e.t, err)
	return tx
}

// retryTx runs enqueue in transactions at level until one commits. The
// first transaction takes its snapshot, then meanwhile commits its change
// in other sessions, then enqueue runs. An enqueue that fails must fail
// with ErrRetryable, and then the transaction is rolled back and tried
// again. retryTx returns how many attempts failed.
func (e *env) retryTx(level string, meanwhile func(), enqueue func(tx *Tx) error) int {
	e.t.Helper()
	for attempt := 0; ; attempt++ {
		require.Less(e.t, attempt, 3, "the enqueue kept failing")
		tx := e.txAt(level)
		if attempt == 0 {
			meanwhile()
		}
		err := enqueue(tx)
		if err != nil {
			require.ErrorIs(e.t, err, backlog.ErrRetryable, "an enqueue that cannot be right about a change after its snapshot must say so, retryably")
			require.Contains(e.t, err.Error(), "snapshot", "the error says why")
			require.NoError(e.t, tx.Rollback(e.ctx()))
			continue
		}
		require.NoError(e.t, tx.Commit(e.ctx()))
		return attempt
	}
}

// chainOf returns the live jobs of an ordering key, and the key's order
// edges (prerequisite → job), asserting that never two of them are
// available or running at once.
func (e *env) chainOf(key string) (map[uuid.UUID]string, map[uuid.UUID][]uuid.UUID) {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx(), `SELECT id, state FROM "`+e.schema+`".jobs WHERE ordering_key = $1`, key)
	require.NoError(e.t, err)
	states := map[uuid.UUID]string{}
	var id uuid.UUID
	var st string
	_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error { states[id] = st; return nil })
	require.NoError(e.t, err)
	ready := 0
	for _, s := range states {
		if s == "available" || s == "running" {
			ready++
		}
	}
	require.LessOrEqual(e.t, ready, 1, "two jobs of key %q available or running at once: %v", key, states)
	rows, err = e.pool.Query(e.ctx(), `SELECT prereq, job FROM "`+e.schema+`".job_edges e WHERE kind = 'order'
		AND job IN (SELECT id FROM "`+e.schema+`".jobs WHERE ordering_key = $1)`, key)
	require.NoError(e.t, err)
	preds := map[uuid.UUID][]uuid.UUID{}
	var p, j uuid.UUID
	_, err = pgx.ForEachRow(rows, []any{&p, &j}, func() error { preds[j] = append(preds[j], p); return nil })
	require.NoError(e.t, err)
	return states, preds
}

// testOrderingKeyAfterSnapshot: the fork. The caller's transaction takes
// its snapshot; another session enqueues a of the key and commits; the
// caller enqueues b of the key. b must follow a (not a's predecessor p,
// nor nothing), so that the key's jobs still run one at a time, in order.
func testOrderingKeyAfterSnapshot(level string) func(*env) {
	return func(e *env) {
		q := e.queue()
		const key = "iso:k"
		p, err := q.Enqueue(e.ctx(), "sqltx.iso", nil, backlog.OrderingKey(key))
		require.NoError(e.t, err)
		var a, b uuid.UUID
		e.retryTx(level, func() {
			a, err = q.Enqueue(e.ctx(), "sqltx.iso", nil, backlog.OrderingKey(key))
			require.NoError(e.t, err)
		}, func(tx *Tx) (err error) {
			b, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.iso", nil, backlog.OrderingKey(key))
			return err
		})
		states, preds := e.chainOf(key)
		require.Equal(e.t, map[uuid.UUID]string{p: "available", a: "blocked", b: "blocked"}, states)
		require.Equal(e.t, map[uuid.UUID][]uuid.UUID{a: {p}, b: {a}}, preds, "one chain p → a → b")

		// And in a batch that also holds a job of another key, whose
		// chain did not change.
		var c, d uuid.UUID
		e.retryTx(level, func() {
			c, err = q.Enqueue(e.ctx(), "sqltx.iso", nil, backlog.OrderingKey(key))
			require.NoError(e.t, err)
		}, func(tx *Tx) error {
			ids, err := q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{
				{Type: "sqltx.iso", Options: []backlog.EnqueueOption{backlog.OrderingKey("iso:other")}},
				{Type: "sqltx.iso", Options: []backlog.EnqueueOption{backlog.OrderingKey(key)}},
			})
			if err == nil {
				d = ids[1]
			}
			return err
		})
		_, preds = e.chainOf(key)
		require.Equal(e.t, []uuid.UUID{c}, preds[d])

		rec := newRecorder()
		stop := worktest.Run(e.t, func(ctx context.Context) error { return q.Work(ctx, rec, backlog.Types("sqltx.iso")) })
		rec.await(e.t, 30*time.Second, p, a, b, c, d)
		require.NoError(e.t, stop())
		pos := func(id uuid.UUID) int { return slices.Index(rec.ids, id) }
		require.True(e.t, pos(p) < pos(a) && pos(a) < pos(b) && pos(b) < pos(c) && pos(c) < pos(d), "run in enqueue order")
	}
}

// testUniqueKeyAfterSnapshot: a holder committed after the snapshot is
// the caller's duplicate (after a retry); a holder that ended after the
// snapshot frees the key. Never two live jobs hold it.
func testUniqueKeyAfterSnapshot(level string) func(*env) {
	return func(e *env) {
		q := e.queue()
		const key = "iso:u"
		var holder, got uuid.UUID
		var err error
		e.retryTx(level, func() {
			holder, err = q.Enqueue(e.ctx(), "sqltx.iso", nil, backlog.UniqueKey(key))
			require.NoError(e.t, err)
		}, func(tx *Tx) (err error) {
			got, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.iso", nil, backlog.UniqueKey(key))
			return err
		})
		require.Equal(e.t, holder, got)
		require.Equal(e.t, 1, e.count(`unique_key = $1`, key))

		e.retryTx(level, func() {
			_, err := q.Cancel(e.ctx(), holder)
			require.NoError(e.t, err)
		}, func(tx *Tx) (err error) {
			got, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.iso", nil, backlog.UniqueKey(key))
			return err
		})
		require.NotEqual(e.t, holder, got)
		require.Equal(e.t, 1, e.count(`unique_key = $1 AND state IN ('blocked', 'scheduled', 'available', 'running')`, key))
		require.Equal(e.t, 1, e.count(`unique_key = $1 AND id = $2`, key, got))
	}
}

// gate is a handler that holds each job of type "sqltx.gated" until it is
// let go, and runs the others at once.
type gate struct {
	mu      sync.Mutex
	started map[uuid.UUID]chan struct{}
	release map[uuid.UUID]chan struct{}
}

func newGate() *gate {
	return &gate{started: map[uuid.UUID]chan struct{}{}, release: map[uuid.UUID]chan struct{}{}}
}

func (g *gate) chans(id uuid.UUID) (started, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started[id] == nil {
		g.started[id], g.release[id] = make(chan struct{}), make(chan struct{})
	}
	return g.started[id], g.release[id]
}

func (g *gate) Work(ctx context.Context, job *backlog.Job) error {
	if job.Type != "sqltx.gated" {
		return nil
	}
	started, release := g.chans(job.ID)
	select {
	case <-started: // an attempt before this one started it
	default:
		close(started)
	}
	select {
	case <-release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitState polls a job until it is in state.
func (e *env) waitState(id uuid.UUID, state backlog.State) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		info, err := e.q.Job(e.ctx(), id)
		return err == nil && info.State == state
	}, 30*time.Second, 5*time.Millisecond, "job %s never %s", id, state)
}

// testDependsOnEndedAfterSnapshot: a prerequisite that ended after the
// caller's snapshot (cancelled while queued, completed alone, completed
// with another dependent) never leaves the new job blocked behind it for
// good: the job arrives cancelled, or runs.
func testDependsOnEndedAfterSnapshot(level string) func(*env) {
	return func(e *env) {
		q := e.queue()
		g := newGate()
		stop := worktest.Run(e.t, func(ctx context.Context) error {
			return q.Work(ctx, g, backlog.Types("sqltx.gated", "sqltx.dep"), backlog.Concurrency(4))
		})
		defer func() { require.NoError(e.t, stop()) }()
		enqueueDep := func(out *uuid.UUID, pre uuid.UUID) func(tx *Tx) error {
			return func(tx *Tx) (err error) {
				*out, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.dep", nil, backlog.DependsOn(pre))
				return err
			}
		}

		// Cancelled while queued (in place, in jobs): blocked types are
		// not worked, so it stays queued until the cancel.
		queued, err := q.Enqueue(e.ctx(), "sqltx.idle", nil)
		require.NoError(e.t, err)
		var d1 uuid.UUID
		e.retryTx(level, func() {
			_, err := q.Cancel(e.ctx(), queued)
			require.NoError(e.t, err)
		}, enqueueDep(&d1, queued))
		info, err := q.Job(e.ctx(), d1)
		require.NoError(e.t, err)
		require.Equal(e.t, backlog.StateCancelled, info.State)
		require.Equal(e.t, fmt.Sprintf("cancelled: prerequisite %s cancelled", queued), info.LastError)

		// Completed, alone (moved to job_history by its finish) and with
		// another dependent (finished in place, its dependents released
		// in the same transaction). Both are running when the snapshot
		// is taken.
		alone, err := q.Enqueue(e.ctx(), "sqltx.gated", nil)
		require.NoError(e.t, err)
		withDep, err := q.Enqueue(e.ctx(), "sqltx.gated", nil)
		require.NoError(e.t, err)
		other, err := q.Enqueue(e.ctx(), "sqltx.dep", nil, backlog.DependsOn(withDep))
		require.NoError(e.t, err)
		for i, pre := range []uuid.UUID{alone, withDep} {
			started, release := g.chans(pre)
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				e.t.Fatalf("prerequisite %d did not start", i)
			}
			var d uuid.UUID
			e.retryTx(level, func() {
				close(release)
				e.waitState(pre, backlog.StateCompleted)
			}, enqueueDep(&d, pre))
			e.waitState(d, backlog.StateCompleted)
		}
		e.waitState(other, backlog.StateCompleted)
		require.Zero(e.t, e.count(`state = 'blocked'`))
	}
}

// testDependsOnEnqueuedAfterSnapshot: a prerequisite committed after the
// caller's snapshot is not "unknown": the enqueue fails retryably, and
// the transaction tried again finds it.
func testDependsOnEnqueuedAfterSnapshot(level string) func(*env) {
	return func(e *env) {
		q := e.queue()
		var pre, d uuid.UUID
		failed := e.retryTx(level, func() {
			var err error
			pre, err = q.Enqueue(e.ctx(), "sqltx.idle", nil)
			require.NoError(e.t, err)
		}, func(tx *Tx) (err error) {
			d, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.dep", nil, backlog.DependsOn(pre))
			return err
		})
		require.Equal(e.t, 1, failed)
		info, err := q.Job(e.ctx(), d)
		require.NoError(e.t, err)
		require.Equal(e.t, backlog.StateBlocked, info.State)

		// An ID nobody enqueued is still bad input.
		tx := e.txAt(level)
		_, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.dep", nil, backlog.DependsOn(backlog.NewID()))
		requireInput(e.t, err, "depends on")
		require.False(e.t, errors.Is(err, backlog.ErrRetryable))
		requireUsable(e.t, tx)
	}
}
