// Package complete writes job outcomes: the completer, one writer
// goroutine with group commit, failure isolation per row, a slow lane for
// rows another transaction holds, and back-pressure on claims.
package complete

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/isolate"
	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// Sizes of the completer.
const (
	// MaxBatch bounds one finish statement.
	MaxBatch = 2000
	// maxHeldOutcomes bounds the outcomes the completer holds (queued,
	// being written, or in the slow lane). While it is reached, claims
	// wait: the process stops taking work it could not record.
	maxHeldOutcomes = 10_000
	// slowLaneWriters bounds the writes that may wait for row locks at
	// once.
	slowLaneWriters = 4
)

// Completer writes job outcomes. One goroutine writes everything that
// queued up while its previous write was in flight, in one transaction:
// group commit with no fixed delay. Each write is fenced by lease token
// (store.Finish).
//
// Failure isolation: one job can never block, delay beyond its own retries,
// or lose the outcome of another.
//   - A row another transaction holds (a caller's open transaction that
//     enqueued a dependent of the job, typically) is skipped by the batch
//     and written alone in the slow lane, where waiting for the lock delays
//     nobody else.
//   - A batch that fails for a reason tied to one row is split until the
//     row is alone (internal/isolate); every other outcome is written, and
//     the offending job is failed with a reason that names the cause.
//   - Transient errors (the database unreachable, restarting, a deadlock)
//     are retried without limit. The completer never gives up on an outcome
//     it holds: it keeps them (at most maxHeldOutcomes, with back-pressure
//     on claims) and writes them when it can, fenced as always, so a lease
//     that survived the outage is still honoured. Only when the Queue is
//     closing does it drop outcomes whose leases have passed their local
//     deadline: the database will hand those jobs out again.
type Completer struct {
	group  run.Group
	store  *store.Store
	cfg    Config
	log    *slog.Logger
	faults *outage.Tracker

	mu       sync.Mutex
	queue    []*Request
	graph    []*Request // outcomes of jobs with dependents: FinishGraph
	held     int
	space    chan struct{} // closed when held drops below maxHeldOutcomes
	wake     chan struct{} // buffer of 1: submit never blocks
	slow     []*Request
	slowN    int // slow-lane writers running
	slowWake chan struct{}
	stopping bool
	stopAt   time.Time

	fastFs []store.Finish // the writer's scratch for writeFast batches
}

// A Lease is the lease an outcome is written under, as the completer
// needs it.
type Lease interface {
	// Stale reports whether the lease's local deadline has passed (a
	// write is then likely refused).
	Stale(now time.Time) bool
	// Forget is called once the outcome was written, refused or dropped.
	Forget()
}

// A Request is one outcome to record.
type Request struct {
	F    store.Finish
	Type string            // the job's type and tags: the postings of
	Tags map[string]string // a job made available again
	// Slot: the job holds a slot of a concurrency limit, which its
	// finish frees (announced to every domain of its type).
	Slot  bool
	Lease Lease              // nil: none to forget
	Done  func(written bool) // called once the write landed, was refused or dropped
	tries int                // slow lane: writes tried
	// uncertain: a write of this outcome ended with a commit whose answer
	// was lost and could not be checked (store.CommitUnknownError): it may
	// have landed, so a refusal of a later write is no proof of a lost
	// lease.
	uncertain bool
	busy      int       // fast lane: times the row was found busy
	after     time.Time // slow lane: not before
}

// Config is what the completer is built with.
type Config struct {
	// Lease is the lease duration: once closing, outcomes not written
	// within a lease of the stop are dropped.
	Lease time.Duration
	// Announce announces the postings of jobs an outcome made available
	// (a retry due now, released dependents, a freed limit slot).
	Announce func(ps []posting.Posting)
	// InPlace, when set, is called after a write that may have left
	// finished jobs in the jobs table (the graph path): the retirer
	// moves them.
	InPlace func()
	// Moved, when set, is called after a write that moved finished jobs
	// to job_history.
	Moved func()
}

// New returns a completer; Start starts its writer.
func New(st *store.Store, cfg Config, log *slog.Logger, faults *outage.Tracker) *Completer {
	return &Completer{store: st, cfg: cfg, log: log, faults: faults, wake: make(chan struct{}, 1), slowWake: make(chan struct{}, 1)}
}

