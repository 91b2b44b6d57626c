package backlog

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/backlogq/backlog/internal/claim"
	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/prefetch"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// acquirerStore is the one thing the Acquirer needs from the database
// (the claimer).
type acquirerStore interface {
	// claim takes up to k due jobs for the domain under fresh leases, now
	// of them for workers waiting now (the rest fill the prefetch
	// buffer). saturated: the domain's last claim found a concurrency
	// limit binding; standby: how many standby jobs it may take beyond
	// the k (see claim.Claimer.Claim).
	claim(ctx context.Context, d *domainSpec, k, now int, saturated bool, standby int) (claimResult, error)
	// release gives back jobs that were claimed but that no worker took.
	release(jobs []*claimed)
	// holdBack stops the jobs of types that were handed to workers but
	// whose handlers have not begun (they give them back).
	holdBack(types []string)
	// flowChanges returns the current flow epoch and the types paused or
	// whose limits were tightened after epoch since.
	flowChanges(ctx context.Context, since int64) (int64, []string, error)
}

// extraClaimMax bounds an extra claim: one started by a posting while the
// domain's claim is in flight (see extraClaim).
const extraClaimMax = 16

// limitedPoll bounds how long a domain held back by a concurrency limit
// waits before it looks again, announced or not.
const limitedPoll = time.Second

// flowWatch is how often a process that holds prefetched jobs asks the
// database whether types were paused or limits tightened since it last
// asked (flow epochs, migration 15), so that it gives back the jobs those
// hold back even when the NOTIFY that says so is lost.
const flowWatch = time.Second

// acquirer hands claimed jobs to waiting workers.
//
// Acquirees that want the same job types with the same worker tags form a
// domain. One claim loop per domain runs at a time (the domain's claim
// goroutine holds the clearance), plus at most one extra claim started by a
// posting that lands while the loop's claim is in flight (maybeExtraLocked);
// the loop's claim asks for k jobs, k being
// the number of the domain's workers waiting when it starts plus what its
// prefetch buffer lacks, and hands them out first come, first served. At
// low load a claim takes one job with no added delay; under load, waiting workers
// that come back while a claim is in flight are served together by the next
// one, so claims batch by themselves.
//
// The prefetch buffer holds jobs claimed ahead of demand, so that workers
// find a job at once while the next claim is in flight. Its size follows
// demand (internal/prefetch): about what the domain's workers take during two
// claims, so slow handlers keep (almost) nothing back from other processes,
// and at most the largest Prefetch of the Work calls that joined the
// domain. Buffered jobs are leased like any other (the heartbeat renews
// them; a handler's timeout starts when it starts); they are given back
// when the last Work call leaves the domain (leave) or the acquirer
// closes.
//
// A pause or a tightened limit (drop) takes the jobs of its types out of
// every buffer, stops those handed out whose handlers have not begun, and
// makes a claim that was in flight meanwhile give back what it took
// (drops counts them per domain): its statement may have run under the
// old rules. So once Pause or SetLimit returns, no handler of the type
// begins in this process but on a job claimed under the new rules. Other
// processes drop on the NOTIFY, and within flowWatch when it is lost: a
// process holding prefetched jobs reads the flow epoch every flowWatch.
//
// A claim that returns fewer jobs than asked parks the domain: no query runs
// for it until a matching posting arrives (post) or its jittered backup poll
// fires. Jobs due later are not the domain's concern: they wait as
// scheduled, and the promoter (maintenance) announces them when they are
// due; postings about them go to scheduled. A posting that lands while a claim is in flight sets pending, and
// the domain queries again right after, so a job committed just after the
// claim's snapshot is never left to the backup poll. A domain with no
// waiting worker stops its timers, and the first waiting worker to come back queries at
// once (unless the buffer serves it); a domain no Work call has joined and
// that holds nothing is deleted.
//
// An waiting worker whose context ends while a claim is in flight stays in line
// and is answered by that claim: with a job, which its caller must release
// (so the release is accounted to the Work call that asked for the job), or
// with nothing. So when acquire returns, no claim made on the waiting worker's
// behalf is still running.
type acquirer struct {
	store        acquirerStore
	log          *slog.Logger
	faults       *outage.Tracker
	pollInterval time.Duration
	pollJitter   time.Duration
	// scheduled hears of jobs due in the given time (postings with In > 0).
	scheduled func(in time.Duration)

	// group owns the claim goroutines and timer callbacks; claims run
	// under its context (ctx), not under a waiting worker's.
	group run.Group
	ctx   context.Context

	mu      sync.Mutex
	domains map[string]*domain
	closed  bool
	flow    flowState

	// saturated counts the domains whose concurrency limit binds
	// (domain.saturated), and slotEnds the handlers of jobs holding a
	// slot of one that ended: slotEnded takes a.mu only when a domain
	// needs the wake, not once a job in every burn-down of a limited type.
	saturated atomic.Int32
	slotEnds  atomic.Uint64
	// handOvers counts the slots handed to standby jobs (standby.go).
	handOvers atomic.Uint64
}

