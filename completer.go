package backlog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// maxFinishBatch bounds one finish statement.
const maxFinishBatch = 2000

// completer writes job outcomes. One goroutine writes everything that queued
// up while its previous write was in flight, in one statement: group commit
// with no fixed delay. Each write is fenced by lease token (store.Finish).
type completer struct {
	store  *store.Store
	leases *leases
	log    *slog.Logger
	post   func([]posting) // announces jobs made available again
	giveUp time.Duration   // stop retrying a failed write after this long

	mu    sync.Mutex
	queue []finishReq
	wake  chan struct{} // buffer of 1: submit never blocks
}

type finishReq struct {
	f    store.Finish
	job  *Job
	done func(written bool) // called once the write landed or was refused
}

func newCompleter(st *store.Store, ls *leases, log *slog.Logger, post func([]posting), giveUp time.Duration) *completer {
	return &completer{store: st, leases: ls, log: log, post: post, giveUp: giveUp, wake: make(chan struct{}, 1)}
}

// submit queues an outcome. It never blocks.
func (c *completer) submit(r finishReq) {
	c.mu.Lock()
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run writes outcomes until stop ends, then writes what is left and
// returns. Writes never run under stop's context: an outcome queued before
// the stop is written (or given up after giveUp), not cut off.
func (c *completer) run(stop context.Context) {
	ctx := context.WithoutCancel(stop)
	for {
		select {
		case <-c.wake:
			c.flush(ctx)
		case <-stop.Done():
			c.flush(ctx)
			return
		}
	}
}

// flush writes every queued outcome, in batches of at most maxFinishBatch.
func (c *completer) flush(ctx context.Context) {
	for {
		c.mu.Lock()
		n := min(len(c.queue), maxFinishBatch)
		batch := c.queue[:n:n]
		c.queue = c.queue[n:]
		if len(c.queue) == 0 {
			c.queue = nil
		}
		c.mu.Unlock()
		if n == 0 {
			return
		}
		c.write(ctx, batch)
	}
}

func (c *completer) write(ctx context.Context, batch []finishReq) {
	fs := make([]store.Finish, len(batch))
	var again []posting
	for i, r := range batch {
		fs[i] = r.f
		if r.f.State == string(StateAvailable) {
			again = append(again, posting{Type: r.job.Type, Tags: r.job.Tags, In: max(r.f.Delay.Milliseconds(), 0)})
		}
	}
	payloads := encodePostings(again)

	b := newBackoff(50*time.Millisecond, 2*time.Second, c.giveUp)
	written := make(map[uuid.UUID]store.Finished, len(fs))
	pending := fs
	err := backoff.Retry(func() error {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		sent, err := c.writeOnce(wctx, pending, payloads, written)
		if sent {
			payloads = nil
		}
		if err != nil {
			// Only what did not land is tried again.
			rest := pending[:0:0]
			for _, f := range pending {
				if _, ok := written[f.ID]; !ok {
					rest = append(rest, f)
				}
			}
			pending = rest
			if ctx.Err() != nil {
				return backoff.Permanent(err)
			}
			c.log.Warn("backlog: recording job outcomes failed; retrying", "jobs", len(pending), "err", err)
		}
		return err
	}, backoff.WithContext(b, ctx))
	if err != nil {
		// The leases expire and the sweep makes these jobs available again.
		c.log.Error("backlog: giving up recording job outcomes; their leases will expire", "jobs", len(pending), "err", err)
	}
	for _, r := range batch {
		_, ok := written[r.f.ID]
		if !ok && err == nil {
			c.log.Warn("backlog: outcome refused: lease lost", "job", r.f.ID, "type", r.job.Type, "outcome", r.f.State)
		}
		c.leases.remove(r.f.ID, r.f.Token)
		if r.done != nil {
			r.done(ok)
		}
	}
	if err == nil && len(again) > 0 && c.post != nil {
		c.post(again)
	}
}

// writeOnce writes a batch: one statement for jobs without dependents (the
// common case); jobs it refused because they have dependents are then
// written in a transaction that also releases their dependents. Writes that
// took effect are added to written; sent reports whether the payloads went
// out with a committed statement.
func (c *completer) writeOnce(ctx context.Context, fs []store.Finish, payloads []string, written map[uuid.UUID]store.Finished) (sent bool, err error) {
	got, err := c.store.Finish(ctx, c.store.Pool, fs, payloads, false)
	if err != nil {
		return false, err
	}
	for id, f := range got {
		written[id] = f
	}
	if len(got) == len(fs) {
		return true, nil
	}
	var ids, tokens []uuid.UUID
	for _, f := range fs {
		if _, ok := got[f.ID]; !ok {
			ids, tokens = append(ids, f.ID), append(tokens, f.Token)
		}
	}
	withDeps, err := c.store.RefusedForDependents(ctx, ids, tokens)
	if err != nil || len(withDeps) == 0 {
		return true, err
	}
	want := make(map[uuid.UUID]bool, len(withDeps))
	for _, id := range withDeps {
		want[id] = true
	}
	var again []store.Finish
	for _, f := range fs {
		if want[f.ID] {
			again = append(again, f)
		}
	}
	// The first statement's postings went out before these jobs were
	// written: send them again with the write that makes them available.
	more, err := c.store.FinishWithDependents(ctx, again, payloads)
	for id, f := range more {
		written[id] = f
	}
	return true, err
}
