package backlog

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
)

// Errors of the operator actions.
var (
	// ErrRunning is returned by Retry and Delete for a running job: cancel
	// it (Cancel) and act once it has finished.
	ErrRunning = errors.New("backlog: the job is running")
	// ErrBlocked is returned by Retry for a job that waits for its
	// prerequisites.
	ErrBlocked = errors.New("backlog: the job waits for its prerequisites")
	// ErrUniqueKeyHeld is returned by Retry when another live job holds the
	// job's unique key.
	ErrUniqueKeyHeld = errors.New("backlog: another live job holds the job's unique key")
	// ErrPrerequisiteFailed is returned by Retry for a job one of whose
	// prerequisites (DependsOn) failed or was cancelled and has not been
	// retried: retry that one first (the error names it), then the job,
	// which then waits for it.
	ErrPrerequisiteFailed = errors.New("backlog: a prerequisite of the job failed or was cancelled; retry it first")
)

// bulkPage is how many jobs a bulk action handles per batch.
const bulkPage = 500

// Cancel cancels a job and returns its state after the call:
//
//   - StateCancelled: the job was blocked or available and is cancelled now;
//     its dependents are cancelled too.
//   - StateRunning: the job is running; its handler's context is cancelled
//     (cause ErrCancelled) within moments (a NOTIFY to the process holding
//     it, with the heartbeat as backup), and it ends cancelled unless it
//     completes first.
//   - StateCompleted, StateFailed or StateCancelled of a job that had
//     already finished: nothing changed.
//
// An unknown ID returns ErrNotFound.
func (q *Queue) Cancel(ctx context.Context, id uuid.UUID) (State, error) {
	if q.isClosed() {
		return "", ErrClosed
	}
	out, err := q.store.Cancel(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if errors.Is(err, store.ErrGraphContention) {
		return "", &retryableError{err: fmt.Errorf("cancelling job %s: %w", id, err)}
	}
	if err != nil {
		return "", q.readErr(ctx, fmt.Errorf("cancelling job %s: %w", id, err))
	}
	q.announce.committed(posting.OfAvail(out.Avail))
	if out.State == string(StateCancelled) {
		q.maint.RetireSoon() // written in place, with its dependents
	}
	if out.Requested {
		// In poll-only mode no NOTIFY arrives; stop a local handler now.
		q.leases.cancel(id)
	}
	return State(out.State), nil
}

// Retry runs a finished (completed, failed or cancelled) job again and
// returns its new state: available, due now, or blocked when it must
// wait: behind the live jobs of its ordering key (at the end of its key's
// queue), and for those of its prerequisites (DependsOn) that are live
// again because they were retried (it is released when they complete,
// and reads their results as a dependent does). Its attempts and error
// history are kept, one more attempt is granted when they are used up,
// and its result is cleared. A scheduled or available job is made due
// now. Jobs that the job's failure cancelled (its dependents) stay
// cancelled: retry them too, after it. A running job returns ErrRunning,
// a blocked one ErrBlocked, an unknown one ErrNotFound, ErrUniqueKeyHeld
// when another live job took the job's unique key meanwhile, and
// ErrPrerequisiteFailed when one of its prerequisites failed or was
// cancelled and has not been retried (nothing changes: retry the
// prerequisite first). A prerequisite whose record is gone (deleted, or
// past its retention) does not hold the job back.
func (q *Queue) Retry(ctx context.Context, id uuid.UUID) (State, error) {
	if q.isClosed() {
		return "", ErrClosed
	}
	out, err := q.store.Retry(ctx, id)
	if err != nil {
		return "", q.actionErr(ctx, "retrying", id, err)
	}
	q.announce.committed(posting.OfAvail(out.Avail))
	return State(out.State), nil
}

// Delete removes a job that is not running, live or finished. A blocked,
// scheduled or available job is cancelled first, as Cancel does: its
// dependents are cancelled, and its ordering key's chain closes up behind
// it. A running job returns ErrRunning (cancel it first), an unknown one
// ErrNotFound.
func (q *Queue) Delete(ctx context.Context, id uuid.UUID) error {
	if q.isClosed() {
		return ErrClosed
	}
	out, err := q.store.Delete(ctx, id)
	if err != nil {
		return q.actionErr(ctx, "deleting", id, err)
	}
	q.announce.committed(posting.OfAvail(out.Avail))
	return nil
}

// actionErr maps the store's errors of an action on one job.
func (q *Queue) actionErr(ctx context.Context, what string, id uuid.UUID, err error) error {
	var pe *store.PrerequisiteError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s job %s: prerequisite %s %s: %w", what, id, pe.ID, pe.State, ErrPrerequisiteFailed)
	}
	for _, m := range []struct{ from, to error }{
		{store.ErrNotFound, ErrNotFound}, {store.ErrRunning, ErrRunning}, {store.ErrBlocked, ErrBlocked},
		{store.ErrUniqueKeyHeld, ErrUniqueKeyHeld},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%s job %s: %w", what, id, m.to)
		}
	}
	if errors.Is(err, store.ErrGraphContention) {
		return &retryableError{err: fmt.Errorf("%s job %s: %w", what, id, err)}
	}
	return q.readErr(ctx, fmt.Errorf("%s job %s: %w", what, id, err))
}