// flowState is what the acquirer knows of the flow epoch (see flowWatch).
type flowState struct {
	epoch    int64     // the last epoch read: changes after it are news
	known    bool      // epoch was read (until then every type changed ever is news)
	watch    *acqTimer // the next read, armed while a buffer holds jobs
	watching bool      // a read is in flight
}

type domain struct {
	spec     *domainSpec
	users    int                       // Work calls that joined and have not left
	idle     chan struct{}             // closed when a claim in flight ends (leave waits on it)
	pre      prefetch.Buffer[*claimed] // the buffer of jobs claimed ahead
	waiters  []*waitingWorker          // FIFO
	querying bool                      // a claim goroutine runs for this domain
	pending  bool                      // woken while querying: query again
	extra    bool                      // an extra claim (extraClaim) is in flight
	extraK   int                       // how many jobs it asked for
	drops    int                       // drops that concerned the domain's types: a claim in flight across one gives its jobs back
	short    bool                      // the last claim came back short and unlimited: no backlog
	posted   int                       // postings since the loop's claim started
	slots    bool                      // a claim took jobs holding slots of a limit: no extra claims
	// saturated: the last claim found a concurrency limit binding (no
	// slot left beyond its callers'): claims pass the tokens of jobs
	// whose handlers ended, and each such end wakes the domain
	// (a.saturated counts such domains).
	saturated bool
	// standby are jobs claimed beyond a binding concurrency limit
	// (store.Claimed.Standby), oldest first, each put at standbyAt's
	// time: a worker whose handler of the type ended here runs one in
	// its slot (takeStandby). sb sizes them.
	standby   []*claimed
	standbyAt []time.Time
	sb        standbySizer
	parked    bool      // the last claim came back short: wait for a wake
	poll      *acqTimer // backup poll, armed while parked
	retry     *acqTimer // after a failed claim, or one that skipped locked jobs
	errs      backoff.BackOff
	skips     backoff.BackOff
}

// waitingWorker is a worker waiting in a domain's line for a job
// (acquire): a claim hands it one through ch.
type waitingWorker struct {
	ch   chan handout // buffer of 1: the hand-out never blocks under a.mu
	gone bool         // its context ended during a claim: the claim answers it
}

// handout is what a waiting worker is handed: a claimed job, or why none.
type handout struct {
	job *claimed
	err error
}

// claimResult is what one claim took.
type claimResult = claim.Result[*heldLease]

// claimSource is the Queue's acquirerStore: its claimer, and its leases,
// which stop handed-out jobs of held-back types.
type claimSource struct {
	cl     *claim.Claimer[*heldLease]
	leases *leases
}

func (c claimSource) claim(ctx context.Context, d *domainSpec, k, now int, saturated bool, standby int) (claimResult, error) {
	return c.cl.Claim(ctx, d.types, d.tagsJ, k, now, saturated, standby)
}

func (c claimSource) release(jobs []*claimed) { c.cl.Release(jobs) }

func (c claimSource) holdBack(types []string) { c.leases.holdBack(types) }

func (c claimSource) flowChanges(ctx context.Context, since int64) (int64, []string, error) {
	return c.cl.FlowChanges(ctx, since)
}

type acqTimer struct{ t *run.Timer }

func newAcquirer(store acquirerStore, log *slog.Logger, faults *outage.Tracker, pollInterval, pollJitter time.Duration,
	scheduled func(in time.Duration)) *acquirer {
	a := &acquirer{store: store, scheduled: scheduled, log: log, faults: faults, pollInterval: pollInterval, pollJitter: pollJitter,
		domains: map[string]*domain{}}
	a.ctx = a.group.Context()
	return a
}

