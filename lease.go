package backlog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// A lease is a worker's right to run one attempt of a job: the claim sets
// jobs.lease_token to a fresh UUID and jobs.lease_expires_at to the
// database's now() + the lease duration. The lease token fences every later
// write: a heartbeat extends, and a finish writes, only the row whose
// (id, lease_token, state = 'running') still match. Once a lease has expired
// the sweep may hand the job to another worker under a new token, after
// which every write of the old holder changes nothing.
//
// leases is the registry of the leases this Queue holds, renewed by one
// heartbeat loop.
type leases struct {
	store    *store.Store
	log      *slog.Logger
	duration time.Duration
	margin   time.Duration // cancel this long before the lease could expire

	mu   sync.Mutex
	held map[uuid.UUID]*lease
}

type lease struct {
	id, token uuid.UUID
	// deadline is the local (monotonic) time until which the lease is
	// certainly ours: the send time of the last successful claim or
	// renewal, plus the lease, minus the margin. The database's now() at
	// that statement was later than the send time, so its expiry is later
	// than deadline + margin.
	deadline time.Time
	cancel   context.CancelCauseFunc // set once the handler runs
	lost     bool                    // the lease is gone: no write will be accepted
	done     bool                    // the outcome is queued for the completer
	stop     error                   // why the handler must stop (ErrLeaseLost, ErrCancelled), once it must
}

func newLeases(st *store.Store, log *slog.Logger, d time.Duration) *leases {
	return &leases{store: st, log: log, duration: d, margin: d / 5, held: map[uuid.UUID]*lease{}}
}

// add registers freshly claimed jobs; sentAt is when the claim was sent.
func (l *leases) add(jobs []*Job, sentAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, j := range jobs {
		l.held[j.ID] = &lease{id: j.ID, token: j.token, deadline: sentAt.Add(l.duration - l.margin)}
	}
}

// start attaches the handler's cancel function. It returns why the
// handler must not run when that was decided before it started.
func (l *leases) start(id, token uuid.UUID, cancel context.CancelCauseFunc) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	le := l.held[id]
	if le == nil || le.token != token {
		return ErrLeaseLost
	}
	if le.stop != nil {
		return le.stop
	}
	le.cancel = cancel
	return nil
}

// finishing notes that the attempt's outcome has been handed to the
// completer: from now on a renewal that misses the row most likely means the
// outcome was just written, which is no reason to warn.
func (l *leases) finishing(id, token uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if le := l.held[id]; le != nil && le.token == token {
		le.done = true
	}
}

// isLost reports whether the lease of one attempt is gone.
func (l *leases) isLost(id, token uuid.UUID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	le := l.held[id]
	return le == nil || le.token != token || le.lost
}

// remove forgets the lease of one attempt once its finish was written (or
// refused). The job may already be held again under a newer token (a fast
// retry): that lease stays.
func (l *leases) remove(id, token uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if le := l.held[id]; le != nil && le.token == token {
		delete(l.held, id)
	}
}

// stopLocked cancels the handler with cause (the first cause wins).
func (l *leases) stopLocked(le *lease, cause error) {
	if le.stop != nil {
		return
	}
	le.stop = cause
	if le.cancel != nil {
		le.cancel(cause)
	}
}

func (l *leases) loseLocked(le *lease) {
	le.lost = true
	l.stopLocked(le, ErrLeaseLost)
}

// heartbeat renews every held lease in one statement. Leases the database no
// longer matches are lost: their handlers are cancelled with ErrLeaseLost.
// Whether or not the statement succeeds, leases past their local deadline
// are lost too, so a worker cut off from the database stops its handlers
// before another worker could be given the same attempt. It returns whether
// the renewal succeeded.
func (l *leases) heartbeat(ctx context.Context) bool {
	l.mu.Lock()
	ids := make([]uuid.UUID, 0, len(l.held))
	tokens := make([]uuid.UUID, 0, len(l.held))
	for _, le := range l.held {
		if !le.lost {
			ids = append(ids, le.id)
			tokens = append(tokens, le.token)
		}
	}
	l.mu.Unlock()

	ok := true
	if len(ids) > 0 {
		sentAt := time.Now()
		// Give up on the renewal by the earliest local deadline: the check
		// below must not wait for a statement that cannot reach the
		// database (a blocked call would otherwise delay the cancellation
		// past the lease's expiry in the database).
		l.mu.Lock()
		stop := sentAt.Add(l.duration / 3)
		for _, le := range l.held {
			if !le.lost && le.deadline.Before(stop) {
				stop = le.deadline
			}
		}
		l.mu.Unlock()
		cctx, cancel := context.WithDeadline(ctx, stop)
		alive, err := l.store.Extend(cctx, ids, tokens, l.duration)
		cancel()
		l.mu.Lock()
		if err != nil {
			ok = false
			if ctx.Err() == nil {
				l.log.Warn("backlog: renewing leases failed", "leases", len(ids), "err", err)
			}
		} else {
			still := make(map[uuid.UUID]bool, len(alive))
			for _, e := range alive {
				still[e.ID] = true
				if le := l.held[e.ID]; le != nil && e.Renewed {
					le.deadline = sentAt.Add(l.duration - l.margin)
					if e.CancelRequested {
						l.stopLocked(le, ErrCancelled)
					}
				}
			}
			for i, id := range ids {
				if le := l.held[id]; le != nil && le.token == tokens[i] && !still[id] {
					if !le.done {
						l.log.Warn("backlog: lease lost", "job", id)
					}
					l.loseLocked(le)
				}
			}
		}
		l.mu.Unlock()
	}
	l.expire(time.Now())
	return ok
}

// cancel stops the handler of a job cancelled with Queue.Cancel, if this
// process holds it. The lease stays held, so the outcome is still written.
func (l *leases) cancel(id uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if le := l.held[id]; le != nil {
		l.stopLocked(le, ErrCancelled)
	}
}

// expire loses every lease whose local deadline has passed.
func (l *leases) expire(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, le := range l.held {
		if !le.lost && now.After(le.deadline) {
			l.log.Warn("backlog: lease could not be renewed in time; cancelling the handler", "job", le.id)
			l.loseLocked(le)
		}
	}
}

// run renews leases every duration/3 until ctx ends; after a failed renewal
// it retries every duration/30 so that local deadlines are checked often.
func (l *leases) run(ctx context.Context) {
	every, retry := l.duration/3, max(l.duration/30, 10*time.Millisecond)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if l.heartbeat(ctx) {
			t.Reset(every)
		} else {
			t.Reset(retry)
		}
	}
}