// Start starts the writer (once).
func (c *Completer) Start() { c.group.Start(c.loop) }

// Stop writes every outcome it holds (dropping, once a lease has passed,
// those it cannot), then returns once its goroutines have.
func (c *Completer) Stop() { c.group.Stop(0) }

// Submit queues an outcome. It never blocks.
func (c *Completer) Submit(r *Request) {
	c.mu.Lock()
	c.queue = append(c.queue, r)
	c.held++
	c.mu.Unlock()
	run.Wake(c.wake)
}

// Admit waits while the completer holds maxHeldOutcomes outcomes.
func (c *Completer) Admit(ctx context.Context) error {
	for {
		c.mu.Lock()
		if c.held < maxHeldOutcomes {
			c.mu.Unlock()
			return nil
		}
		if c.space == nil {
			c.space = make(chan struct{})
		}
		ch := c.space
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// loop writes outcomes until ctx ends, then writes what is left, waits for
// the slow lane and returns. Writes never run under ctx: an outcome queued
// before the stop is written, not cut off.
func (c *Completer) loop(ctx context.Context) {
	wctx := context.WithoutCancel(ctx)
	for {
		select {
		case <-c.wake:
			c.flush(wctx)
		case <-ctx.Done():
			c.mu.Lock()
			c.stopping, c.stopAt = true, time.Now()
			c.mu.Unlock()
			c.flush(wctx)
			c.kickSlow() // the slow lane ends once it is empty; stop awaits it
			return
		}
	}
}

// flush writes every queued outcome, in batches of at most
// MaxBatch: first in the one-statement finish, then, for jobs that
// turned out to have dependents, in the transactional one.
func (c *Completer) flush(ctx context.Context) {
	for {
		// Both queues in turn, so that outcomes of jobs with dependents
		// never wait behind a stream of others.
		fast, graph := c.take(&c.queue), c.take(&c.graph)
		if len(fast) == 0 && len(graph) == 0 {
			return
		}
		if len(fast) > 0 {
			c.write(ctx, fast, writeFast)
		}
		if len(graph) > 0 {
			c.write(ctx, graph, writeGraph)
		}
	}
}

// take removes a batch from q: at most MaxBatch outcomes, at most one
// a job (a second outcome of a job, a stale attempt's after a busy retry,
// stays queued for the next batch).
func (c *Completer) take(q *[]*Request) []*Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch, rest []*Request
	seen := make(map[uuid.UUID]bool, min(len(*q), MaxBatch))
	for i, r := range *q {
		if len(batch) == MaxBatch {
			rest = append(rest, (*q)[i:]...)
			break
		}
		if seen[r.F.ID] {
			rest = append(rest, r)
			continue
		}
		seen[r.F.ID] = true
		batch = append(batch, r)
	}
	*q = rest
	return batch
}

// writeMode says which finish statement a write uses.
type writeMode uint8

const (
	writeFast  writeMode = iota // store.Finish: one statement, no dependents
	writeGraph                  // store.FinishGraph, skipping busy rows
	writeWait                   // store.FinishGraph, waiting for busy rows (slow lane)
)

// write records a batch, isolating failures, and retries what a transient
// error held back until it is written.
func (c *Completer) write(ctx context.Context, batch []*Request, mode writeMode) {
	w := isolate.Writer[*Request]{
		Write: func(ctx context.Context, rs []*Request) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return c.writeBatch(ctx, rs, mode)
		},
		Busy:   c.toSlow,
		Poison: c.poison,
	}
	b := run.NewBackoff(50*time.Millisecond, 2*time.Second)
	pending := batch
	for {
		rest, err := w.Run(ctx, pending)
		if err == nil {
			c.faults.OK("outcomes")
			return
		}
		var unknown *store.CommitUnknownError
		if errors.As(err, &unknown) {
			for _, r := range rest {
				r.uncertain = true
			}
		}
		if pending = c.dropStale(rest); len(pending) == 0 {
			return
		}
		if !c.faults.Failed("outcomes", err) {
			c.log.Warn("backlog: recording job outcomes failed; retrying", "jobs", len(pending), "err", err)
		}
		t := time.NewTimer(b.NextBackOff())
		<-t.C
	}
}