// acquire blocks until it is handed a job of the domain, ctx is done, or
// the acquirer is closed. When ctx ends while a claim is in flight, it
// waits for that claim, which may still hand it a job: it then returns the
// job together with ctx's error, and the caller must release the job.
func (a *acquirer) acquire(ctx context.Context, spec *domainSpec) (*claimed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	d := a.domainLocked(spec)
	if len(d.waiters) == 0 {
		if job, buffered, ok := d.pre.Take(time.Now()); ok {
			job.Waited += buffered // the time in the buffer is queue latency too
			a.maybeClaimLocked(d)  // refill
			a.mu.Unlock()
			return job, nil
		}
		// The first to come back to an empty domain queries at once, as
		// if the domain were new.
		d.parked = false
		a.stopTimer(&d.poll)
	}
	w := &waitingWorker{ch: make(chan handout, 1)}
	d.pre.Tick(time.Now(), len(d.waiters))
	d.waiters = append(d.waiters, w)
	a.maybeClaimLocked(d)
	a.mu.Unlock()

	select {
	case r := <-w.ch:
		return r.job, r.err
	case <-ctx.Done():
	}
	a.mu.Lock()
	if d.busyLocked() {
		if d.indexLocked(w) >= 0 {
			w.gone = true // a claim in flight answers it
		}
	} else if d.removeLocked(w) {
		a.gcLocked(d)
		a.mu.Unlock()
		return nil, ctx.Err()
	}
	a.mu.Unlock()
	// Answered by the claim (or handed a job at the moment ctx ended).
	r := <-w.ch
	if r.err != nil && r.job == nil {
		return nil, r.err
	}
	return r.job, ctx.Err()
}

// claimRetryMax bounds the backoff of a domain's failed claims, or the
// poll interval when that is shorter: a domain retries a failed claim at
// least as often as it polls, so that a queue without a listener to wake
// it (WithPollOnly) comes back from an outage within its poll interval.
const claimRetryMax = 5 * time.Second

// domainLocked returns spec's domain, making it if needed.
func (a *acquirer) domainLocked(spec *domainSpec) *domain {
	d := a.domains[spec.key]
	if d == nil {
		d = &domain{spec: spec, errs: run.NewBackoff(100*time.Millisecond, min(claimRetryMax, max(a.pollInterval, 100*time.Millisecond))),
			skips: run.NewBackoff(5*time.Millisecond, time.Second)}
		a.domains[spec.key] = d
	}
	return d
}

// join registers a Work call of workers worker goroutines with its
// domain, prefetching up to prefetch jobs for it (0: none). Every join
// must be followed by leave.
func (a *acquirer) join(spec *domainSpec, workers, prefetch int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.domainLocked(spec)
	d.users++
	d.pre.Workers += workers
	d.pre.Max = max(d.pre.Max, prefetch)
}

// leave unregisters a Work call whose waiting workers have all returned. When it
// was the domain's last, leave waits for a claim still in flight and
// returns the jobs the buffer holds, which the caller must release (so
// they are accounted to that Work call).
func (a *acquirer) leave(spec *domainSpec, workers int) []*claimed {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.domains[spec.key]
	if d == nil {
		return nil
	}
	d.users--
	d.pre.Workers -= workers
	if d.users > 0 {
		return nil
	}
	for d.busyLocked() {
		if d.idle == nil {
			d.idle = make(chan struct{})
		}
		ch := d.idle
		a.mu.Unlock()
		<-ch
		a.mu.Lock()
	}
	if d.users > 0 { // another Work call joined meanwhile: it keeps the buffer
		return nil
	}
	jobs := append(d.pre.Drain(), d.dropStandbyLocked(nil)...)
	a.gcLocked(d)
	return jobs
}

func (d *domain) indexLocked(w *waitingWorker) int {
	for i, x := range d.waiters {
		if x == w {
			return i
		}
	}
	return -1
}

func (d *domain) removeLocked(w *waitingWorker) bool {
	d.pre.Tick(time.Now(), len(d.waiters))
	for i, x := range d.waiters {
		if x == w {
			d.waiters = append(d.waiters[:i:i], d.waiters[i+1:]...)
			return true
		}
	}
	return false
}

// maybeClaimLocked starts the domain's claim goroutine when it has waiters
// and nothing holds it back.
func (a *acquirer) maybeClaimLocked(d *domain) {
	if a.closed || d.querying || d.parked || d.retry != nil || len(d.waiters) == 0 && !d.pre.Low() && !d.standbyLowLocked() {
		return
	}
	d.querying = true
	a.group.Go(func(context.Context) { a.claimLoop(d) })
}

