package backlog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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

// The design rule these tests hold each batched path to: one job can never
// block, delay beyond its own retries, or lose the outcome of another. Each
// feeds its path one poison row among healthy ones (a trigger that raises
// for that row's write, as a user's trigger or a value PostgreSQL rejects
// would) and requires the healthy ones to finish on time and the poison
// job to end failed with a reason that names the cause.

// poison installs a trigger that raises for the write a path makes to
// jobs whose args are {"poison": path}.
func (e *env) poison() {
	e.t.Helper()
	ctx := context.Background()
	s := `"` + e.schema + `"`
	_, err := e.pool.Exec(ctx, `CREATE FUNCTION `+s+`.poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.args->>'poison' = 'complete' AND OLD.state = 'running' AND NEW.state = 'completed' THEN
		RAISE EXCEPTION 'poison: refuses completion';
	ELSIF NEW.args->>'poison' = 'sweep' AND OLD.state = 'running' AND NEW.state = 'available' AND OLD.lease_expires_at < now() THEN
		RAISE EXCEPTION 'poison: refuses the sweep';
	ELSIF NEW.args->>'poison' = 'renew' AND OLD.state = 'running' AND NEW.state = 'running' AND NEW.lease_expires_at > OLD.lease_expires_at THEN
		RAISE EXCEPTION 'poison: refuses renewal';
	ELSIF NEW.args->>'poison' = 'release' AND OLD.state = 'blocked' AND NEW.state = 'available' THEN
		RAISE EXCEPTION 'poison: refuses release';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER poison BEFORE UPDATE ON `+s+`.jobs FOR EACH ROW EXECUTE FUNCTION `+s+`.poison();
CREATE FUNCTION `+s+`.poison_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.args->>'poison' = 'insert' THEN
		RAISE EXCEPTION 'poison: refuses the insert';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER poison_insert BEFORE INSERT ON `+s+`.jobs FOR EACH ROW EXECUTE FUNCTION `+s+`.poison_insert();
CREATE FUNCTION `+s+`.poison_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.args->>'poison' = 'complete' AND NEW.state = 'completed' THEN
		RAISE EXCEPTION 'poison: refuses completion';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER poison_history BEFORE INSERT ON `+s+`.job_history FOR EACH ROW EXECUTE FUNCTION `+s+`.poison_history();`)
	require.NoError(e.t, err)
}

func poisonArgs(path string) json.RawMessage { return json.RawMessage(`{"poison":"` + path + `"}`) }

