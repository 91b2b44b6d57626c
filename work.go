package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/registry"
	"github.com/backlogq/backlog/internal/store"
)

// Work runs jobs with h until ctx is cancelled or the Queue is closed, like
// http.Server.Serve. It claims only the job types h handles (a *Mux's
// registered types, or the Types option) whose tags fit the WorkerTags.
//
// When ctx is cancelled Work stops claiming, lets running handlers finish
// within the grace period, then cancels their contexts (cause ErrShutdown).
// Jobs whose handlers gave up that way are released: available again at
// once, without spending the attempt; so are jobs a claim in flight handed
// to this call as it stopped. Work returns after every handler it started
// has returned and every outcome of its jobs has been written: nil after
// ctx was cancelled, ErrClosed after Close, or an *InputError for bad
// options. An outcome that cannot be written within the grace period (at
// least a second) after the handlers ended, because the database is
// unreachable or a transaction of yours holds the job's row, is left to the
// Queue, which keeps writing it until Close.
func (q *Queue) Work(ctx context.Context, h Handler, opts ...WorkOption) error {
	w, err := q.prepareWork(ctx, h, opts, workConfig{concurrency: defaultConcurrency, prefetch: defaultPrefetch, grace: defaultGracePeriod}, false)
	if errors.Is(err, errStoppedEarly) {
		return nil
	}
	if err != nil {
		return err
	}
	defer q.works.Done()
	cfg, spec := w.cfg, w.spec

	// Claiming stops with ctx or Close; handlers run under hard, which only
	// the end of the grace period cancels.
	claimCtx, stopClaiming := context.WithCancel(ctx)
	defer stopClaiming()
	hard, hardStop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer hardStop(nil)

	w.hard, w.claiming = hard, claimCtx
	q.procs.Join(w)
	defer q.procs.Leave(w) // after every outcome is written, before Close may go on
	q.acq.flowBaseline(ctx)
	q.acq.join(spec, cfg.concurrency, cfg.prefetch)
	var workers sync.WaitGroup
	for range cfg.concurrency {
		workers.Go(func() {
			for {
				job, err := q.acq.acquire(claimCtx, spec)
				if job != nil && err != nil {
					// Handed a job as Work stopped: give it back.
					w.submit(job, store.Release(job.ID, job.Token))
				}
				if err != nil {
					return
				}
				for job != nil { // a standby job runs in its predecessor's slot
					job, _, _, _ = w.runHanding(job, true)
				}
			}
		})
	}
	allDone := make(chan struct{})
	go func() { // exits once the workers have; awaited below
		workers.Wait()
		close(allDone)
	}()

	var result error
	select {
	case <-ctx.Done():
	case <-q.closing:
		result = ErrClosed
	case <-allDone: // only if the acquirer closed under us
		result = ErrClosed
	}
	stopClaiming()
	grace := time.NewTimer(cfg.grace)
	select {
	case <-allDone:
	case <-grace.C:
		q.log.Warn("backlog: grace period over; cancelling running handlers", "types", spec.types)
		hardStop(ErrShutdown)
		<-allDone
	}
	grace.Stop()
	// The last Work call of a domain gives back the jobs it prefetched.
	for _, job := range q.acq.leave(spec, cfg.concurrency) {
		w.submit(job, store.Release(job.ID, job.Token))
	}
	w.awaitOutcomes(cfg.grace, spec)
	return result
}

// errStoppedEarly: the caller's ctx ended while Work was being prepared.
var errStoppedEarly = errors.New("backlog: stopped before it began")

// prepareWork is what Work and the test runs of package backlogtest
// (testrun.go) do before they take a job: it checks h and the options
// (applied over cfg, the caller's defaults), builds the call's domain,
// checks the schema and registers the call with the Queue (q.works, which
// the caller must mark Done). anyType: the call may be given no types (a
// test run takes a job by ID, of whatever type); its spec is then nil. It
// returns ErrClosed after Close, errStoppedEarly when ctx ended while the
// schema was checked, or an *InputError.
func (q *Queue) prepareWork(ctx context.Context, h Handler, opts []WorkOption, cfg workConfig, anyType bool) (*workCall, error) {
	if h == nil {
		return nil, invalid("handler", "must not be nil")
	}
	if f, ok := h.(HandlerFunc); ok && f == nil {
		return nil, invalid("handler", "must not be a nil HandlerFunc")
	}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("options", "nil option")
		}
		o.applyWork(&cfg)
	}
	mux, _ := h.(*Mux)
	if cfg.types == nil && mux != nil {
		cfg.types = mux.Types()
	}
	switch {
	case cfg.concurrency < 1:
		return nil, invalid("concurrency", "must be at least 1, got %d", cfg.concurrency)
	case cfg.grace < 0:
		return nil, invalid("grace period", "must not be negative, got %s", cfg.grace)
	case cfg.prefetch < 0:
		return nil, invalid("prefetch", "must not be negative, got %d", cfg.prefetch)
	}
	if cfg.backoff != nil {
		if err := cfg.backoff.validate(); err != nil {
			return nil, err
		}
	}
	var spec *domainSpec
	if len(cfg.types) > 0 || !anyType {
		var err error
		if spec, err = newDomainSpec(cfg.types, cfg.tags); err != nil {
			return nil, err
		}
	} else if err := validateTags("worker tags", cfg.tags); err != nil {
		return nil, err
	}
	if q.isClosed() {
		return nil, ErrClosed
	}
	if err := q.checkSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, errStoppedEarly
		}
		return nil, err
	}
	q.maint.EnsurePartitions(ctx)
	if !q.beginWork() {
		return nil, ErrClosed
	}
	w := &workCall{q: q, h: h, mux: mux, cfg: cfg, spec: spec}
	w.settled = func(bool) { w.finishes.Done() }
	return w, nil
}