// claimLoop is the domain's clearance: the only code that queries for it.
func (a *acquirer) claimLoop(d *domain) {
	for {
		a.mu.Lock()
		// Waiters an extra claim in flight asked for are not counted.
		wanted := max(d.wantedLocked()-d.extraK, 0)
		k := wanted + d.pre.Deficit()
		sb := d.standbyDeficitLocked()
		if k == 0 && sb == 0 || a.closed {
			if !d.extra {
				d.answerGoneLocked()
			}
			a.endClaimLocked(d)
			a.gcLocked(d)
			a.mu.Unlock()
			return
		}
		d.pending, d.posted = false, 0
		started := time.Now()
		d.pre.StartClaim(started, len(d.waiters))
		d.sb.sample(started)
		drops := d.drops
		saturated := d.saturated
		ends := a.slotEnds.Load()
		a.mu.Unlock()

		res, err := a.claim(d, k, wanted, saturated, sb)
		jobs, standby := splitStandby(res.Jobs)

		a.mu.Lock()
		now := time.Now()
		d.pre.Claimed(now.Sub(started))
		d.sb.claimed(now.Sub(started))
		var surplus []*claimed // if the acquirer closed, or a drop came, during the claim
		if d.drops != drops {
			// A pause or a tightened limit came while the statement ran,
			// perhaps under the old rules: give everything back and ask
			// again under the new ones.
			surplus, jobs = append(jobs, standby...), nil
			standby = nil
			d.pending = true
		}
		n := a.handOutLocked(d, jobs, now)
		if !d.extra {
			d.answerGoneLocked()
		}
		d.short = err == nil && len(jobs) < k && res.Limited == store.LimitedNone && d.drops == drops
		d.slots = d.slots || holdsSlots(jobs)
		// A failed claim clears it: during an outage the ends of
		// handlers must not wake the domain past its backoff.
		a.setSaturatedLocked(d, err == nil && res.Saturated)
		if d.saturated && !saturated && a.slotEnds.Load() != ends {
			// Slots freed while the claim ran, before it said the limit
			// binds: nothing woke the domain for them.
			d.pending = true
		}
		if a.closed {
			surplus = append(surplus, jobs[n:]...)
			surplus = append(surplus, standby...)
		} else {
			a.bufferLocked(d, jobs[n:])
			a.putStandbyLocked(d, standby, now)
			if err == nil && !d.saturated {
				// The limit no longer binds: standby jobs would wait for
				// slots that claims now take. They go back.
				surplus = append(surplus, d.dropStandbyLocked(nil)...)
			}
		}

		switch {
		case err != nil:
			a.endClaimLocked(d)
			if a.closed || a.ctx.Err() != nil {
				a.gcLocked(d)
				a.mu.Unlock()
				a.store.release(surplus)
				return
			}
			wait := d.errs.NextBackOff()
			if !a.faults.Failed("claims", err) {
				a.log.Warn("backlog: claiming jobs failed; retrying", "types", d.spec.types, "in", wait, "err", err)
			}
			a.retryLocked(d, wait)
			a.gcLocked(d)
			a.mu.Unlock()
			a.store.release(surplus)
			return
		case k > 0 && len(jobs) == k || d.pending:
			// A full batch (there may be more), or woken meanwhile: go again.
			d.errs.Reset()
			d.skips.Reset()
			a.mu.Unlock()
			a.store.release(surplus)
			continue
		case res.Limited == store.LimitedWait && res.Next > 0:
			// A rate limit: its next start is due in res.Next.
			d.errs.Reset()
			d.skips.Reset()
			a.endClaimLocked(d)
			a.retryLocked(d, res.Next)
			a.gcLocked(d)
			a.mu.Unlock()
			a.store.release(surplus)
			return
		case res.Limited == store.LimitedDemand && len(jobs) >= wanted && len(d.waiters) > 0:
			// Every waiting worker counted got a job, jobs beyond them were
			// held back (limited types are barely prefetched), and
			// waiting workers came meanwhile.
			d.errs.Reset()
			d.skips.Reset()
			a.mu.Unlock()
			a.store.release(surplus)
			continue
		case res.Limited == store.LimitedWait:
			// Slots are taken: a freed one is announced (by the finish or
			// the sweep), and a limited domain also looks again within
			// limitedPoll, for slots freed without an announcement (jobs
			// that started before the limit was set, a process of an
			// older version).
			d.errs.Reset()
			d.skips.Reset()
			a.endClaimLocked(d)
			a.retryLocked(d, min(a.pollInterval, limitedPoll))
			a.gcLocked(d)
			a.mu.Unlock()
			a.store.release(surplus)
			return
		case res.Skipped:
			// Jobs are there but locked: by a claim about to take them, or
			// by a transaction adding a dependent (possibly for as long as
			// the caller's transaction lasts). Look again soon, backing off.
			d.errs.Reset()
			a.endClaimLocked(d)
			a.retryLocked(d, d.skips.NextBackOff())
			a.gcLocked(d)
			a.mu.Unlock()
			a.store.release(surplus)
			return
		default:
			d.errs.Reset()
			d.skips.Reset()
			a.endClaimLocked(d)
			d.parked = true
			a.armPollLocked(d)
			a.gcLocked(d)
			a.mu.Unlock()
			a.store.release(surplus)
			return
		}
	}
}

