// Package periodic is the scheduler of periodic jobs (Queue.Every and
// Queue.Cron): it enqueues, exactly once per (schedule, plan time) across
// processes, the plans that fall due, and records the schedules in the
// schedules table.
package periodic

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/backlogq/backlog/internal/isolate"
	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// Periodic jobs. A schedule is registered in code on every process (Every
// or Cron); each process's scheduler enqueues the plans that fall due. Plan
// times come from the database clock, and the primary key on
// periodic_runs(name, plan_time), written in the same transaction as the
// job, makes sure exactly one job is enqueued per (name, plan time) however
// many processes race for it.
//
// Catch-up: when a process finds plans missed since the schedule's last
// recorded plan (all processes were down), it enqueues only the most recent
// one, or up to n of them with CatchUp(n). A schedule with no recorded plan
// starts with the first plan after it is registered. A changed schedule
// takes effect from its next plan.

// A Planner gives a schedule's plan times.
type Planner interface {
	// Next returns the first plan time strictly after t.
	Next(t time.Time) time.Time
}

// Every plans at every multiple of an interval since the Unix epoch
// (so every process agrees, whenever it started).
type Every time.Duration

func (p Every) Next(t time.Time) time.Time { return p.floor(t).Add(time.Duration(p)) }

// floor returns the latest plan at or before t.
func (p Every) floor(t time.Time) time.Time {
	d := int64(p)
	since := t.Sub(time.Unix(0, 0)) // Unix nanoseconds; fine until the year 2262
	n := int64(since) / d
	if int64(since)%d < 0 {
		n-- // before the epoch: round down, not towards zero
	}
	return time.Unix(0, 0).Add(time.Duration(n * d)).In(t.Location())
}

// Cron plans at the times of a cron schedule (in UTC).
type Cron struct{ S cron.Schedule }

func (p Cron) Next(t time.Time) time.Time { return p.S.Next(t.UTC()) }

// How the schedules table learns which schedules are still registered:
// each process confirms its own every ConfirmEvery (jittered by ±20 %);
// a schedule nobody confirmed for StaleConfirms of those is stale.
const (
	ConfirmEvery  = 5 * time.Minute
	StaleConfirms = 3
	// scheduleRetry is the pause after recording schedules failed.
	scheduleRetry = 10 * time.Second
)

// A Schedule is one registered schedule.
type Schedule struct {
	Name    string
	Planner Planner
	CatchUp int // how many missed plans to enqueue at most
	Job     Job // what its plans are enqueued as
	Def     store.Schedule
	last    time.Time // latest plan known to be enqueued (by anyone)
	loaded  bool      // last was read from periodic_runs
	stored  bool      // Def is in the schedules table
}

// Scheduler enqueues due plans of this process's schedules.
type Scheduler struct {
	group  run.Group
	store  *store.Store
	pool   *pgxpool.Pool
	cfg    Config
	log    *slog.Logger
	faults *outage.Tracker
	wake   chan struct{} // buffer of 1: a registration never blocks

	mu        sync.Mutex
	schedules map[string]*Schedule
	confirmAt time.Time // when to confirm the stored schedules next
	retryAt   time.Time // recording failed: not before then
}

// A Plan is one plan of a schedule that fell due, to enqueue as job ID.
type Plan struct {
	ID       uuid.UUID
	At       time.Time
	Schedule *Schedule
}

// Config is what the scheduler is built with.
type Config struct {
	// Clock is the local clock (tests set it).
	Clock func() time.Time
	// ConfirmEvery is how often the stored schedules are confirmed
	// (ConfirmEvery when zero; tests shorten it).
	ConfirmEvery time.Duration
	// Announce announces the postings of the jobs enqueued, after the
	// commit.
	Announce func(ps []posting.Posting)
}

// A Job is what a schedule's plans are enqueued as.
type Job interface {
	// Enqueue inserts the jobs of plans (all of one schedule) inside tx,
	// the scheduler's own transaction, and returns their postings.
	Enqueue(ctx context.Context, tx pgx.Tx, plans []Plan) ([]posting.Posting, error)
}

// New returns a scheduler; Start starts it.
func New(st *store.Store, pool *pgxpool.Pool, cfg Config, log *slog.Logger, faults *outage.Tracker) *Scheduler {
	if cfg.ConfirmEvery == 0 {
		cfg.ConfirmEvery = ConfirmEvery
	}
	return &Scheduler{store: st, pool: pool, cfg: cfg, log: log, faults: faults, schedules: map[string]*Schedule{},
		wake: make(chan struct{}, 1)}
}

// Start starts the scheduler's loop (once).
func (s *Scheduler) Start() { s.group.Start(s.loop) }

// Stop stops the loop and waits for it.
func (s *Scheduler) Stop() { s.group.Stop(0) }

// SetConfirmEvery changes how often the stored schedules are confirmed
// (tests).
func (s *Scheduler) SetConfirmEvery(d time.Duration) {
	s.mu.Lock()
	s.cfg.ConfirmEvery = d
	s.mu.Unlock()
}