// barrier returns a handler that holds every job until n have started,
// then returns nil: their outcomes reach the completer together.
func barrier(n int) backlog.HandlerFunc {
	var mu sync.Mutex
	started := 0
	all := make(chan struct{})
	return func(ctx context.Context, job *backlog.Job) error {
		mu.Lock()
		started++
		if started == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
}

func TestIsolationCompleter(t *testing.T) {
	t.Parallel()
	// Outcomes held back by the poison row would be written after their
	// leases expired, and the jobs run again (attempt 2): the lease is the
	// bound, checked by each job's attempt, not by the clock (3 s: at 1 s a
	// machine at load 40 let a healthy job's lease expire).
	const lease = 3 * time.Second
	e := newEnv(t, backlog.WithLease(lease))
	e.poison()
	ctx := context.Background()
	specs := []backlog.JobSpec{{Type: "iso", Args: poisonArgs("complete")}}
	for range 20 {
		specs = append(specs, backlog.JobSpec{Type: "iso", Args: map[string]int{"n": 1}})
	}
	ids, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	start := time.Now()
	work(t, e.q, barrier(len(specs)), backlog.Types("iso"), backlog.Concurrency(32))

	for _, id := range ids[1:] {
		info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
		require.Equal(t, 1, info.Attempt)
	}
	t.Logf("the healthy outcomes were written %s after work began", time.Since(start).Round(time.Millisecond))
	info := e.waitState(ids[0], 10*time.Second, backlog.StateFailed)
	require.Contains(t, info.LastError, "poison: refuses completion")
	require.Contains(t, info.LastError, "recording the job's outcome (completed) failed")
	require.Equal(t, 1, info.Attempt, "failed once, never re-run")
}

func TestIsolationSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.poison()
	ctx := context.Background()
	// Jobs of a dead worker: running, their leases long expired.
	ins := `INSERT INTO "` + e.schema + `".jobs (id, type, args, state, attempt, lease_token, lease_expires_at, worker)
		VALUES ($1, 'iso', $2, 'running', 1, gen_random_uuid(), now() - interval '1 minute', 'dead')`
	poisoned := backlog.NewID()
	_, err := e.pool.Exec(ctx, ins, poisoned, string(poisonArgs("sweep")))
	require.NoError(t, err)
	var healthy []uuid.UUID
	for range 10 {
		id := backlog.NewID()
		_, err := e.pool.Exec(ctx, ins, id, `{}`)
		require.NoError(t, err)
		healthy = append(healthy, id)
	}
	n, err := e.q.SweepExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 11, n)
	for _, id := range healthy {
		info, err := e.q.Job(ctx, id)
		require.NoError(t, err)
		require.Equal(t, backlog.StateAvailable, info.State)
	}
	info, err := e.q.Job(ctx, poisoned)
	require.NoError(t, err)
	require.Equal(t, backlog.StateFailed, info.State)
	require.Contains(t, info.LastError, "poison: refuses the sweep")
	// The next pass finds nothing: the poison row does not stall the sweep.
	n, err = e.q.SweepExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestIsolationHeartbeat(t *testing.T) {
	t.Parallel()
	// A lease of 2 s, renewed about every 0.7 s: a healthy job loses it
	// only if no renewal commits for 2 s, which a loaded machine did with
	// a lease of 1 s (attempt 2 beside a CPU burner and another test run).
	e := newEnv(t, backlog.WithLease(2*time.Second))
	e.poison()
	ctx := context.Background()
	specs := []backlog.JobSpec{{Type: "iso", Args: poisonArgs("renew")}}
	for range 5 {
		specs = append(specs, backlog.JobSpec{Type: "iso", Args: map[string]int{}})
	}
	ids, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	causes := make(chan error, len(specs))
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		// Outlive the lease: only renewals keep it.
		select {
		case <-time.After(3500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return ctx.Err()
		}
	}), backlog.Types("iso"), backlog.Concurrency(8))

	info := e.waitState(ids[0], 20*time.Second, backlog.StateFailed)
	require.Contains(t, info.LastError, "renewing the job's lease failed")
	require.Contains(t, info.LastError, "poison: refuses renewal")
	for _, id := range ids[1:] {
		info := e.waitState(id, 20*time.Second, backlog.StateCompleted)
		require.Equal(t, 1, info.Attempt, "a healthy lease was lost with the poison one")
	}
	require.Len(t, causes, 1, "only the poison job's handler was stopped")
}

func TestIsolationRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.poison()
	ctx := context.Background()
	pre, err := e.q.Enqueue(ctx, "iso.pre", nil)
	require.NoError(t, err)
	var deps []uuid.UUID
	for i := range 5 {
		args := json.RawMessage(`{}`)
		if i == 2 {
			args = poisonArgs("release")
		}
		id, err := e.q.Enqueue(ctx, "iso.dep", args, backlog.DependsOn(pre))
		require.NoError(t, err)
		deps = append(deps, id)
	}
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
		backlog.Types("iso.pre", "iso.dep"))

	e.waitState(pre, 10*time.Second, backlog.StateCompleted)
	for i, id := range deps {
		if i == 2 {
			info := e.waitState(id, 10*time.Second, backlog.StateFailed)
			require.Contains(t, info.LastError, "releasing the job after its prerequisites ended failed")
			require.Contains(t, info.LastError, "poison: refuses release")
			continue
		}
		e.waitState(id, 10*time.Second, backlog.StateCompleted)
	}
}

