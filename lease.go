package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/claim"
	"github.com/backlogq/backlog/internal/isolate"
	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/registry"
	"github.com/backlogq/backlog/internal/run"
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
// The claimer gives each claimed Job its *heldLease handle; the worker and the
// completer use that handle, never a lookup. leases is the registry of the
// handles this Queue holds, which one heartbeat service renews.
type heldLease struct {
	owner     *leases // the registry that holds it
	id, token uuid.UUID
	typ       string // the job's type (holdBack)
	conc      bool   // the job holds a slot of a concurrency limit (store.Claimed.Conc)
	// standby: the job was claimed as standby (store.Claimed.Standby) and
	// has not been handed a slot yet (end): it is in ended meanwhile.
	standby bool
	// deadline is the local (monotonic) time until which the lease is
	// certainly ours: the send time of the last successful claim or
	// renewal, plus the lease, minus the margin. The database's now() at
	// that statement was later than the send time, so its expiry is later
	// than deadline + margin.
	deadline time.Time
	cancel   context.CancelCauseFunc // set once the handler runs
	lost     bool                    // not confirmed in time, or refused: writes are likely refused
	done     bool                    // the outcome is queued for the completer
	stop     error                   // why the handler must stop (ErrLeaseLost, ErrCancelled), once it must
	// failWith is set when renewing this lease failed for a reason tied
	// to its row: the attempt fails with it.
	failWith error
	// progress is the latest value of Job.SetProgress, version progSeq;
	// progSent is the version a renewal wrote (progSeq: nothing to write).
	progress          json.RawMessage
	progSeq, progSent uint64
}

// claimed is one job a claim took: the record the claim statement
// returned and the lease it is held under. The acquirer buffers and hands
// out claimed jobs, the completer writes their outcomes; only Work turns
// one into the *Job its handler sees (workCall.jobOf).
type claimed = claim.Job[*heldLease]

// errHeldBack is why a job handed to a worker is given back before its
// handler begins: its type was paused, or its limit tightened, after it
// was claimed (leases.holdBack).
var errHeldBack = errors.New("backlog: held back by a pause or a tightened limit")

// progressEvery is how soon after a job reports progress a renewal
// writes it (the regular renewal, every third of a lease, writes it too
// when it comes first).
const progressEvery = time.Second

// leases is the registry of held leases and the heartbeat service.
type leases struct {
	store    *store.Store
	log      *slog.Logger
	faults   *outage.Tracker
	duration time.Duration
	margin   time.Duration // cancel this long before the lease could expire
	group    run.Group
	// procs is this process's row in the processes table, which the
	// heartbeat keeps fresh (see heartbeat). Set before the service starts.
	procs *registry.Registry

	mu   sync.Mutex
	held map[uuid.UUID]*heldLease
	// ended are the leases, by type, of jobs that hold a slot of a
	// concurrency limit and whose handlers have ended, until their
	// outcomes are written (remove), and of standby jobs until they are
	// handed a slot (end) or given back: the claims of a domain whose
	// limit binds pass their tokens (Ended), and such jobs then hold no
	// slot. (A job whose slot went to a standby job is among them too,
	// but its outcome waits for the claims in flight: see end.)
	ended map[string]map[*heldLease]struct{}
	// readers are the claims in flight that read ended (Ended), by the
	// number each got (readSeq counts them); waiting are the outcomes
	// whose write waits for some of them to end (end, afterReaders).
	readers map[uint64]struct{}
	readSeq uint64
	waiting []heldWrite
	// progKick tells the loop that a job reported progress no renewal has
	// been asked to write yet (progPending).
	progKick    chan struct{}
	progPending bool
}

// newLeases returns the registry of leases of duration d; its heartbeat
// keeps procs's row fresh.
func newLeases(st *store.Store, log *slog.Logger, faults *outage.Tracker, d time.Duration, procs *registry.Registry) *leases {
	return &leases{procs: procs, store: st, log: log, faults: faults, duration: d, margin: d / 5, held: map[uuid.UUID]*heldLease{}, ended: map[string]map[*heldLease]struct{}{}, readers: map[uint64]struct{}{}, progKick: make(chan struct{}, 1)}
}