// ConfirmInterval is how often the stored schedules are confirmed.
func (s *Scheduler) ConfirmInterval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.ConfirmEvery
}

// TickNow runs one tick at once and returns when the next is due
// (measurements).
func (s *Scheduler) TickNow(ctx context.Context) time.Duration { return s.tick(ctx) }

// Rewind sets the latest plan of schedule name known to be enqueued
// (measurements).
func (s *Scheduler) Rewind(name string, last time.Time) {
	s.mu.Lock()
	s.schedules[name].last = last
	s.mu.Unlock()
}

// Add registers sc, replacing a schedule of its name (the next plan after
// the replaced one's latest is the first of sc).
func (s *Scheduler) Add(sc *Schedule) {
	s.mu.Lock()
	if old := s.schedules[sc.Name]; old != nil {
		sc.last, sc.loaded = old.last, old.loaded
	}
	s.schedules[sc.Name] = sc
	s.mu.Unlock()
	run.Wake(s.wake)
}

func (s *Scheduler) loop(ctx context.Context) {
	for {
		wait := s.tick(ctx)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// tick enqueues every due plan and returns how long to sleep until the
// next one. It reads the database clock once; the sleep is measured on the
// local clock from that reading, so a skewed local clock does not matter.
func (s *Scheduler) tick(ctx context.Context) time.Duration {
	const retry = time.Second
	recordIn := s.record(ctx)
	s.mu.Lock()
	var toLoad []string
	for n, sc := range s.schedules {
		if !sc.loaded {
			toLoad = append(toLoad, n)
		}
	}
	s.mu.Unlock()
	if len(toLoad) > 0 {
		last, err := s.store.LastPlans(ctx, toLoad)
		if err != nil {
			if ctx.Err() == nil && !s.faults.Failed("periodic", err) {
				s.log.Warn("backlog: reading periodic runs failed", "err", err)
			}
			return retry
		}
		s.mu.Lock()
		for _, n := range toLoad {
			if sc := s.schedules[n]; sc != nil {
				sc.last, sc.loaded = last[n], true
			}
		}
		s.mu.Unlock()
	}
	dbNow, err := s.store.Now(ctx)
	readAt := s.cfg.Clock()
	if err != nil {
		if ctx.Err() == nil && !s.faults.Failed("periodic", err) {
			s.log.Warn("backlog: reading the database clock failed", "err", err)
		}
		return retry
	}

	var dues []duePlan
	s.mu.Lock()
	scheds := make([]*Schedule, 0, len(s.schedules))
	for _, sc := range s.schedules {
		scheds = append(scheds, sc)
	}
	sort.Slice(scheds, func(i, j int) bool { return scheds[i].Name < scheds[j].Name })
	for _, sc := range scheds {
		if sc.last.IsZero() {
			sc.last = dbNow // never ran: start with the first plan after now
			continue
		}
		for _, p := range missedPlans(sc.Planner, sc.last, dbNow, sc.CatchUp) {
			dues = append(dues, duePlan{sc, p})
		}
	}
	s.mu.Unlock()
	if len(dues) > 0 {
		// One transaction for every due plan; a plan whose job cannot be
		// inserted is split off and skipped, never holding back the others.
		w := isolate.Writer[duePlan]{
			Write: func(ctx context.Context, ds []duePlan) error { return s.enqueuePlans(ctx, ds) },
			Poison: func(_ context.Context, d duePlan, cause error) error {
				s.log.Error("backlog: a periodic plan could not be enqueued; skipping it", "schedule", d.sc.Name,
					"plan", d.plan, "err", cause)
				s.mu.Lock()
				if d.plan.After(d.sc.last) {
					d.sc.last = d.plan
				}
				s.mu.Unlock()
				return nil
			},
		}
		if _, err := w.Run(ctx, dues); err != nil {
			if ctx.Err() == nil && !s.faults.Failed("periodic", err) {
				s.log.Warn("backlog: enqueueing periodic jobs failed", "err", err)
			}
			return retry
		}
		s.faults.OK("periodic")
		s.log.Debug("backlog: periodic plans due", "plans", len(dues))
	}
	next := time.Time{}
	s.mu.Lock()
	for _, sc := range scheds {
		if n := NextPlan(sc.Planner, sc.last, dbNow); next.IsZero() || n.Before(next) {
			next = n
		}
	}
	s.mu.Unlock()
	if next.IsZero() {
		return min(time.Hour, recordIn) // no schedules
	}
	// dbNow was read at readAt on the local clock; whatever that clock's
	// offset from the database, elapsed time on it is real.
	elapsed := s.cfg.Clock().Sub(readAt)
	return min(max(next.Sub(dbNow)-elapsed, 0)+time.Millisecond, recordIn)
}

// NextPlan returns the first plan after both the latest enqueued plan
// (zero: none) and now.
func NextPlan(p Planner, last, now time.Time) time.Time { return p.Next(maxTime(last, now)) }

// duePlan is one plan of one schedule that fell due.
type duePlan struct {
	sc   *Schedule
	plan time.Time
}

// enqueuePlans enqueues the jobs of ds in one transaction, each unless
// another process enqueued its plan already, and announces them after the
// commit.
func (s *Scheduler) enqueuePlans(ctx context.Context, ds []duePlan) error {
	names := make([]string, len(ds))
	plans := make([]time.Time, len(ds))
	ids := make([]uuid.UUID, len(ds))
	byID := map[uuid.UUID]Plan{}
	for i, d := range ds {
		names[i], plans[i], ids[i] = d.sc.Name, d.plan, uuid.Must(uuid.NewV7())
		byID[ids[i]] = Plan{ID: ids[i], At: d.plan, Schedule: d.sc}
	}
	var posts []posting.Posting
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		winners, err := s.store.ClaimPlans(ctx, tx, names, plans, ids)
		if err != nil || len(winners) == 0 {
			return err
		}
		// The winners of each schedule, in one call each (in the order of
		// ds: by name).
		var order []*Schedule
		bySc := map[*Schedule][]Plan{}
		for _, id := range winners {
			p := byID[id]
			if bySc[p.Schedule] == nil {
				order = append(order, p.Schedule)
			}
			bySc[p.Schedule] = append(bySc[p.Schedule], p)
		}
		for _, sc := range order {
			ps, err := sc.Job.Enqueue(ctx, tx, bySc[sc])
			if err != nil {
				return err
			}
			posts = append(posts, ps...)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.cfg.Announce(posts)
	s.mu.Lock()
	for _, d := range ds {
		if d.plan.After(d.sc.last) {
			d.sc.last = d.plan
		}
	}
	s.mu.Unlock()
	return nil
}

// missedPlans returns up to n of the most recent plans in (last, now].
func missedPlans(p Planner, last, now time.Time, n int) []time.Time {
	if ev, ok := p.(Every); ok {
		d := time.Duration(ev)
		var out []time.Time
		for t := ev.floor(now); t.After(last) && len(out) < n; t = t.Add(-d) {
			out = append([]time.Time{t}, out...)
		}
		return out
	}
	// Walk forward from a window before now that doubles until it holds n
	// plans or reaches back to last: the work is about the plans in the
	// final window, however long ago last was.
	for window := time.Hour; ; window *= 2 {
		from := now.Add(-window)
		if !from.After(last) || window > 1<<20*time.Hour {
			from = last
		}
		var ring []time.Time
		for t := p.Next(from); !t.After(now) && !t.IsZero(); t = p.Next(t) {
			ring = append(ring, t)
			if len(ring) > n {
				ring = ring[1:]
			}
		}
		if len(ring) >= n || from.Equal(last) {
			return ring
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// record writes the definitions of the schedules registered since it last
// ran and, every confirm interval, confirms the others (re-writing those
// whose row was deleted). It returns when it must run next. Failing only
// delays the listing: plans are enqueued all the same.
func (s *Scheduler) record(ctx context.Context) time.Duration {
	now := time.Now()
	s.mu.Lock()
	if now.Before(s.retryAt) {
		s.mu.Unlock()
		return time.Until(s.retryAt)
	}
	var confirm []string
	if !now.Before(s.confirmAt) {
		for n, sc := range s.schedules {
			if sc.stored {
				confirm = append(confirm, n)
			}
		}
	}
	s.mu.Unlock()
	failed := func(what string, err error) time.Duration {
		if ctx.Err() == nil && !s.faults.Failed("schedules", err) {
			s.log.Warn("backlog: "+what+" failed; Schedules lists them once it succeeds", "err", err)
		}
		s.mu.Lock()
		s.retryAt = time.Now().Add(scheduleRetry)
		s.mu.Unlock()
		return scheduleRetry
	}
	if len(confirm) > 0 {
		missing, err := s.store.ConfirmSchedules(ctx, confirm)
		if err != nil {
			return failed("confirming periodic schedules", err)
		}
		s.mu.Lock()
		for _, n := range missing {
			if sc := s.schedules[n]; sc != nil {
				sc.stored = false
			}
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	if !now.Before(s.confirmAt) {
		s.confirmAt = now.Add(run.Jitter(s.cfg.ConfirmEvery))
	}
	var defs []store.Schedule
	var scs []*Schedule
	for _, sc := range s.schedules {
		if !sc.stored {
			defs = append(defs, sc.Def)
			scs = append(scs, sc)
		}
	}
	s.mu.Unlock()
	if len(defs) > 0 {
		if err := s.store.RegisterSchedules(ctx, defs); err != nil {
			return failed("recording periodic schedules", err)
		}
		s.mu.Lock()
		for _, sc := range scs {
			sc.stored = true // a schedule replaced meanwhile is another, not yet stored
		}
		s.mu.Unlock()
	}
	s.faults.OK("schedules")
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Until(s.confirmAt)
}