// TestIsolationPeriodic: a schedule whose job cannot be inserted is
// skipped (and logged) without holding back the others' plans.
func TestIsolationPeriodic(t *testing.T) {
	t.Parallel()
	rec := &logRecorder{}
	e := newEnv(t, backlog.WithLogger(slog.New(rec)))
	e.poison()
	require.NoError(t, e.q.Every("bad", time.Second, "tick.bad", poisonArgs("insert")))
	require.NoError(t, e.q.Every("good", time.Second, "tick.good", nil))
	e.waitCount("type = 'tick.good'", 3, 10*time.Second)
	require.Zero(t, e.count("type = 'tick.bad'"))
	require.NotEmpty(t, rec.matching("poison: refuses the insert"))
}

// TestIsolationEnqueueMany: a user's batch stays all or nothing (its
// documented contract): one job the database refuses fails the call, with
// the database's reason, and nothing is written.
func TestIsolationEnqueueMany(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.poison()
	specs := []backlog.JobSpec{{Type: "a"}, {Type: "a", Args: poisonArgs("insert")}, {Type: "a"}}
	_, err := e.q.EnqueueMany(context.Background(), specs)
	require.ErrorContains(t, err, "poison: refuses the insert")
	require.Zero(t, e.count("true"))
}

// TestIsolationBadResult: a result PostgreSQL cannot store (a NUL
// character) fails its job at once with a clear error; it no longer
// reaches the database, stalls the completer or re-runs the job.
func TestIsolationBadResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithLease(time.Second))
	ctx := context.Background()
	setErr := make(chan error, 1)
	mux := backlog.NewMux()
	mux.HandleFunc("bad.result", func(ctx context.Context, job *backlog.Job) error {
		setErr <- job.SetResult("a\x00b")
		return nil
	})
	mux.HandleFunc("good", func(ctx context.Context, job *backlog.Job) error { return job.SetResult("ok") })
	work(t, e.q, mux)
	bad, err := e.q.Enqueue(ctx, "bad.result", nil)
	require.NoError(t, err)
	var goods []uuid.UUID
	for range 10 {
		id, err := e.q.Enqueue(ctx, "good", nil)
		require.NoError(t, err)
		goods = append(goods, id)
	}
	err = <-setErr
	require.ErrorIs(t, err, backlog.ErrInvalid)
	require.True(t, backlog.IsPermanent(err))
	info := e.waitState(bad, 10*time.Second, backlog.StateFailed)
	require.Contains(t, info.LastError, "NUL")
	require.Equal(t, 1, info.Attempt)
	for _, id := range goods {
		e.waitState(id, 5*time.Second, backlog.StateCompleted)
	}
	// Raw JSON results are checked the same way.
	var j backlog.Job
	require.ErrorIs(t, j.SetResult(json.RawMessage(`"\ud800"`)), backlog.ErrInvalid)
	require.ErrorIs(t, j.SetResult(json.RawMessage(`"a\u0000"`)), backlog.ErrInvalid)
	require.NoError(t, j.SetResult(json.RawMessage(`"\ud83d\ude00 \\u0000"`)), "a paired surrogate and an escaped backslash are fine")
}

// TestOversizedTagsRejected: tags within every per-tag limit can still add
// up to a posting over PostgreSQL's 8,000-byte NOTIFY limit. They are
// rejected up front, naming the field, and nothing is written.
func TestOversizedTagsRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tags := backlog.Tags{}
	for i := range 32 {
		tags[fmt.Sprintf("%03d%s", i, strings.Repeat("k", 97))] = strings.Repeat("v", 150)
	}
	for _, opts := range [][]backlog.EnqueueOption{
		{tags},
		{tags, backlog.UniqueKey("u")},
		{tags, backlog.OrderingKey("o")},
	} {
		_, err := e.q.Enqueue(ctx, "big.tags", nil, opts...)
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, "tags", ie.Field)
		require.Contains(t, ie.Reason, "4096-byte limit")
	}
	poll := e.queue(e.pool, backlog.WithPollOnly())
	_, err := poll.Enqueue(ctx, "big.tags", nil, tags)
	require.ErrorIs(t, err, backlog.ErrInvalid)
	require.Zero(t, e.count("true"))
	err = e.q.Work(ctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
		backlog.Types("big.tags"), backlog.WorkerTags(tags))
	require.ErrorIs(t, err, backlog.ErrInvalid, "worker tags have the same limit")

	// The largest tags allowed work end to end: enqueue, retry, sweep.
	big := backlog.Tags{}
	for i := range 16 {
		big[fmt.Sprintf("%02d%s", i, strings.Repeat("k", 98))] = strings.Repeat("v", 140)
	}
	id, err := e.q.Enqueue(ctx, "big.tags", nil, big)
	require.NoError(t, err)
	var runs atomic.Int32
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if runs.Add(1) == 1 {
			return backlog.Snooze(0) // announced again, with its tags
		}
		return nil
	}), backlog.Types("big.tags"), backlog.WorkerTags(big))
	e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, int32(2), runs.Load())
}