// claim runs one claim for d of up to k jobs, now of them wanted at once,
// and up to standby standby jobs; saturated: d's last claim found a
// concurrency limit binding.
func (a *acquirer) claim(d *domain, k, now int, saturated bool, standby int) (claimResult, error) {
	res, err := a.store.claim(a.ctx, d.spec, k, now, saturated, standby)
	if err == nil {
		a.faults.OK("claims")
	}
	if err == nil && len(res.Jobs) > k+standby {
		// Broken invariant: keep what was asked for, give the rest back.
		a.log.Error("backlog: claim returned more jobs than asked; releasing the extra",
			"asked", k+standby, "got", len(res.Jobs), "types", d.spec.types)
		a.store.release(res.Jobs[k+standby:])
		res.Jobs = res.Jobs[:k+standby]
	}
	return res, err
}

// splitStandby separates the standby jobs of a claim (the last it took
// of each type) from the others, keeping each part's order.
func splitStandby(all []*claimed) (jobs, standby []*claimed) {
	n := 0
	for _, j := range all {
		if j.Standby {
			n++
		}
	}
	if n == 0 {
		return all, nil
	}
	jobs = make([]*claimed, 0, len(all)-n)
	standby = make([]*claimed, 0, n)
	for _, j := range all {
		if j.Standby {
			standby = append(standby, j)
		} else {
			jobs = append(jobs, j)
		}
	}
	return jobs, standby
}

// handOutLocked hands jobs to the domain's first waiters, FIFO, and
// returns how many it handed (none once the acquirer is closed: every job
// is then surplus, for the caller to release).
func (a *acquirer) handOutLocked(d *domain, jobs []*claimed, now time.Time) int {
	n := min(len(jobs), len(d.waiters))
	if a.closed {
		n = 0
	}
	d.pre.Tick(now, len(d.waiters))
	for i := range n {
		d.pre.Hand()
		d.waiters[i].ch <- handout{job: jobs[i]}
	}
	d.waiters = append([]*waitingWorker(nil), d.waiters[n:]...)
	return n
}

// endClaimLocked ends the domain's claim goroutine's clearance.
func (a *acquirer) endClaimLocked(d *domain) {
	d.querying = false
	d.idleLocked()
}

// holdsSlots reports whether any of jobs holds a slot of a concurrency
// limit.
func holdsSlots(jobs []*claimed) bool {
	for _, j := range jobs {
		if j.Slot {
			return true
		}
	}
	return false
}

// busyLocked reports whether a claim of the domain is in flight.
func (d *domain) busyLocked() bool { return d.querying || d.extra }

// idleLocked tells leave once no claim of the domain is in flight.
func (d *domain) idleLocked() {
	if !d.busyLocked() && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
}

// wantedLocked counts the waiters whose contexts have not ended.
func (d *domain) wantedLocked() int {
	n := 0
	for _, w := range d.waiters {
		if !w.gone {
			n++
		}
	}
	return n
}