// writeBatch writes rs in one finish and settles each outcome: written,
// refused (the lease is gone), busy (tried again, then the slow lane) or,
// in the fast statement, one with dependents (to the graph queue).
func (c *Completer) writeBatch(ctx context.Context, rs []*Request, mode writeMode) error {
	var fs []store.Finish
	if mode == writeFast {
		// Only the writer goroutine writes in this mode, one batch at a
		// time, and the store keeps nothing of fs: reuse its array.
		fs = c.fastFs[:0]
		defer func() { clear(fs); c.fastFs = fs[:0] }() // nothing kept alive
	}
	for _, r := range rs {
		fs = append(fs, r.F)
	}
	var res store.FinishResult
	var err error
	if mode == writeFast {
		res, err = c.store.Finish(ctx, fs)
	} else {
		res, err = c.store.FinishGraph(ctx, fs, mode == writeWait)
	}
	if err != nil {
		return err
	}
	if mode != writeFast && c.cfg.InPlace != nil {
		c.cfg.InPlace()
	}
	if mode == writeFast && c.cfg.Moved != nil {
		c.cfg.Moved()
	}
	var again []posting.Posting
	var freed map[string]struct{} // types whose freed slots are announced
	var graph []*Request
	for _, r := range rs {
		switch res.Status[r.F.ID] {
		case store.Written:
			switch res.State[r.F.ID] {
			case "available":
				again = append(again, posting.Posting{Type: r.Type, Tags: r.Tags})
			case "scheduled":
				again = append(again, posting.Sched(r.F.Delay))
			}
			if _, ok := freed[r.Type]; r.Slot && !ok {
				// One posting a type, not one a job: a batch under a
				// limit that does not bind frees hundreds of slots, and
				// building a posting for each (Dedupe drops them below)
				// costs the hot path a few allocations a job.
				if freed == nil {
					freed = map[string]struct{}{}
				}
				freed[r.Type] = struct{}{}
				again = append(again, posting.Posting{Type: r.Type})
			}
			c.settle(r, true)
		case store.Busy:
			c.busy(r)
		case store.Graph:
			graph = append(graph, r)
		default: // store.Refused
			if r.uncertain {
				c.log.Warn("backlog: outcome not confirmed: an earlier write of it may have landed (the answer to its commit was lost and could not be checked), and the lease is no longer held",
					"job", r.F.ID, "type", r.Type, "outcome", r.F.State)
			} else {
				c.log.Warn("backlog: outcome refused: lease lost", "job", r.F.ID, "type", r.Type, "outcome", r.F.State)
			}
			c.settle(r, false)
		}
	}
	// One posting a (type, tags): retries of one type made available
	// together would otherwise wake every domain of it once a job.
	c.cfg.Announce(posting.Dedupe(append(again, posting.OfAvail(res.Avail)...)))
	if len(graph) > 0 {
		c.mu.Lock()
		c.graph = append(c.graph, graph...)
		c.mu.Unlock()
		c.kick()
	}
	return nil
}

// kick makes the writer loop flush (never blocks).
func (c *Completer) kick() {
	run.Wake(c.wake)
}

// poison fails a job whose outcome could not be written for a reason tied
// to its row, in a minimal write that carries none of the outcome's data.
func (c *Completer) poison(ctx context.Context, r *Request, cause error) error {
	reason := fmt.Errorf("backlog: recording the job's outcome (%s) failed, so the job fails instead: %w", r.F.State, cause)
	f := store.Finish{ID: r.F.ID, Token: r.F.Token, State: "failed", Err: store.ErrorText(reason)}
	res, err := c.store.FinishGraph(ctx, []store.Finish{f}, true)
	if err != nil {
		return err
	}
	if c.cfg.InPlace != nil {
		c.cfg.InPlace()
	}
	written := res.Status[f.ID] == store.Written
	if written {
		c.log.Error("backlog: a job's outcome could not be recorded; the job is failed", "job", r.F.ID, "type", r.Type, "err", cause)
	}
	ps := posting.OfAvail(res.Avail)
	if written && r.Slot {
		ps = append(ps, posting.Posting{Type: r.Type})
	}
	c.cfg.Announce(ps)
	c.settle(r, written)
	return nil
}

