package backlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// Wait blocks until the job reaches a terminal state and returns its
// record, or returns ctx's error. A nil error means the wait succeeded, not
// the job: info.Err() tells whether it completed. It is woken by a notification when the job
// finishes, and polls as a backup (every second, or the backup poll interval
// if shorter).
func (q *Queue) Wait(ctx context.Context, id uuid.UUID) (*JobInfo, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, ErrClosed
	}
	q.startLocked(q.listen.start)
	ch := q.waiters.Add(id)
	q.mu.Unlock()
	defer q.waiters.Remove(id, ch)

	w, err := q.markWaiting(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("waiting for job %s: %w", id, err))
	}
	if w.Avail != nil {
		// The mark locked the job for an instant: a claim may have
		// skipped it and parked.
		q.announce.committed(posting.OfAvail([]store.Avail{*w.Avail}))
	}
	state := State(w.State)
	every := min(time.Second, q.cfg.pollInterval)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var info *JobInfo
	for {
		if state.Terminal() {
			if info != nil {
				return info, nil
			}
			// A poll that fails for a transient reason is tried again at
			// the next tick: the job is still worth waiting for.
		} else {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-q.closing:
				return nil, ErrClosed
			case <-ch:
			case <-tick.C:
			}
		}
		var err error
		info, err = q.jobFrom(ctx, q.store, id) // the primary, never the read pool: it has the outcome first
		switch {
		case err == nil:
			state = info.State
		case errors.Is(err, ErrRetryable) && ctx.Err() == nil:
			q.log.Debug("backlog: polling a waited-for job failed; polling again", "job", id, "err", err)
			info, state = nil, ""
		default:
			return nil, err
		}
	}
}

// markWaiting asks for the job's completion notice, trying again while the
// database fails for a transient reason and ctx lasts.
func (q *Queue) markWaiting(ctx context.Context, id uuid.UUID) (store.Waiting, error) {
	b := run.NewBackoff(50*time.Millisecond, time.Second)
	for {
		w, err := q.store.MarkWaiting(ctx, id)
		if err == nil || !pgerr.Transient(err) || ctx.Err() != nil {
			return w, err
		}
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return w, err
		case <-t.C:
		}
	}
}