// RetryWhere retries (as Retry does) the finished jobs f selects, and
// returns how many it retried. f.States may name completed, failed and
// cancelled; it defaults to failed and cancelled. It works through the
// jobs in batches of a few hundred, each its own statement, so workers go
// on meanwhile; jobs that change under it (a retried job's unique key
// taken again, say) are skipped. It keeps the graph's order whatever
// order it meets the jobs in: a dependent met before its failed
// prerequisite is retried after it, and waits for it; a dependent whose
// failed or cancelled prerequisite f does not select is skipped
// (ErrPrerequisiteFailed).
func (q *Queue) RetryWhere(ctx context.Context, f Filter) (int, error) {
	f, err := restrictStates(f, "retry", []State{StateFailed, StateCancelled},
		[]State{StateCompleted, StateFailed, StateCancelled})
	if err != nil {
		return 0, err
	}
	// Dependents refused because a prerequisite has not been retried yet
	// are tried again once the pages are done, as long as a pass retries
	// some (each pass is a level further down the graph).
	var later []uuid.UUID
	n, err := q.bulk(ctx, f, q.store.RetryBatch, func(id uuid.UUID) error {
		_, err := q.Retry(ctx, id)
		if errors.Is(err, ErrPrerequisiteFailed) {
			later = append(later, id)
		}
		return err
	})
	for err == nil && len(later) > 0 {
		again := later
		later = nil
		for _, id := range again {
			switch _, rerr := q.Retry(ctx, id); {
			case rerr == nil:
				n++
			case errors.Is(rerr, ErrPrerequisiteFailed):
				later = append(later, id)
			case skippable(rerr):
			default:
				return n, rerr
			}
		}
		if len(later) == len(again) {
			break
		}
	}
	return n, err
}

// skippable reports whether a bulk action's error on one job means the job
// changed meanwhile (or must wait), so it is skipped.
func skippable(err error) bool {
	for _, e := range []error{ErrNotFound, ErrRunning, ErrBlocked, ErrUniqueKeyHeld, ErrPrerequisiteFailed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// CancelWhere cancels (as Cancel does) the live jobs f selects, and
// returns how many it cancelled or asked to stop (running ones). f.States
// may name blocked, scheduled, available and running; it defaults to all
// four.
func (q *Queue) CancelWhere(ctx context.Context, f Filter) (int, error) {
	f, err := restrictStates(f, "cancel", []State{StateBlocked, StateScheduled, StateAvailable, StateRunning},
		[]State{StateBlocked, StateScheduled, StateAvailable, StateRunning})
	if err != nil {
		return 0, err
	}
	return q.bulk(ctx, f, q.store.CancelBatch, func(id uuid.UUID) error {
		_, err := q.Cancel(ctx, id)
		return err
	})
}

// DeleteWhere deletes (as Delete does) the jobs f selects that are not
// running, and returns how many it deleted. f.States may name every state
// but running; it defaults to all of them.
func (q *Queue) DeleteWhere(ctx context.Context, f Filter) (int, error) {
	all := []State{StateBlocked, StateScheduled, StateAvailable, StateCompleted, StateFailed, StateCancelled}
	f, err := restrictStates(f, "delete", all, all)
	if err != nil {
		return 0, err
	}
	return q.bulk(ctx, f, q.store.DeleteBatch, func(id uuid.UUID) error { return q.Delete(ctx, id) })
}

// restrictStates checks f.States against the states an action applies
// to, and fills in its default.
func restrictStates(f Filter, action string, def, allowed []State) (Filter, error) {
	if len(f.States) == 0 {
		f.States = def
		return f, nil
	}
	for _, s := range f.States {
		if !slices.Contains(allowed, s) {
			return f, invalid("states", "cannot %s %s jobs", action, s)
		}
	}
	return f, nil
}

// bulk applies an action to every job f selects, a page at a time: batch
// handles the jobs one statement can, one handles the rest singly. Jobs
// that one refuses because they changed meanwhile are skipped.
func (q *Queue) bulk(ctx context.Context, f Filter, batch func(context.Context, store.Batch) (store.BatchOutcome, error),
	one func(uuid.UUID) error) (int, error) {
	if q.isClosed() {
		return 0, ErrClosed
	}
	n := 0
	opts := ListOptions{Limit: bulkPage, Oldest: true}
	for {
		page, err := q.listFrom(ctx, q.store, f, opts)
		if err != nil {
			return n, err
		}
		if len(page.Jobs) > 0 {
			var b store.Batch
			for _, j := range page.Jobs {
				b.Add(j.ID, j.FinishedAt, string(j.State))
			}
			ids := b.IDs
			out, err := batch(ctx, b)
			if err != nil {
				return n, q.readErr(ctx, fmt.Errorf("bulk action: %w", err))
			}
			n += len(out.Done)
			q.announce.committed(posting.OfAvail(out.Avail))
			if len(out.Done) > 0 {
				q.maint.RetireSoon()
			}
			done := make(map[uuid.UUID]bool, len(out.Done))
			for _, id := range out.Done {
				done[id] = true
			}
			for _, id := range ids {
				if done[id] {
					continue
				}
				switch err := one(id); {
				case err == nil:
					n++
				case skippable(err):
				default:
					return n, err
				}
			}
		}
		if page.Next == "" {
			return n, nil
		}
		opts.Cursor = page.Next
	}
}