func (l *leases) start() { l.group.Start(l.loop) }
func (l *leases) stop()  { l.group.Stop(0) }

// Add registers the leases of freshly claimed jobs and returns their
// handles; sentAt is when the claim was sent. A job this process still
// holds under an older token (it re-claimed the job after a stall longer
// than the lease) loses that older lease: its handler is cancelled.
func (l *leases) Add(jobs []*store.Claimed, sentAt time.Time) []*heldLease {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*heldLease, len(jobs))
	for i, j := range jobs {
		if old := l.held[j.ID]; old != nil && old.token != j.Token {
			l.loseLocked(old)
		}
		le := &heldLease{owner: l, id: j.ID, token: j.Token, typ: j.Type, conc: j.Conc, standby: j.Standby, deadline: sentAt.Add(l.duration - l.margin)}
		out[i] = le
		l.held[j.ID] = le
		if le.standby {
			l.addEndedLocked(le)
		}
	}
	return out
}

// begin attaches the handler's cancel function. It returns why the handler
// must not run when that was decided before it started.
func (l *leases) begin(le *heldLease, cancel context.CancelCauseFunc) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if le.stop != nil {
		return le.stop
	}
	le.cancel = cancel
	return nil
}

// end is called when the attempt's outcome is about to go to the
// completer: from then on a renewal that misses the row most likely means
// the outcome was just written, which is no reason to warn. It reports
// what the lease knows when its attempt ends.
//
// next, when set, is a standby job of the same type to run in the ended
// job's slot (a hand-over). It is handed the slot unless the ended job's
// lease is lost or past its local deadline (its row may no longer stand
// for the slot), or next's is lost or next must not run (e.nextGone): then
// e.handed is false and next stays standby. Handed over, next is counted
// by the process's claims from then on and the ended job is not, as for
// any ended job; but for the claims in flight, which read next's token as
// standby and the ended job's as running, the ended job's row stands for
// the slot: e.holdUntil, when not 0, says its outcome's write must wait
// until they have ended (afterReaders).
func (l *leases) end(le *heldLease, next *heldLease) (e attemptEnd) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case next != nil && le.conc && !le.done && !le.lost && !time.Now().After(le.deadline) &&
		next.standby && !next.lost && next.stop == nil:
		next.standby = false
		l.dropEndedLocked(next)
		l.addEndedLocked(le)
		e.handed = true
		if len(l.readers) > 0 {
			e.holdUntil = l.readSeq
		}
	case le.conc && !le.done:
		l.addEndedLocked(le)
	}
	e.nextGone = next != nil && (next.lost || next.stop != nil)
	le.done = true
	e.fail, e.lost = le.failWith, le.lost
	if le.progSeq != le.progSent {
		e.progress = le.progress
	}
	return e
}

// attemptEnd is what the lease knows when its attempt ends (leases.end).
type attemptEnd struct {
	fail      error           // why the attempt must fail, from a renewal; nil otherwise
	lost      bool            // the lease is presumed lost
	progress  json.RawMessage // progress no renewal has written yet; nil otherwise
	handed    bool            // the slot went to the standby job passed to end
	nextGone  bool            // that standby job's lease is lost, or it must not run (held back, cancelled)
	holdUntil uint64          // the outcome's write waits for the claims that read ended up to this one (0: none)
}

// addEndedLocked puts le in ended.
func (l *leases) addEndedLocked(le *heldLease) {
	set := l.ended[le.typ]
	if set == nil {
		set = map[*heldLease]struct{}{}
		l.ended[le.typ] = set
	}
	set[le] = struct{}{}
}

// dropEndedLocked takes le out of ended.
func (l *leases) dropEndedLocked(le *heldLease) {
	if set := l.ended[le.typ]; set != nil {
		delete(set, le)
		if len(set) == 0 {
			delete(l.ended, le.typ)
		}
	}
}