// maybeExtraLocked starts an extra claim when a posting lands while the
// domain's claim is in flight, the domain has no backlog (its last claim
// came back short, not held back by a limit), its types hold no slots of
// a concurrency limit (seen in what its claims took) and waiters wait: the claim
// in flight cannot see the posted jobs (its snapshot is older), and
// without an extra claim they would wait for it to end and for the next
// one. This halves pickup latency at moderate rates, when claims and
// postings overlap. At most one extra claim runs, of at most
// extraClaimMax jobs; a domain with a backlog never starts one (its
// claims come back full and it queries again at once anyway).
func (a *acquirer) maybeExtraLocked(d *domain) {
	d.posted++
	if a.closed || d.extra || !d.querying || !d.short || d.slots {
		return
	}
	// As many jobs as postings landed (each announces at least one job),
	// for waiters the claim in flight may not serve.
	k := min(d.wantedLocked(), d.posted, extraClaimMax)
	if k == 0 {
		return
	}
	d.extra, d.extraK = true, k
	d.pending = false // the extra claim's snapshot sees what was posted
	a.group.Go(func(context.Context) { a.extraClaim(d, k, d.drops) })
}

// extraClaim runs one extra claim (maybeExtraLocked) and hands out what
// it took. What follows is left to the domain's claim loop when it still
// runs: told to query again (pending) when the extra claim came back full
// or failed. When the loop has ended meanwhile, the extra claim does what
// the loop would have. drops is the domain's drop count when it started.
func (a *acquirer) extraClaim(d *domain, k, drops int) {
	res, err := a.claim(d, k, k, false, 0)
	jobs := res.Jobs
	a.mu.Lock()
	d.extra, d.extraK = false, 0
	var surplus []*claimed
	dropped := d.drops != drops
	if dropped { // see claimLoop
		surplus, jobs = jobs, nil
	}
	n := a.handOutLocked(d, jobs, time.Now())
	if a.closed || d.pre.Target() == 0 || holdsSlots(jobs) {
		// Jobs no waiter took (the loop's claim served them meanwhile)
		// go back unless the domain keeps a buffer: a leased job must not
		// wait in a buffer nobody sized, nor hold a limit's slot there.
		surplus = append(surplus, jobs[n:]...)
	} else {
		a.bufferLocked(d, jobs[n:])
	}
	d.slots = d.slots || holdsSlots(jobs)
	full := err == nil && len(jobs) == k
	if full {
		d.short = false // a backlog, perhaps: the loop's claims take it
	}
	again := err != nil || full || dropped || res.Skipped || res.Limited != store.LimitedNone
	if d.querying {
		// The loop goes on, told to query again when this claim saw more
		// (or failed); it answers the waiters whose contexts ended.
		if again {
			d.pending = true
		}
	} else {
		// The loop ended meanwhile. It may have ended without parking
		// (nothing to ask for while this claim was counted for its
		// waiters), and postings may have landed since: unless the loop
		// parked or armed a retry with nothing pending, look again, as if
		// woken.
		d.answerGoneLocked()
		d.idleLocked()
		if again || d.pending || (!d.parked && d.retry == nil && len(d.waiters) > 0) {
			a.wakeLocked(d)
		}
		a.gcLocked(d)
	}
	a.mu.Unlock()
	a.store.release(surplus)
}

// answerGoneLocked answers the waiting workers whose contexts ended during the
// claim and that it did not hand a job.
func (d *domain) answerGoneLocked() {
	keep := d.waiters[:0]
	for _, w := range d.waiters {
		if w.gone {
			w.ch <- handout{}
			continue
		}
		keep = append(keep, w)
	}
	clear(d.waiters[len(keep):])
	d.waiters = keep
}

// retryLocked makes the domain query again after wait (a wake comes first).
func (a *acquirer) retryLocked(d *domain, wait time.Duration) {
	d.retry = a.afterFuncLocked(wait, func(t *acqTimer) {
		if d.retry == t {
			d.retry = nil
			a.maybeClaimLocked(d)
		}
	})
}

// wakeLocked makes a parked domain query again.
func (a *acquirer) wakeLocked(d *domain) {
	if d.querying {
		d.pending = true
		a.maybeExtraLocked(d)
		return
	}
	d.parked = false
	a.stopTimer(&d.poll)
	a.stopTimer(&d.retry)
	a.maybeClaimLocked(d)
}

func (a *acquirer) armPollLocked(d *domain) {
	a.stopTimer(&d.poll)
	wait := a.pollInterval
	if a.pollJitter > 0 {
		wait += rand.N(a.pollJitter)
	}
	d.poll = a.afterFuncLocked(wait, func(t *acqTimer) {
		if d.poll == t {
			d.poll = nil
			a.wakeLocked(d)
		}
	})
}