// awaitOutcomes waits until every outcome of the call's jobs is written,
// or for at most wait: outcomes still held then (their rows held by a
// transaction of yours, or the database unreachable) stay with the Queue,
// which keeps writing them until Close.
func (w *workCall) awaitOutcomes(wait time.Duration, spec *domainSpec) {
	done := make(chan struct{})
	go func() { // exits once the outcomes are written; the Queue writes them until Close
		w.finishes.Wait()
		close(done)
	}()
	t := time.NewTimer(max(wait, time.Second))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		w.q.log.Warn("backlog: Work returns with outcomes still being written; the Queue keeps writing them until Close",
			"types", spec.types)
	}
}

// workCall runs the jobs of one Work call.
type workCall struct {
	q        *Queue
	h        Handler
	mux      *Mux
	cfg      workConfig
	spec     *domainSpec
	hard     context.Context
	claiming context.Context // Work's: done once Work stops taking jobs (no more hand-overs to standby jobs)
	finishes sync.WaitGroup  // outcomes submitted but not yet written
	running  atomic.Int32    // handlers running (for Processes)
	// written, when set (the test runs of package backlogtest), hears
	// whether each outcome was written.
	written func(c *claimed, ok bool)
	// settled is every outcome's done function (but in test runs): one
	// closure for the call, not one a job.
	settled func(written bool)
}

// WorkRow describes the call for this process's row in the processes
// table (the registry).
func (w *workCall) WorkRow() registry.WorkRow {
	return registry.WorkRow{Types: w.spec.types, Tags: w.spec.tags, Concurrency: w.cfg.concurrency, Prefetch: w.cfg.prefetch,
		Running: int(w.running.Load())}
}

// workAttempt is the attempt a handler's Job runs in: its lease (for
// progress) and the store (for its prerequisites' results).
type workAttempt struct {
	leases *leases
	lease  *heldLease
	store  *store.Store
}

func (a workAttempt) setProgress(b json.RawMessage) error { return a.leases.setProgress(a.lease, b) }

func (a workAttempt) inputs(ctx context.Context, ids []uuid.UUID) ([]store.Input, error) {
	return a.store.Inputs(ctx, ids)
}

// jobOf is the Job a handler gets for the claimed job c.
func (w *workCall) jobOf(c *claimed) *Job {
	return &Job{ID: c.ID, Type: c.Type, Args: c.Args, Tags: c.Tags, Attempt: c.Attempt,
		MaxAttempts: c.MaxAttempts, Priority: c.Priority, Timeout: c.Timeout, CreatedAt: c.CreatedAt,
		RunAt: c.RunAt, Metadata: c.Meta, pre: c.Prereqs,
		att: workAttempt{leases: w.q.leases, lease: c.Lease, store: w.q.store}}
}

// run runs the claimed job c and submits its outcome, which it returns
// with the Job the handler got (nil when it did not start) and the
// handler's error.
func (w *workCall) run(c *claimed) (*Job, store.Finish, error) {
	_, job, f, err := w.runHanding(c, false)
	return job, f, err
}

// runHanding is run; handOver: when c holds a slot of a concurrency limit
// and its handler ran, the slot goes to a standby job of its type, if the
// domain holds one (standby.go), which it returns for the worker to run
// next.
func (w *workCall) runHanding(c *claimed, handOver bool) (*claimed, *Job, store.Finish, error) {
	next, hold, job, f, err := w.attempt(c, handOver)
	if hold == 0 {
		w.submit(c, f)
	} else {
		// The slot went to next: this job's row stands for it until the
		// claims that read next's token as standby have ended.
		w.finishes.Add(1)
		w.q.leases.afterReaders(hold, func() { w.send(c, f) })
	}
	if c.Conc && job != nil && next == nil {
		// Its slot is free for this process's next claim (leases.end
		// recorded the end), before the outcome is written.
		w.q.acq.slotEnded(c.Type)
	}
	return next, job, f, err
}