// TestIsolationFailedDependentSeenByEnqueue: a dependent whose release
// fails is failed the way every move to a terminal state is made, under
// FOR UPDATE, so an enqueue that depends on it never adds an edge that
// nobody will release: one in an open READ COMMITTED transaction (holding
// KEY SHARE on it) is waited for, and one at REPEATABLE READ whose
// snapshot still shows it blocked fails retryably. Either way the new job
// ends cancelled, not blocked for good. The prerequisite's finish is
// written by hand (no Work, so no retirer moves the failed dependent
// away meanwhile).
func TestIsolationFailedDependentSeenByEnqueue(t *testing.T) {
	t.Parallel()
	for _, level := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(level), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.poison()
			ctx := context.Background()
			pre, err := e.q.Enqueue(ctx, "iso.pre", nil)
			require.NoError(t, err)
			dep, err := e.q.Enqueue(ctx, "iso.dep", poisonArgs("release"), backlog.DependsOn(pre))
			require.NoError(t, err)
			var token uuid.UUID
			require.NoError(t, e.pool.QueryRow(ctx, `UPDATE "`+e.schema+`".jobs SET state = 'running', attempt = 1,
				lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour' WHERE id = $1 RETURNING lease_token`, pre).Scan(&token))
			finish := func() error { return backlog.FinishForTest(ctx, e.q, pre, token, "completed", true) }

			tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			var next uuid.UUID
			if level == pgx.ReadCommitted {
				// The enqueue holds KEY SHARE on dep until the commit.
				next, err = e.q.EnqueueTx(ctx, tx, "iso.next", nil, backlog.DependsOn(dep))
				require.NoError(t, err)
				done := make(chan error, 1)
				go func() { done <- finish() }()
				// The finish fails dep at once, or waits for the enqueue.
				require.Eventually(t, func() bool {
					var waiting bool
					err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
						WHERE wait_event_type = 'Lock' AND position($1 IN query) > 0)`, `"`+e.schema+`".`).Scan(&waiting)
					return (err == nil && waiting) || len(done) > 0
				}, 20*time.Second, time.Millisecond)
				require.NoError(t, tx.Commit(ctx))
				require.NoError(t, <-done)
			} else {
				_, err = tx.Exec(ctx, `SELECT count(*) FROM "`+e.schema+`".jobs`) // the snapshot: dep blocked
				require.NoError(t, err)
				require.NoError(t, finish())
				next, err = e.q.EnqueueTx(ctx, tx, "iso.next", nil, backlog.DependsOn(dep))
				if err != nil {
					require.ErrorIs(t, err, backlog.ErrRetryable)
					require.NoError(t, tx.Rollback(ctx))
					next, err = e.q.Enqueue(ctx, "iso.next", nil, backlog.DependsOn(dep))
					require.NoError(t, err)
				} else {
					require.NoError(t, tx.Commit(ctx))
				}
			}
			info, err := e.q.Job(ctx, dep)
			require.NoError(t, err)
			require.Equal(t, backlog.StateFailed, info.State)
			require.Contains(t, info.LastError, "poison: refuses release")
			info, err = e.q.Job(ctx, next)
			require.NoError(t, err)
			require.Equal(t, backlog.StateCancelled, info.State, "a job behind a failed prerequisite must not stay blocked")
			require.Equal(t, fmt.Sprintf("cancelled: prerequisite %s failed", dep), info.LastError)
		})
	}
}
