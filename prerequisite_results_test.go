package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
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

type stepA struct{ N int }
type stepB struct {
	N     int
	FromA int
}
type stepC struct{ Sum int }

// TestDAGResultsDownstream: a three-level DAG where each step reads the
// typed results of its prerequisites; the middle step fails once and is
// retried, and reads them again on the retry.
func TestDAGResultsDownstream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a, b, c := backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: a, Type: "dag.a", Args: map[string]int{"n": 7}},
		{ID: b, Type: "dag.b", Options: []backlog.EnqueueOption{backlog.DependsOn(a), backlog.MaxAttempts(3)}},
		{ID: c, Type: "dag.c", Options: []backlog.EnqueueOption{backlog.DependsOn(a, b)}},
	})
	require.NoError(t, err)

	var bAttempts atomic.Int32
	var mu sync.Mutex
	var got []string
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		switch job.Type {
		case "dag.a":
			if job.PrerequisiteIDs() != nil {
				return errors.New("a has no prerequisites")
			}
			ps, err := job.Prerequisites(ctx)
			if err != nil || ps != nil {
				return errors.New("a: Prerequisites should be nil")
			}
			var args struct{ N int }
			if err := json.Unmarshal(job.Args, &args); err != nil {
				return err
			}
			return job.SetResult(stepA{N: args.N})
		case "dag.b":
			if ids := job.PrerequisiteIDs(); len(ids) != 1 || ids[0] != a {
				return backlog.Permanent(errors.New("b: wrong prerequisites"))
			}
			ra, err := backlog.PrerequisiteResult[stepA](ctx, job, a)
			if err != nil {
				return backlog.Permanent(err)
			}
			if bAttempts.Add(1) == 1 {
				return errors.New("b fails once")
			}
			return job.SetResult(stepB{N: ra.N * 10, FromA: ra.N})
		case "dag.c":
			ps, err := job.Prerequisites(ctx)
			if err != nil {
				return backlog.Permanent(err)
			}
			mu.Lock()
			for _, p := range ps {
				got = append(got, p.Type+":"+string(p.State))
			}
			mu.Unlock()
			ra, err := backlog.PrerequisiteResultOfType[stepA](ctx, job, "dag.a")
			if err != nil {
				return backlog.Permanent(err)
			}
			rb, err := backlog.PrerequisiteResult[stepB](ctx, job, b)
			if err != nil {
				return backlog.Permanent(err)
			}
			if _, err := backlog.PrerequisiteResult[stepA](ctx, job, uuid.New()); !errors.Is(err, backlog.ErrNotFound) {
				return backlog.Permanent(errors.New("an unknown prerequisite must be ErrNotFound"))
			}
			if _, err := backlog.PrerequisiteResult[int](ctx, job, a); err == nil {
				return backlog.Permanent(errors.New("decoding into the wrong type must fail"))
			}
			return job.SetResult(stepC{Sum: ra.N + rb.N + rb.FromA})
		}
		return backlog.Permanent(errors.New("unknown type"))
	})
	stop := work(t, e.q, h, backlog.Types("dag.a", "dag.b", "dag.c"),
		backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}))
	defer func() { require.NoError(t, stop()) }()

	info := e.waitJob(c, 20*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	require.NoError(t, info.Err())
	var res stepC
	require.NoError(t, info.DecodeResult(&res))
	require.Equal(t, 7+70+7, res.Sum)
	require.EqualValues(t, 2, bAttempts.Load())
	bi, err := e.q.Job(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 2, bi.Attempt)
	mu.Lock()
	require.ElementsMatch(t, []string{"dag.a:completed", "dag.b:completed"}, got)
	mu.Unlock()
}