// gcLocked stops the timers of a domain nobody waits in (the next
// waiting worker to arrive queries at once), and deletes it when no Work call
// has joined it and it holds no job.
func (a *acquirer) gcLocked(d *domain) {
	if len(d.waiters) > 0 || d.busyLocked() {
		return
	}
	a.stopTimer(&d.poll)
	a.stopTimer(&d.retry)
	if d.users <= 0 && d.pre.Len() == 0 && len(d.standby) == 0 && a.domains[d.spec.key] == d {
		a.setSaturatedLocked(d, false)
		delete(a.domains, d.spec.key)
	}
}

// afterFuncLocked runs f under a.mu after wait, in the acquirer's group
// (so close awaits it, or it never runs).
func (a *acquirer) afterFuncLocked(wait time.Duration, f func(t *acqTimer)) *acqTimer {
	t := &acqTimer{}
	t.t = a.group.AfterFunc(wait, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if !a.closed {
			f(t)
		}
	})
	return t
}

func (a *acquirer) stopTimer(p **acqTimer) {
	if *p != nil {
		(*p).t.Stop()
	}
	*p = nil
}

// post wakes every domain the posting matches (same rule as the claim's
// SQL). A posting of scheduled jobs goes to scheduled instead; one of
// paused types, or of types whose limits were tightened, drops their
// prefetched jobs.
func (a *acquirer) post(p posting.Posting) {
	if len(p.Hold) > 0 {
		a.drop(p.Hold)
		return
	}
	if p.Sched {
		if a.scheduled != nil {
			a.scheduled(time.Duration(p.In) * time.Millisecond)
		}
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.domains {
		if d.spec.matches(p.Type, p.Tags) {
			a.wakeLocked(d)
		}
	}
}

// slotEnded wakes the domains of typ whose concurrency limit binds: a job
// of typ that held a slot of it has ended its handler, and their next
// claim does not count it against the limit (leases.Ended). A claim in
// flight of a domain not known to bind sees the count move, and its domain
// claims again if that claim finds the limit binding.
func (a *acquirer) slotEnded(typ string) {
	a.slotEnds.Add(1)
	if a.saturated.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.domains {
		if d.saturated && d.spec.matches(typ, nil) {
			a.wakeLocked(d)
		}
	}
}

// setSaturatedLocked records whether d's concurrency limit binds, keeping
// a.saturated the count of such domains.
func (a *acquirer) setSaturatedLocked(d *domain, on bool) {
	if d.saturated == on {
		return
	}
	d.saturated = on
	if on {
		a.saturated.Add(1)
	} else {
		a.saturated.Add(-1)
	}
}

// drop makes a pause, or tightened limits, of the given types bind the
// jobs this process claimed before it (see the acquirer's doc): it gives
// back their buffered jobs, makes claims in flight of their domains give
// back what they took, and stops those handed out whose handlers have
// not begun.
func (a *acquirer) drop(types []string) {
	var back []*claimed
	a.mu.Lock()
	for _, d := range a.domains {
		if !slices.ContainsFunc(types, func(t string) bool { _, ok := slices.BinarySearch(d.spec.types, t); return ok }) {
			continue
		}
		d.drops++
		back = append(back, d.pre.Remove(func(j *claimed) bool { return slices.Contains(types, j.Type) })...)
		back = append(back, d.dropStandbyLocked(types)...)
	}
	a.mu.Unlock()
	a.store.holdBack(types)
	a.store.release(back)
}

// bufferLocked adds jobs no waiting worker took to d's buffer, and has the flow
// epoch watched while it holds them.
func (a *acquirer) bufferLocked(d *domain, jobs []*claimed) {
	d.pre.Put(jobs)
	if d.pre.Len() > 0 && a.flow.watch == nil && !a.flow.watching {
		a.flow.watch = a.afterFuncLocked(flowWatch, a.watchFlowLocked)
	}
}

// watchFlowLocked reads the flow epoch when a buffer holds jobs, and
// drops the jobs of the types changed since the last read (see
// flowWatch). It re-arms itself while buffers hold jobs.
func (a *acquirer) watchFlowLocked(t *acqTimer) {
	if a.flow.watch != t {
		return
	}
	a.flow.watch = nil
	if !a.bufferedLocked() {
		return
	}
	a.releaseIdleLocked()
	a.flow.watching = true
	since := a.flow.epoch
	a.group.Go(func(ctx context.Context) {
		epoch, types, err := a.store.flowChanges(ctx, since)
		if err == nil && len(types) > 0 {
			a.drop(types)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.flow.watching = false
		switch {
		case err != nil && a.ctx.Err() == nil:
			if !a.faults.Failed("flow watch", err) {
				a.log.Warn("backlog: reading flow-control changes failed; retrying", "in", flowWatch, "err", err)
			}
		case err == nil:
			a.faults.OK("flow watch")
			a.flow.epoch, a.flow.known = max(a.flow.epoch, epoch), true
		}
		if !a.closed && a.bufferedLocked() && a.flow.watch == nil {
			a.flow.watch = a.afterFuncLocked(flowWatch, a.watchFlowLocked)
		}
	})
}

// releaseIdleLocked gives back the buffered jobs of domains whose workers
// are all busy and took none of them for a flowWatch, and drops the
// demand their buffers were sized by. The buffer aims at what the workers
// would take during two claims at the rate last measured, and that rate is
// measured only when a claim starts: workers that all went into long
// handlers after quick ones would keep their buffer's jobs, leased, for as
// long as the handlers run, while another process's idle workers could
// run them. So are standby jobs none of which was taken for a flowWatch
// (idleStandbyLocked).
func (a *acquirer) releaseIdleLocked() {
	now := time.Now()
	var back []*claimed
	for _, d := range a.domains {
		if len(d.waiters) == 0 && !d.busyLocked() && d.pre.Idle(now, flowWatch) {
			back = append(back, d.pre.Drain()...)
			d.pre.Forget()
		}
		back = append(back, d.idleStandbyLocked(now)...)
	}
	if len(back) > 0 {
		a.group.Go(func(context.Context) { a.store.release(back) })
	}
}

// bufferedLocked reports whether any domain holds prefetched or standby
// jobs.
func (a *acquirer) bufferedLocked() bool {
	for _, d := range a.domains {
		if d.pre.Len() > 0 || len(d.standby) > 0 {
			return true
		}
	}
	return false
}

// flowBaseline reads the flow epoch once, before the first claim, so that
// the first watch drops only what changed after it (without it, the first
// watch gives back the buffered jobs of every type ever paused or
// limited, once). A failed read is left to that first watch.
func (a *acquirer) flowBaseline(ctx context.Context) {
	a.mu.Lock()
	known := a.flow.known
	a.mu.Unlock()
	if known {
		return
	}
	epoch, _, err := a.store.flowChanges(ctx, math.MaxInt64)
	if err != nil {
		return
	}
	a.mu.Lock()
	a.flow.epoch, a.flow.known = max(a.flow.epoch, epoch), true
	a.mu.Unlock()
}

// wakeAll wakes every domain, and the promoter: after the listener
// (re)connects, postings may have been lost.
func (a *acquirer) wakeAll() {
	if a.scheduled != nil {
		a.scheduled(0)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.domains {
		a.wakeLocked(d)
	}
}

// close fails every waiting acquire with ErrClosed, stops all timers and
// waits for the claim goroutines and timer callbacks to finish. Idempotent.
func (a *acquirer) close() {
	var buffered []*claimed
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		for _, d := range a.domains {
			for _, w := range d.waiters {
				if d.busyLocked() {
					w.gone = true // a claim in flight answers it
				} else {
					w.ch <- handout{err: ErrClosed}
				}
			}
			if !d.busyLocked() {
				d.waiters = nil
			}
			a.stopTimer(&d.poll)
			a.stopTimer(&d.retry)
			buffered = append(buffered, d.pre.Drain()...)
			buffered = append(buffered, d.dropStandbyLocked(nil)...)
		}
		a.stopTimer(&a.flow.watch)
	}
	a.mu.Unlock()
	// The buffers go back. A claim in flight puts nothing in its buffer
	// once the acquirer is closed: it releases what it took.
	a.store.release(buffered)
	// Let claims in flight finish, so jobs they took are released rather
	// than left running until their leases expire; cut them off if the
	// database does not answer.
	a.group.Stop(closeClaimWait)
}

func (a *acquirer) stop() { a.close() }

// closeClaimWait bounds how long close waits for claims in flight.
const closeClaimWait = 5 * time.Second
