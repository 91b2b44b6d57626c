package backlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestEveryMethodAfterCloseReturnsErrClosed holds ErrClosed's doc to its
// word.
func TestEveryMethodAfterCloseReturnsErrClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	q := e.queue(e.pool)
	require.NoError(t, q.Close())
	id := uuid.New()
	h := backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil })
	calls := map[string]func() error{
		"Migrate":        func() error { return q.Migrate(ctx) },
		"Enqueue":        func() error { _, err := q.Enqueue(ctx, "t", nil); return err },
		"EnqueueMany":    func() error { _, err := q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "t"}}); return err },
		"InsertMany":     func() error { _, err := q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "t"}}); return err },
		"Work":           func() error { return q.Work(ctx, h, backlog.Types("t")) },
		"Job":            func() error { _, err := q.Job(ctx, id); return err },
		"Cancel":         func() error { _, err := q.Cancel(ctx, id); return err },
		"Wait":           func() error { _, err := q.Wait(ctx, id); return err },
		"Stats":          func() error { _, err := q.Stats(ctx); return err },
		"ReadPoolStatus": func() error { _, err := q.ReadPoolStatus(ctx); return err },
		"SweepExpired":   func() error { _, err := q.SweepExpired(ctx); return err },
		"Clean":          func() error { _, err := q.Clean(ctx); return err },
		"Every":          func() error { return q.Every("s", time.Hour, "t", nil) },
		"Cron":           func() error { return q.Cron("c", "@hourly", "t", nil) },
		"Close (again)":  func() error { return errors.Join(q.Close(), backlog.ErrClosed) },
	}
	for name, call := range calls {
		require.ErrorIs(t, call(), backlog.ErrClosed, name)
	}
}

// TestUnmigratedSchemaIsNamed: forgetting Migrate gives ErrNotMigrated, from
// Enqueue, Job and Work (which returns at once instead of retrying).
func TestUnmigratedSchemaIsNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, err := backlog.New(ctx, testdb.Pool(t), backlog.WithSchema(testdb.Schema(t)), backlog.WithLogger(logger(t)))
	require.NoError(t, err)
	defer q.Close()
	_, err = q.Enqueue(ctx, "t", nil)
	require.ErrorIs(t, err, backlog.ErrNotMigrated)
	require.ErrorContains(t, err, "Migrate")
	// The CLI command it names works on this schema, not the default one.
	require.ErrorContains(t, err, "`backlog --schema "+q.Schema()+" migrate up`")
	require.Equal(t, "backlog migrate up", backlog.MigrateHint(backlog.DefaultSchema))
	_, err = q.Job(ctx, uuid.New())
	require.ErrorIs(t, err, backlog.ErrNotMigrated)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("t"))
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, backlog.ErrNotMigrated)
	case <-time.After(10 * time.Second):
		t.Fatal("Work kept running on an unmigrated schema")
	}
	require.NoError(t, q.Migrate(ctx))
	_, err = q.Enqueue(ctx, "t", nil)
	require.NoError(t, err)
}

// TestJobInfoErrAndResult: a retried-then-completed job shows no stale
// current error (its history keeps it); Err and DecodeResult tell the
// outcome; a handler returning the cancel cause is not double-wrapped.
func TestJobInfoErrAndResult(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("flaky", func(ctx context.Context, job *backlog.Job) error {
		if job.Attempt == 1 {
			return errors.New("printer on fire")
		}
		return job.SetResult(map[string]int{"pages": 3})
	}, backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond}))
	mux.HandleFunc("fails", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("no")) })
	started := make(chan struct{}, 1)
	mux.HandleFunc("cancelled", func(ctx context.Context, job *backlog.Job) error {
		started <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	work(t, e.q, mux)

	id, err := e.q.Enqueue(ctx, "flaky", nil)
	require.NoError(t, err)
	info, err := e.q.Wait(ctx, id)
	require.NoError(t, err)
	require.NoError(t, info.Err())
	require.Empty(t, info.LastError, "a completed job shows no current error")
	require.Len(t, info.Errors, 1)
	require.Equal(t, "printer on fire", info.Errors[0].Error)
	var res struct{ Pages int }
	require.NoError(t, info.DecodeResult(&res))
	require.Equal(t, 3, res.Pages)

	id, err = e.q.Enqueue(ctx, "fails", nil)
	require.NoError(t, err)
	info, err = e.q.Wait(ctx, id)
	require.NoError(t, err)
	require.ErrorIs(t, info.Err(), backlog.ErrJobFailed)
	require.Error(t, info.DecodeResult(&res))

	id, err = e.q.Enqueue(ctx, "cancelled", nil)
	require.NoError(t, err)
	<-started
	_, err = e.q.Cancel(ctx, id)
	require.NoError(t, err)
	info, err = e.q.Wait(ctx, id)
	require.NoError(t, err)
	require.ErrorIs(t, info.Err(), backlog.ErrCancelled)
	require.Equal(t, "backlog: job cancelled", info.LastError, "the cause is recorded once, not wrapped in itself")

	pending, err := e.q.Enqueue(ctx, "nobody", nil)
	require.NoError(t, err)
	info, err = e.q.Job(ctx, pending)
	require.NoError(t, err)
	require.ErrorIs(t, info.Err(), backlog.ErrNotFinished)
}

func TestNilHandlerFuncRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var f backlog.HandlerFunc
	err := e.q.Work(context.Background(), f, backlog.Types("t"))
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "handler", ie.Field)
}