// attempt runs the handler on c under its lease and returns the outcome
// to write, with the Job the handler got (nil when it did not start) and
// the handler's error. handOver: see runHanding; next is the standby job
// handed c's slot, and hold, when not 0, what its outcome's write waits
// for (leases.end).
func (w *workCall) attempt(c *claimed, handOver bool) (next *claimed, hold uint64, job *Job, f store.Finish, err error) {
	ls := w.q.leases
	ctx, cancel := context.WithCancelCause(w.hard)
	defer cancel(nil)
	if err := ls.begin(c.Lease, cancel); err != nil {
		return nil, 0, nil, w.notStarted(c, err), nil
	}
	job = w.jobOf(c)
	if job.Timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, job.Timeout, ErrJobTimeout)
		defer stop()
	}
	hooks := w.q.cfg.hooks
	if hooks.Started != nil {
		if hctx := hooks.Started(ctx, job); hctx != nil {
			ctx = hctx
		}
	}
	began := time.Now()
	w.running.Add(1)
	err = callHandler(ctx, w.h, job)
	w.running.Add(-1)
	ran := time.Since(began)
	cause := context.Cause(ctx)

	// Even when the lease was lost locally (not renewed in time), the
	// outcome is written: the write is fenced by the lease token, so it
	// lands only if the database still holds the job under this attempt,
	// which spares a needless re-run.
	var nextLease *heldLease
	if handOver && c.Conc && w.claiming.Err() == nil {
		if next = w.q.acq.takeStandby(w.spec, c.Type); next != nil {
			nextLease = next.Lease
		}
	}
	end := ls.end(c.Lease, nextLease)
	if next != nil && !end.handed {
		w.q.acq.returnStandby(w.spec, next, end.nextGone)
		next = nil
	}
	if next != nil {
		w.q.acq.handOvers.Add(1)
	}
	f = w.outcome(c, job, err, cause, end.fail)
	f.Progress = end.progress // written with the outcome
	if hooks.Finished != nil {
		o := outcomeOf(f, err)
		if end.lost {
			o = OutcomeLeaseLost
		}
		hooks.Finished(ctx, job, JobEvent{Outcome: o, Duration: ran, QueueLatency: c.Waited, Err: err})
	}
	return next, end.holdUntil, job, f, err
}

// notStarted is the outcome of a job whose handler must not start, for
// the reason leases.begin gave.
func (w *workCall) notStarted(c *claimed, why error) store.Finish {
	switch {
	case errors.Is(why, ErrCancelled):
		return store.Finish{ID: c.ID, Token: c.Token, State: string(StateCancelled), Err: store.ErrorText(why), Outcome: attemptCancelled}
	case errors.Is(why, errHeldBack):
		// Paused, or its limits tightened, since it was claimed: it goes
		// back, to be claimed under the new rules.
		return store.Release(c.ID, c.Token)
	default:
		// The lease could not be confirmed in time before the handler
		// started: give the job back (refused if it is no longer ours).
		w.q.log.Warn("backlog: lease lost before the job started; releasing it", "job", c.ID, "type", c.Type)
		return store.Release(c.ID, c.Token)
	}
}

// outcomeOf names the write f for hooks.
func outcomeOf(f store.Finish, err error) Outcome {
	switch {
	case f.State == string(StateCompleted):
		return OutcomeCompleted
	case f.State == string(StateFailed):
		return OutcomeFailed
	case f.State == string(StateCancelled):
		return OutcomeCancelled
	case f.AttemptDelta == store.GiveAttemptBack && err != nil && IsSnooze(err):
		return OutcomeSnoozed
	case f.AttemptDelta == store.GiveAttemptBack:
		return OutcomeReleased
	default:
		return OutcomeRetried
	}
}

func (w *workCall) submit(c *claimed, f store.Finish) {
	w.finishes.Add(1)
	w.send(c, f)
}

// send hands c's outcome f to the completer; the caller has counted it in
// w.finishes.
func (w *workCall) send(c *claimed, f store.Finish) {
	done := w.settled
	if w.written != nil { // test runs only: Work's path stays as it was
		done = func(ok bool) {
			w.written(c, ok)
			w.finishes.Done()
		}
	}
	w.q.comp.Submit(c.Request(f, done))
}