// heldWrite is an outcome whose write waits for the claims that read
// ended up to after (see leases.end).
type heldWrite struct {
	after uint64
	send  func()
}

// afterReaders runs send once every claim that read ended up to the
// holdUntil of leases.end has ended: at once if they all have.
func (l *leases) afterReaders(until uint64, send func()) {
	l.mu.Lock()
	for r := range l.readers {
		if r <= until {
			l.waiting = append(l.waiting, heldWrite{after: until, send: send})
			l.mu.Unlock()
			return
		}
	}
	l.mu.Unlock()
	send()
}

// doneReading ends the claim that read ended as number r, and sends the
// held outcomes no claim in flight still waits for.
func (l *leases) doneReading(r uint64) {
	l.mu.Lock()
	delete(l.readers, r)
	oldest := uint64(math.MaxUint64)
	for x := range l.readers {
		oldest = min(oldest, x)
	}
	var send []func()
	keep := l.waiting[:0]
	for _, h := range l.waiting {
		if h.after < oldest {
			send = append(send, h.send)
		} else {
			keep = append(keep, h)
		}
	}
	clear(l.waiting[len(keep):])
	l.waiting = keep
	l.mu.Unlock()
	for _, f := range send {
		f()
	}
}

// stale reports whether the lease's local deadline has passed: a write of
// its outcome is then likely refused (the sweep may have handed the job on).
func (l *leases) stale(le *heldLease, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.After(le.deadline)
}

// Stale reports whether the lease's local deadline has passed (the
// completer's complete.Lease).
func (le *heldLease) Stale(now time.Time) bool { return le.owner.stale(le, now) }

// Forget forgets the lease once its outcome was written, refused or
// dropped (the completer's complete.Lease).
func (le *heldLease) Forget() { le.owner.remove(le) }

// remove forgets a lease once its outcome was written (or refused). The
// job may already be held again under a newer lease: that one stays.
func (l *leases) remove(le *heldLease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if le.conc { // only such leases are ever in ended (end, Add)
		l.dropEndedLocked(le)
	}
	if l.held[le.id] == le {
		delete(l.held, le.id)
	}
}

// maxEndedTokens bounds the tokens one claim passes (Ended): the
// claim compares each running job of a limited type with each of them.
// A process with more ended jobs waiting for their outcomes' write has
// freed more slots than a claim is likely to need.
const maxEndedTokens = 256

// Ended returns the lease tokens of jobs of the given types that
// hold a slot of a concurrency limit and whose handlers have ended, whose
// outcomes are not written yet, and of standby jobs not handed a slot (at
// most maxEndedTokens; nil: none). A claim that passes them does not
// count those jobs against the concurrency limit (key limits still do).
// The claim calls done once its statement has ended: until then, an
// outcome whose slot went to one of those standby jobs is not written
// (leases.end).
func (l *leases) Ended(types []string) (tokens [][16]byte, done func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.readSeq++
	r := l.readSeq
	l.readers[r] = struct{}{}
	done = func() { l.doneReading(r) }
	for _, t := range types {
		for le := range l.ended[t] {
			if len(tokens) == maxEndedTokens {
				return tokens, done
			}
			tokens = append(tokens, le.token)
		}
	}
	return tokens, done
}

// setProgress records a job's latest progress for the next renewal. It
// refuses once the lease is lost or the attempt's outcome is queued.
func (l *leases) setProgress(le *heldLease, b json.RawMessage) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case le.lost || errors.Is(le.stop, ErrLeaseLost):
		return fmt.Errorf("%w: progress of job %s not recorded", ErrLeaseLost, le.id)
	case le.done:
		return fmt.Errorf("backlog: progress of job %s not recorded: its attempt has ended", le.id)
	}
	le.progress = b
	le.progSeq++
	if !l.progPending {
		l.progPending = true
		run.Wake(l.progKick)
	}
	return nil
}