// settle ends an outcome's life in the completer.
func (c *Completer) settle(r *Request, written bool) {
	if r.Lease != nil {
		r.Lease.Forget()
	}
	if r.Done != nil {
		r.Done(written)
	}
	c.mu.Lock()
	c.held--
	if c.space != nil && c.held < maxHeldOutcomes {
		close(c.space)
		c.space = nil
	}
	c.mu.Unlock()
}

// dropStale returns rs, less (when the Queue is closing) the outcomes whose
// leases have passed their local deadline, or that could not be written
// within a lease of the stop, which are dropped: their jobs run again once
// their leases have expired.
func (c *Completer) dropStale(rs []*Request) []*Request {
	c.mu.Lock()
	stopping, stopAt := c.stopping, c.stopAt
	c.mu.Unlock()
	if !stopping {
		return rs
	}
	now := time.Now()
	late := now.Sub(stopAt) > c.cfg.Lease
	keep := rs[:0:0]
	for _, r := range rs {
		if late || r.Lease != nil && r.Lease.Stale(now) {
			c.log.Error("backlog: closing: dropping an outcome that could not be written before its lease expired; the job will run again",
				"job", r.F.ID, "type", r.Type, "outcome", r.F.State)
			c.settle(r, false)
			continue
		}
		keep = append(keep, r)
	}
	return keep
}

// fastBusyTries is how often a busy row is tried again in the fast lane
// before it goes to the slow lane. Most busy rows are held for a moment
// only: a concurrent claim that followed the row's update chain keeps its
// lock until its statement ends, though it does not take the row.
const fastBusyTries = 3

// busy puts an outcome whose row another transaction held back in the
// queue for the next batch, or, after fastBusyTries, in the slow lane.
func (c *Completer) busy(r *Request) {
	if r.busy++; r.busy > fastBusyTries {
		c.toSlow(r)
		return
	}
	c.mu.Lock()
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	c.kick()
}

// toSlow hands an outcome whose row was busy to the slow lane.
func (c *Completer) toSlow(r *Request) {
	c.mu.Lock()
	c.slow = append(c.slow, r)
	if c.slowN < slowLaneWriters {
		c.slowN++
		c.group.Go(c.slowLoop)
	}
	c.mu.Unlock()
	c.kickSlow()
}

func (c *Completer) kickSlow() {
	run.Wake(c.slowWake)
}

// slowLoop writes busy outcomes one at a time, each waiting for its row
// (up to store.SlowLockTimeout a try), until none is left.
func (c *Completer) slowLoop(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for {
		c.mu.Lock()
		if len(c.slow) == 0 {
			c.slowN--
			c.mu.Unlock()
			return
		}
		// The first outcome that is due; else wait for the earliest.
		now := time.Now()
		pick, earliest := -1, time.Time{}
		for i, r := range c.slow {
			if !r.after.After(now) {
				pick = i
				break
			}
			if earliest.IsZero() || r.after.Before(earliest) {
				earliest = r.after
			}
		}
		if pick < 0 {
			c.mu.Unlock()
			t := time.NewTimer(earliest.Sub(now))
			select {
			case <-t.C:
			case <-c.slowWake:
				t.Stop()
			}
			continue
		}
		r := c.slow[pick]
		c.slow = append(c.slow[:pick:pick], c.slow[pick+1:]...)
		c.mu.Unlock()
		c.writeSlow(ctx, r)
	}
}

// writeSlow writes one outcome, waiting for its row; on failure it goes
// back to the slow lane for a later try (or is poisoned, when its row is
// to blame).
func (c *Completer) writeSlow(ctx context.Context, r *Request) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := c.writeBatch(wctx, []*Request{r}, writeWait)
	if err != nil && !pgerr.Transient(err) && !pgerr.Busy(err) {
		err = c.poison(wctx, r, err)
	}
	cancel()
	if err == nil {
		return
	}
	if len(c.dropStale([]*Request{r})) == 0 {
		return
	}
	r.tries++
	wait := min(100*time.Millisecond<<min(r.tries, 5), 2*time.Second)
	if r.tries%10 == 0 {
		c.log.Warn("backlog: an outcome still waits for its row", "job", r.F.ID, "type", r.Type, "tries", r.tries, "err", err)
	}
	r.after = time.Now().Add(wait)
	c.mu.Lock()
	c.slow = append(c.slow, r)
	c.mu.Unlock()
}