// outcome maps what the handler returned to the write that records it.
// fail, when set, is why the attempt must fail whatever the handler
// returned (its lease could not be renewed).
func (w *workCall) outcome(c *claimed, job *Job, err, cause, fail error) store.Finish {
	f := store.Finish{ID: c.ID, Token: c.Token}
	switch {
	case fail != nil:
		f.State, f.Err, f.Outcome = string(StateFailed), store.ErrorText(fail), attemptError
	case err == nil:
		res, rerr := job.result()
		if rerr != nil {
			f.State, f.Err, f.Outcome = string(StateFailed), store.ErrorText(errors.Unwrap(rerr)), attemptError // the InputError, without "permanent: "
			return f
		}
		f.State, f.Result, f.Discard = string(StateCompleted), res, w.q.cfg.discards(c.Type)
	case errors.Is(cause, ErrCancelled):
		if !errors.Is(err, ErrCancelled) {
			err = fmt.Errorf("%w: %w", ErrCancelled, err)
		}
		f.State, f.Err = string(StateCancelled), store.ErrorText(err)
	case errors.Is(cause, ErrShutdown):
		f.State, f.Delay, f.AttemptDelta = string(StateAvailable), store.KeepRunAt, store.GiveAttemptBack // released, keeping its place
	case snoozeOf(err, &f):
	case IsPermanent(err):
		f.State, f.Err = string(StateFailed), store.ErrorText(withCause(err, cause, job))
	case job.Attempt >= job.MaxAttempts:
		f.State, f.Err = string(StateFailed), store.ErrorText(withCause(err, cause, job))
	default:
		f.State, f.Err, f.Delay = string(StateAvailable), store.ErrorText(withCause(err, cause, job)), w.backoff(job.Type).Delay(job.Attempt)
	}
	if f.Err == nil && err != nil && f.State == string(StateFailed) {
		f.Err = store.ErrorText(err)
	}
	if f.Err != nil && f.Outcome == "" {
		f.Outcome = attemptOutcome(err, cause)
	}
	return f
}

// snoozeOf reports whether err wraps a Snooze, and if so makes f give the
// job back after its delay without spending the attempt. (A variable
// errors.As takes the address of escapes to the heap: declared here, the
// attempts that do not reach this case do not pay for it.)
func snoozeOf(err error, f *store.Finish) bool {
	var s *snoozeError
	if !errors.As(err, &s) {
		return false
	}
	f.State, f.Delay, f.AttemptDelta = string(StateAvailable), s.d, store.GiveAttemptBack
	return true
}

// The outcomes of an attempt that did not succeed, as its error entry
// records them (AttemptError.Outcome). The sweep writes the sixth, "lease
// expired", itself.
const (
	attemptError     = "error"
	attemptTimeout   = "timeout"
	attemptPanic     = "panic"
	attemptLeaseLost = "lease lost"
	attemptCancelled = "cancelled"
)

// attemptOutcome names how an attempt ended whose handler returned err
// after its context ended with cause (nil: it did not end). It is decided
// here, from the error values, and sent to the database as data (since
// migration 25 finish() takes it): the error's text may say nothing of it
// (a handler returning fmt.Errorf("fetching: %w", context.Cause(ctx))
// gets no prefix from withCause), and before, finish() read the outcome
// from the text's prefix, recording such a timeout or lease loss as
// "error". The order is that of those prefixes: the cause of the
// context's end comes before a panic it may have led to.
func attemptOutcome(err, cause error) string {
	var p *panicError
	switch {
	case errors.Is(cause, ErrCancelled) || errors.Is(err, ErrCancelled):
		return attemptCancelled
	case errors.Is(cause, ErrJobTimeout) || errors.Is(err, ErrJobTimeout):
		return attemptTimeout
	case errors.Is(cause, ErrLeaseLost) || errors.Is(err, ErrLeaseLost):
		return attemptLeaseLost
	case errors.As(err, &p):
		return attemptPanic
	default:
		return attemptError
	}
}

// withCause prefixes err with why the handler's context ended, when it
// was the job's timeout or a lost lease and err does not say so: the
// error text names the cause. (The outcome recorded beside it is decided
// from the values, by attemptOutcome, not from this text.)
func withCause(err, cause error, job *Job) error {
	if errors.Is(cause, ErrJobTimeout) && !errors.Is(err, ErrJobTimeout) {
		err = fmt.Errorf("%w after %s: %w", ErrJobTimeout, job.Timeout, err)
	}
	if errors.Is(cause, ErrLeaseLost) && !errors.Is(err, ErrLeaseLost) {
		err = fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return err
}

func (w *workCall) backoff(typ string) Backoff {
	if w.mux != nil {
		if b := w.mux.backoffFor(typ); b != nil {
			return *b
		}
	}
	if w.cfg.backoff != nil {
		return *w.cfg.backoff
	}
	return w.q.cfg.backoff
}

// panicError is a recovered handler panic with its stack.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v\n\n%s", e.value, e.stack) }

func callHandler(ctx context.Context, h Handler, job *Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return h.Work(ctx, job)
}