// TestPrerequisiteAlreadyCompleted: a job enqueued after its prerequisite
// completed lists it too, and reads its result.
func TestPrerequisiteAlreadyCompleted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if job.Type == "early" {
			return job.SetResult(stepA{N: 3})
		}
		r, err := backlog.PrerequisiteResultOfType[stepA](ctx, job, "early")
		if err != nil {
			return backlog.Permanent(err)
		}
		return job.SetResult(r.N + 1)
	})
	stop := work(t, e.q, h, backlog.Types("early", "late"))
	defer func() { require.NoError(t, stop()) }()
	a, err := e.q.Enqueue(ctx, "early", nil)
	require.NoError(t, err)
	e.waitState(a, 10*time.Second, backlog.StateCompleted)
	b, err := e.q.Enqueue(ctx, "late", nil, backlog.DependsOn(a))
	require.NoError(t, err)
	info := e.waitJob(b, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	require.NoError(t, info.Err())
	require.JSONEq(t, `4`, string(info.Result))
	// The same through the SQL enqueue().
	c, err := e.sqlEnqueue(e.pool, `'late', depends_on => ARRAY[$1::uuid]`, a)
	require.NoError(t, err)
	info = e.waitJob(c, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	require.NoError(t, info.Err())
	require.JSONEq(t, `4`, string(info.Result))
}

// TestPrerequisiteResultsOutliveRetention: with a retention of a
// millisecond, a prerequisite's row is retired and dropped from
// job_history (as a partition drop would) while its dependent still
// waits for another prerequisite; the dependent still reads the result.
// The cleaner keeps the copy while a live job needs it, and removes it
// once none does.
func TestPrerequisiteResultsOutliveRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithRetention(time.Millisecond, time.Millisecond))
	ctx := context.Background()
	gate := make(chan struct{})
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		switch job.Type {
		case "ret.first":
			return job.SetResult(stepA{N: 41})
		case "ret.gate":
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		r, err := backlog.PrerequisiteResultOfType[stepA](ctx, job, "ret.first")
		if err != nil {
			return backlog.Permanent(err)
		}
		return job.SetResult(r.N + 1)
	})
	stop := work(t, e.q, h, backlog.Types("ret.first", "ret.gate", "ret.dep"))
	defer func() { require.NoError(t, stop()) }()
	first, gated, dep := backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: first, Type: "ret.first"},
		{ID: gated, Type: "ret.gate"},
		{ID: dep, Type: "ret.dep", Options: []backlog.EnqueueOption{backlog.DependsOn(first, gated)}},
	})
	require.NoError(t, err)
	// first completes and leaves the hot table; its history row expires at
	// once. Its partition would be dropped the next UTC day: the test
	// deletes the row, as the drop would.
	e.waitCount(`id = '`+first.String()+`' AND expires_at IS NOT NULL`, 1, 20*time.Second)
	_, err = e.pool.Exec(ctx, `DELETE FROM "`+e.schema+`".job_history WHERE id = $1`, first)
	require.NoError(t, err)
	// The cleaner, even long after the copy was made, keeps what a live job
	// needs.
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".job_inputs SET kept_at = now() - interval '1 day'`)
	require.NoError(t, err)
	_, err = e.q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, e.countInputs())
	close(gate)
	info := e.waitJob(dep, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	require.NoError(t, info.Err())
	require.JSONEq(t, `42`, string(info.Result))

	// No live job needs it any more: the cleaner removes it once it was
	// last given out long enough ago.
	_, err = e.q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, e.countInputs(), "given out less than an hour ago")
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".job_inputs SET kept_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	r, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, r.Inputs)
	require.Zero(t, e.countInputs())
}

func (e *env) countInputs() int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".job_inputs`).Scan(&n))
	return n
}

