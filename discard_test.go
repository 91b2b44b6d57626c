package backlog_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// WithDiscardCompleted deletes at completion the completed jobs of its
// types that nobody needs kept, and keeps every other finished job: one
// with a result, one a Wait had begun on, one with a dependent (which
// reads its result), a failed one, and the jobs of other types. The
// per-minute counters count the deleted jobs too.
func TestDiscardCompleted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithDiscardCompleted("disc"))
	ctx := context.Background()

	plain, err := e.q.Enqueue(ctx, "disc", map[string]string{"do": "nothing"})
	require.NoError(t, err)
	withResult, err := e.q.Enqueue(ctx, "disc", map[string]string{"do": "result"})
	require.NoError(t, err)
	failing, err := e.q.Enqueue(ctx, "disc", map[string]string{"do": "fail"}, backlog.MaxAttempts(1))
	require.NoError(t, err)
	waited, err := e.q.Enqueue(ctx, "disc", map[string]string{"do": "hold"})
	require.NoError(t, err)
	pre, err := e.q.Enqueue(ctx, "disc", map[string]string{"do": "nothing"})
	require.NoError(t, err)
	dep, err := e.q.Enqueue(ctx, "keep", nil, backlog.DependsOn(pre))
	require.NoError(t, err)
	other, err := e.q.Enqueue(ctx, "keep", nil)
	require.NoError(t, err)

	release := make(chan struct{})
	var depSaw atomic.Value
	mux := backlog.NewMux()
	mux.Handle("disc", backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a map[string]string) error {
		switch a["do"] {
		case "result":
			return job.SetResult(map[string]int{"n": 1})
		case "fail":
			return errors.New("boom")
		case "hold":
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
	mux.HandleFunc("keep", func(ctx context.Context, job *backlog.Job) error {
		if job.ID == dep {
			ps, err := job.Prerequisites(ctx)
			if err != nil {
				return err
			}
			depSaw.Store(ps)
		}
		return nil
	})
	work(t, e.q, mux)

	// A Wait that began before the job completed keeps it.
	e.waitState(waited, 10*time.Second, backlog.StateRunning)
	waitDone := make(chan *backlog.JobInfo, 1)
	waitErr := make(chan error, 1)
	go func() {
		info, err := e.q.Wait(ctx, waited)
		waitErr <- err
		waitDone <- info
	}()
	// Wait marks the job before it blocks: hold the job until it has.
	require.Eventually(t, func() bool { return e.countLive("id = $1 AND notify_done", waited) == 1 },
		10*time.Second, 5*time.Millisecond, "Wait did not mark the job")
	close(release)
	require.NoError(t, <-waitErr)
	require.Equal(t, backlog.StateCompleted, (<-waitDone).State)

	for _, id := range []struct {
		id    uuid.UUID
		state backlog.State
	}{{withResult, backlog.StateCompleted}, {failing, backlog.StateFailed}, {pre, backlog.StateCompleted},
		{dep, backlog.StateCompleted}, {other, backlog.StateCompleted}, {waited, backlog.StateCompleted}} {
		e.waitState(id.id, 10*time.Second, id.state)
	}
	info, err := e.q.Job(ctx, withResult)
	require.NoError(t, err)
	require.JSONEq(t, `{"n": 1}`, string(info.Result))
	ps, _ := depSaw.Load().([]backlog.Prerequisite)
	require.Len(t, ps, 1, "the dependent read its prerequisite")
	require.Equal(t, backlog.StateCompleted, ps[0].State)

	// The plain one is gone: not in jobs, not in job_history.
	require.Eventually(t, func() bool { return e.count("id = $1", plain) == 0 && e.countLive("id = $1", plain) == 0 },
		10*time.Second, 10*time.Millisecond, "the plain job was not deleted")
	_, err = e.q.Job(ctx, plain)
	require.ErrorIs(t, err, backlog.ErrNotFound)

	// Counted all the same: four disc jobs completed (the deleted one too),
	// one failed.
	// Jobs finished in place (a dependent's prerequisite) are counted when
	// the retirer moves them.
	require.Eventually(t, func() bool {
		st, err := e.q.Stats(ctx)
		if err != nil {
			return false
		}
		return st.ByType["disc"][backlog.StateCompleted] == 4 && st.ByType["disc"][backlog.StateFailed] == 1 &&
			st.ByType["keep"][backlog.StateCompleted] == 2
	}, 20*time.Second, 10*time.Millisecond, "the counts never reached 4 completed and 1 failed disc jobs, 2 completed keep jobs")
}

// Every type: WithDiscardCompleted() with no types.
func TestDiscardCompletedEveryType(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithDiscardCompleted())
	ctx := context.Background()
	specs := make([]backlog.JobSpec, 50)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: []string{"a", "b"}[i%2]}
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("a", "b"))
	require.Eventually(t, func() bool {
		st, err := e.q.Stats(ctx)
		return err == nil && st.ByState[backlog.StateCompleted] == 50
	}, 20*time.Second, 10*time.Millisecond, "not all 50 completions were counted")
	require.Zero(t, e.count("true"), "completed jobs were kept")
}

func TestDiscardCompletedRefusesBadTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := backlog.New(context.Background(), e.pool, backlog.WithSchema(e.schema), backlog.WithDiscardCompleted("ok", ""))
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "discard completed", ie.Field)
}

// A job enqueued after its prerequisite was deleted at completion is
// refused with an *InputError that says why (the prerequisite is gone),
// and nothing is written; in the same batch the dependent is kept waiting
// and runs.
func TestDiscardCompletedAndLaterDependents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithDiscardCompleted("pre"))
	ctx := context.Background()
	pre, err := e.q.Enqueue(ctx, "pre", nil)
	require.NoError(t, err)
	batch := []backlog.JobSpec{{ID: backlog.NewID(), Type: "pre"}}
	batch = append(batch, backlog.JobSpec{Type: "dep", Options: []backlog.EnqueueOption{backlog.DependsOn(batch[0].ID)}})
	ids, err := e.q.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("pre", "dep"))
	e.waitState(ids[1], 10*time.Second, backlog.StateCompleted)
	e.waitState(ids[0], 10*time.Second, backlog.StateCompleted) // kept: it had a dependent
	require.Eventually(t, func() bool { return e.count("id = $1", pre) == 0 && e.countLive("id = $1", pre) == 0 },
		10*time.Second, 10*time.Millisecond, "the prerequisite without dependents was not deleted")

	before := e.count("true")
	_, err = e.q.Enqueue(ctx, "dep", nil, backlog.DependsOn(pre))
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "depends on", ie.Field)
	require.Contains(t, ie.Reason, "WithDiscardCompleted")
	require.Equal(t, before, e.count("true"), "nothing written")
}
