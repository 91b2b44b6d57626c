package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// TestProgress: a tight loop of SetProgress calls costs a handful of
// statements; the value shows while the job runs and after it ended; bad
// values are refused.
func TestProgress(t *testing.T) {
	t.Parallel()
	e, tr := tracedEnv(t)
	ctx := context.Background()
	id, err := e.q.Enqueue(ctx, "prog", nil)
	require.NoError(t, err)
	shown, looped := make(chan struct{}), make(chan struct{})
	var loopWrites, loopAll atomic.Int32
	var loopTook atomic.Int64
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		var bad *backlog.InputError
		if err := job.SetProgress(ctx, make(chan int)); !errors.As(err, &bad) || bad.Field != "progress" {
			return backlog.Permanent(errors.New("a value that does not marshal must be refused"))
		}
		if err := job.SetProgress(ctx, strings.Repeat("x", backlog.MaxProgressBytes)); !errors.Is(err, backlog.ErrInvalid) {
			return backlog.Permanent(errors.New("a value too large must be refused"))
		}
		if err := job.SetProgress(ctx, "a\u0000b"); !errors.Is(err, backlog.ErrInvalid) {
			return backlog.Permanent(errors.New("a NUL must be refused"))
		}
		if err := job.SetProgress(ctx, json.RawMessage(`{`)); !errors.Is(err, backlog.ErrInvalid) {
			return backlog.Permanent(errors.New("invalid JSON must be refused"))
		}
		m, began := tr.mark(), time.Now()
		for i := range 100_000 {
			if err := job.SetProgress(ctx, map[string]int{"done": i + 1, "of": 100_000}); err != nil {
				return err
			}
		}
		loopTook.Store(int64(time.Since(began)))
		loopWrites.Store(int32(len(tr.since(m, "progress = COALESCE(t.progress"))))
		loopAll.Store(int32(len(tr.since(m, "lease_expires_at = now() +"))))
		close(looped)
		select {
		case <-shown:
		case <-ctx.Done():
			return ctx.Err()
		}
		return job.SetProgress(ctx, map[string]any{"done": "all"})
	})
	stop := work(t, e.q, h, backlog.Types("prog"))
	defer func() { require.NoError(t, stop()) }()
	<-looped
	// Written by a renewal while the handler waits.
	e.waitJob(id, 10*time.Second, func(i *backlog.JobInfo) bool {
		return i.Progress != nil && string(i.Progress) == `{"of": 100000, "done": 100000}`
	})
	m := tr.mark()
	close(shown)
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.JSONEq(t, `{"done": "all"}`, string(info.Progress), "the last value, written with the finish")
	// At most one renewal a second while the value changes (plus the
	// regular ones: a third of the default lease), whatever the number of
	// calls. The loop takes a fraction of a second, more under -race on a
	// busy machine.
	took := time.Duration(loopTook.Load())
	most := int32(2 + took/time.Second)
	t.Logf("100,000 calls took %s: %d renewals, %d with progress", took, loopAll.Load(), loopWrites.Load())
	require.LessOrEqual(t, loopWrites.Load(), most, "statements writing progress during 100,000 calls")
	require.LessOrEqual(t, loopAll.Load(), most, "lease renewals during 100,000 calls")
	require.Empty(t, tr.since(m, "progress = COALESCE(t.progress"), "the last value costs no renewal of its own")

	// In job_history, and in List.
	res, err := e.q.List(ctx, backlog.Filter{IDs: []uuid.UUID{id}}, backlog.ListOptions{})
	require.NoError(t, err)
	require.Len(t, res.Jobs, 1)
	require.JSONEq(t, `{"done": "all"}`, string(res.Jobs[0].Progress))
	require.Equal(t, 1, e.count(`id = $1 AND progress IS NOT NULL AND expires_at IS NOT NULL`, id))
}

// TestProgressStaleWorker: once another worker holds the job, the old
// holder's progress is not written, and SetProgress refuses once the loss
// is known.
func TestProgressStaleWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithLease(1500*time.Millisecond))
	ctx := context.Background()
	id, err := e.q.Enqueue(ctx, "stale", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	stolen := make(chan struct{})
	refused := make(chan error, 1)
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if err := job.SetProgress(ctx, "mine"); err != nil {
			return err
		}
		<-stolen
		if err := job.SetProgress(ctx, "stale"); err != nil { // not known lost yet: accepted here, fenced there
			return err
		}
		<-ctx.Done()
		refused <- job.SetProgress(ctx, "later")
		return ctx.Err()
	})
	stop := work(t, e.q, h, backlog.Types("stale"))
	defer func() { require.NoError(t, stop()) }()
	e.waitJob(id, 10*time.Second, func(i *backlog.JobInfo) bool { return string(i.Progress) == `"mine"` })
	// Another worker's lease.
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET lease_token = gen_random_uuid() WHERE id = $1`, id)
	require.NoError(t, err)
	close(stolen)
	select {
	case err := <-refused:
		require.ErrorIs(t, err, backlog.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not told that its lease was lost")
	}
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, `"mine"`, string(info.Progress))
	require.Equal(t, backlog.StateRunning, info.State)
}

// TestRetryStartsWithoutProgress: an attempt starts with no progress, so a
// retry does not show (or keep in history) the previous attempt's.
func TestRetryStartsWithoutProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	running := make(chan struct{})
	checked := make(chan struct{})
	stop := work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if job.Attempt == 1 {
			require.NoError(t, job.SetProgress(ctx, map[string]int{"step": 1}))
			return errors.New("first attempt fails")
		}
		close(running)
		<-checked
		return nil
	}), backlog.Types("prog"), backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: time.Millisecond}))
	defer func() { require.NoError(t, stop()) }()
	id, err := e.q.Enqueue(ctx, "prog", nil)
	require.NoError(t, err)
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the retry did not start")
	}
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 2, info.Attempt)
	require.Nil(t, info.Progress, "the second attempt shows the first attempt's progress")
	close(checked)
	info = e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Nil(t, info.Progress)
}