// TestNoPrerequisitesNoStatement: for a job without dependencies the
// prerequisite calls read nothing; for one with dependencies, all of them
// together read once.
func TestNoPrerequisitesNoStatement(t *testing.T) {
	t.Parallel()
	e, tr := tracedEnv(t)
	ctx := context.Background()
	a, b := backlog.NewID(), backlog.NewID()
	_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: a, Type: "plain"},
		{ID: b, Type: "child", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}},
	})
	require.NoError(t, err)
	reads := map[string]int{}
	var mu sync.Mutex
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		m := tr.mark()
		for range 3 {
			if _, err := job.Prerequisites(ctx); err != nil {
				return err
			}
			if job.Type == "child" {
				if _, err := backlog.PrerequisiteResult[json.RawMessage](ctx, job, a); err != nil {
					return err
				}
			} else if _, err := backlog.PrerequisiteResult[json.RawMessage](ctx, job, a); !errors.Is(err, backlog.ErrNotFound) {
				return backlog.Permanent(errors.New("want ErrNotFound"))
			}
		}
		mu.Lock()
		// Reads only: the statements of other goroutines of the Queue that
		// write job_inputs (the cleaner, the retirer) may run meanwhile.
		n := 0
		for _, q := range tr.since(m, "job_inputs") {
			if !strings.Contains(q, "DELETE") && !strings.Contains(q, "INSERT") {
				n++
			}
		}
		reads[job.Type] = n
		mu.Unlock()
		return job.SetResult(1)
	})
	stop := work(t, e.q, h, backlog.Types("plain", "child"))
	defer func() { require.NoError(t, stop()) }()
	e.waitState(b, 10*time.Second, backlog.StateCompleted)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"plain": 0, "child": 1}, reads)
}

// TestRetriedDependentKeepsPrerequisites: a dependent that failed, moved
// to job_history and was retried by hand still gets its prerequisites.
func TestRetriedDependentKeepsPrerequisites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var runs atomic.Int32
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if job.Type == "rt.first" {
			return job.SetResult(stepA{N: 5})
		}
		r, err := backlog.PrerequisiteResultOfType[stepA](ctx, job, "rt.first")
		if err != nil {
			return backlog.Permanent(err)
		}
		if runs.Add(1) == 1 {
			return backlog.Permanent(errors.New("fails until retried by hand"))
		}
		return job.SetResult(r.N * 2)
	})
	stop := work(t, e.q, h, backlog.Types("rt.first", "rt.dep"))
	defer func() { require.NoError(t, stop()) }()
	first, dep := backlog.NewID(), backlog.NewID()
	_, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: first, Type: "rt.first"},
		{ID: dep, Type: "rt.dep", Options: []backlog.EnqueueOption{backlog.DependsOn(first), backlog.MaxAttempts(1)}},
	})
	require.NoError(t, err)
	e.waitCount(`id = '`+dep.String()+`' AND state = 'failed' AND expires_at IS NOT NULL`, 1, 10*time.Second)
	_, err = e.q.Retry(ctx, dep)
	require.NoError(t, err)
	info := e.waitState(dep, 10*time.Second, backlog.StateCompleted)
	require.JSONEq(t, `10`, string(info.Result))
}

// TestCompletedPrerequisitesNeverBlockEnqueues: two open transactions each
// give the results of two completed prerequisites to new dependents, in
// opposite orders. Recording a kept result only ever inserts, so neither
// waits for the other (an upsert of one row per prerequisite deadlocked
// here).
func TestCompletedPrerequisitesNeverBlockEnqueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	stop := work(t, e.q, backlog.HandlerFunc(func(_ context.Context, job *backlog.Job) error {
		return job.SetResult(job.Type)
	}), backlog.Types("p"))
	p1, err := e.q.Enqueue(ctx, "p", nil)
	require.NoError(t, err)
	p2, err := e.q.Enqueue(ctx, "p", nil)
	require.NoError(t, err)
	e.waitState(p1, 10*time.Second, backlog.StateCompleted)
	e.waitState(p2, 10*time.Second, backlog.StateCompleted)
	require.NoError(t, stop())

	a, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(ctx) }()
	b, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = b.Rollback(ctx) }()
	enqueue := func(tx pgx.Tx, prereq uuid.UUID) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := e.q.EnqueueTx(cctx, tx, "d", nil, backlog.DependsOn(prereq))
		require.NoError(t, err, "an enqueue waited for another transaction's kept result")
	}
	enqueue(a, p1)
	enqueue(b, p2)
	enqueue(a, p2)
	enqueue(b, p1)
	require.NoError(t, a.Commit(ctx))
	require.NoError(t, b.Commit(ctx))
	require.Equal(t, 4, e.countLive("type = 'd' AND cardinality(prereqs) = 1"))
}