// stopLocked cancels the handler with cause (the first cause wins).
func (l *leases) stopLocked(le *heldLease, cause error) {
	if le.stop != nil {
		return
	}
	le.stop = cause
	if le.cancel != nil {
		le.cancel(cause)
	}
}

func (l *leases) loseLocked(le *heldLease) {
	le.lost = true
	l.stopLocked(le, ErrLeaseLost)
}

// holdBack stops the jobs of the given types that were handed to a worker
// but whose handlers have not begun: begin refuses them with errHeldBack,
// and the worker gives them back. Pause and a tightened limit call it
// (through the acquirer's drop), so no handler of those types begins
// after they return unless a claim made under the new rules took its job.
func (l *leases) holdBack(types []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, le := range l.held {
		if le.cancel == nil && !le.done && slices.Contains(types, le.typ) {
			l.stopLocked(le, errHeldBack)
		}
	}
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

// heartbeat renews every held lease and reports whether every lease that
// needed renewing was renewed (false: renew again soon). Leases the
// database no longer matches are lost: their handlers are cancelled with
// ErrLeaseLost. A lease whose row another transaction holds is not renewed
// this time (busy), and one whose renewal fails for a reason tied to its
// row fails its attempt; neither holds back the others. Whatever happens,
// leases past their local deadline are then lost, so a worker cut off from
// the database stops its handlers before another worker could be given the
// same attempt.
//
// The heartbeat also keeps the process's row in the processes table
// fresh: the first renewal statement carries it, and when there is none
// (no lease held) or it missed the row (see renew), the row is written
// alone afterwards: one statement a beat, unless one fails.
func (l *leases) heartbeat(ctx context.Context) bool {
	l.mu.Lock()
	leased := len(l.held)
	todo := make([]*heldLease, 0, len(l.held))
	stop := time.Now().Add(l.duration / 3)
	for _, le := range l.held {
		if !le.lost && le.failWith == nil {
			todo = append(todo, le)
			if le.deadline.Before(stop) {
				stop = le.deadline
			}
		}
	}
	l.mu.Unlock()

	ok := true
	if len(todo) > 0 {
		// Give up on the renewal by the earliest local deadline: the check
		// below must not wait for a statement that cannot reach the
		// database.
		cctx, cancel := context.WithDeadline(ctx, stop)
		beat := l.procs.Due(leased)
		w := isolate.Writer[*heldLease]{
			Write: func(ctx context.Context, ls []*heldLease) error {
				b := beat
				beat = nil // only the first statement carries the process's row
				renewedAll, err := l.renew(ctx, ls, b)
				ok = ok && renewedAll
				return err
			},
			Poison: func(_ context.Context, le *heldLease, cause error) error {
				l.mu.Lock()
				defer l.mu.Unlock()
				le.failWith = fmt.Errorf("renewing the job's lease failed: %w", cause)
				l.stopLocked(le, le.failWith)
				l.log.Error("backlog: renewing a lease failed; the attempt fails", "job", le.id, "err", cause)
				return nil
			},
		}
		if _, err := w.Run(cctx, todo); err != nil {
			ok = false
			if ctx.Err() == nil && !l.faults.Failed("heartbeat", err) {
				l.log.Warn("backlog: renewing leases failed", "leases", len(todo), "err", err)
			}
		} else {
			l.faults.OK("heartbeat")
		}
		cancel()
	}
	l.expire(time.Now())
	l.procs.Write(ctx, leased) // unless the renewal wrote it
	return ok
}

// renew runs one renewal statement for ls and applies its answer. It
// reports whether every lease was renewed (none busy). With beat, the
// statement also writes the process's row. The row must never cost a job
// its lease: when that statement fails for a reason that is not
// transient, a batch of leases is split and renewed by statements without
// the row (the caller's isolate.Writer does that), and a single lease is
// renewed again here, without it.
func (l *leases) renew(ctx context.Context, ls []*heldLease, beat *registry.Beat) (bool, error) {
	ids := make([]uuid.UUID, len(ls))
	tokens := make([]uuid.UUID, len(ls))
	for i, le := range ls {
		ids[i], tokens[i] = le.id, le.token
	}
	// Progress reported since the last renewal goes with this one (prog
	// stays nil when there is none: the renewal is the plain one).
	var prog []json.RawMessage
	var seqs []uint64
	l.mu.Lock()
	for i, le := range ls {
		if le.progSeq != le.progSent {
			if prog == nil {
				prog, seqs = make([]json.RawMessage, len(ls)), make([]uint64, len(ls))
			}
			prog[i], seqs[i] = le.progress, le.progSeq
		}
	}
	if prog != nil {
		// Pending no more, unless a lease outside this batch (claimed
		// after it was taken) has progress to write too.
		l.progPending = false
		inBatch := make(map[*heldLease]bool, len(ls))
		for _, le := range ls {
			inBatch[le] = true
		}
		for _, le := range l.held {
			if le.progSeq != le.progSent && !inBatch[le] {
				l.progPending = true
				run.Wake(l.progKick)
				break
			}
		}
	}
	l.mu.Unlock()
	sentAt := time.Now()
	var alive []store.Extended
	var err error
	if beat != nil {
		var wrote bool
		alive, wrote, err = l.store.ExtendBeatWith(ctx, ids, tokens, prog, l.duration, beat.Row)
		if err == nil || (ctx.Err() == nil && !pgerr.Transient(err)) {
			l.procs.Carried(beat, wrote)
		}
		if err != nil && len(ls) == 1 && ctx.Err() == nil && !pgerr.Transient(err) {
			sentAt = time.Now()
			alive, err = l.store.ExtendWith(ctx, ids, tokens, prog, l.duration)
		}
	} else {
		alive, err = l.store.ExtendWith(ctx, ids, tokens, prog, l.duration)
	}
	if err != nil {
		return false, err
	}
	all := true
	still := make(map[uuid.UUID]store.Extended, len(alive))
	for _, e := range alive {
		still[e.ID] = e
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, le := range ls {
		e, ok := still[le.id]
		switch {
		case !ok:
			if !le.done {
				l.log.Warn("backlog: lease lost", "job", le.id)
			}
			l.loseLocked(le)
		case e.Renewed:
			le.deadline = sentAt.Add(l.duration - l.margin)
			if seqs != nil && seqs[i] > le.progSent {
				le.progSent = seqs[i]
			}
			if e.CancelRequested {
				l.stopLocked(le, ErrCancelled)
			}
		default:
			all = false // busy: try again soon
		}
	}
	return all, nil
}

// count returns how many leases the process holds.
func (l *leases) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// expire loses every lease whose local deadline has passed.
func (l *leases) expire(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, le := range l.held {
		if !le.lost && now.After(le.deadline) {
			if !le.done {
				l.log.Warn("backlog: lease could not be renewed in time; cancelling the handler", "job", le.id)
			}
			l.loseLocked(le)
		}
	}
}

// loop renews leases every duration/3 until ctx ends; after a renewal that
// failed or left a lease busy it tries again every duration/30, so that
// local deadlines are checked often and a busy row is renewed soon. When
// Work calls start or return, it writes the process's row at once. When a
// job reports progress, the renewal comes within progressEvery.
func (l *leases) loop(ctx context.Context) {
	every, retry := l.duration/3, max(l.duration/30, 10*time.Millisecond)
	t := time.NewTimer(every)
	defer t.Stop()
	var prog <-chan time.Time // armed while progress waits for a renewal
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.procs.Kick(): // Work calls came or went
			l.procs.Write(ctx, l.count())
			continue
		case <-l.progKick:
			if prog == nil {
				prog = time.After(progressEvery)
			}
			continue
		case <-prog:
		case <-t.C:
		}
		prog = nil
		if l.heartbeat(ctx) {
			t.Reset(every)
		} else {
			t.Reset(retry)
		}
	}
}
