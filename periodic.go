package backlog

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

type planner interface {
	// next returns the first plan time strictly after t.
	next(t time.Time) time.Time
}

// everyPlanner plans at every multiple of an interval since the Unix epoch
// (so every process agrees, whenever it started).
type everyPlanner time.Duration

func (p everyPlanner) next(t time.Time) time.Time { return p.floor(t).Add(time.Duration(p)) }

// floor returns the latest plan at or before t.
func (p everyPlanner) floor(t time.Time) time.Time {
	d := int64(p)
	since := t.Sub(time.Unix(0, 0)) // Unix nanoseconds; fine until the year 2262
	n := int64(since) / d
	if int64(since)%d < 0 {
		n-- // before the epoch: round down, not towards zero
	}
	return time.Unix(0, 0).Add(time.Duration(n * d)).In(t.Location())
}

type cronPlanner struct{ s cron.Schedule }

func (p cronPlanner) next(t time.Time) time.Time { return p.s.Next(t.UTC()) }

type schedule struct {
	name    string
	planner planner
	typ     string
	args    any
	opts    []EnqueueOption
	catchUp int
	last    time.Time // latest plan known to be enqueued (by anyone)
	loaded  bool      // last was read from periodic_runs
	def     store.Schedule
	stored  bool // def is in the schedules table
}

// scheduler enqueues due plans of this process's schedules.
type scheduler struct {
	run      runner
	store    *store.Store
	pool     *pgxpool.Pool
	cfg      *config
	log      *slog.Logger
	faults   *outages
	announce announcer
	// enqueue inserts plans' jobs inside tx (the scheduler's own) and
	// returns their postings, to announce after the commit. Set before the
	// scheduler starts.
	enqueue func(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]posting, error)
	wake    chan struct{} // buffer of 1: a registration never blocks

	// confirmEvery is how often the stored schedules are confirmed
	// (scheduleConfirm; tests shorten it).
	confirmEvery time.Duration

	mu        sync.Mutex
	schedules map[string]*schedule
	confirmAt time.Time // when to confirm the stored schedules next
	retryAt   time.Time // recording failed: not before then
}

func newScheduler(st *store.Store, pool *pgxpool.Pool, cfg *config, faults *outages, a announcer) *scheduler {
	return &scheduler{store: st, pool: pool, cfg: cfg, log: cfg.logger, faults: faults, announce: a, schedules: map[string]*schedule{},
		wake: make(chan struct{}, 1), confirmEvery: scheduleConfirm}
}

func (s *scheduler) start() { s.run.start(s.loop) }
func (s *scheduler) stop()  { s.run.stop() }

func (s *scheduler) add(sc *schedule) {
	s.mu.Lock()
	if old := s.schedules[sc.name]; old != nil {
		sc.last, sc.loaded = old.last, old.loaded
	}
	s.schedules[sc.name] = sc
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *scheduler) loop(ctx context.Context) {
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
func (s *scheduler) tick(ctx context.Context) time.Duration {
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
			if ctx.Err() == nil && !s.faults.failed("periodic", err) {
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
	readAt := s.cfg.clock()
	if err != nil {
		if ctx.Err() == nil && !s.faults.failed("periodic", err) {
			s.log.Warn("backlog: reading the database clock failed", "err", err)
		}
		return retry
	}

	var dues []duePlan
	s.mu.Lock()
	scheds := make([]*schedule, 0, len(s.schedules))
	for _, sc := range s.schedules {
		scheds = append(scheds, sc)
	}
	sort.Slice(scheds, func(i, j int) bool { return scheds[i].name < scheds[j].name })
	for _, sc := range scheds {
		if sc.last.IsZero() {
			sc.last = dbNow // never ran: start with the first plan after now
			continue
		}
		for _, p := range missedPlans(sc.planner, sc.last, dbNow, sc.catchUp) {
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
				s.log.Error("backlog: a periodic plan could not be enqueued; skipping it", "schedule", d.sc.name,
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
			if ctx.Err() == nil && !s.faults.failed("periodic", err) {
				s.log.Warn("backlog: enqueueing periodic jobs failed", "err", err)
			}
			return retry
		}
		s.faults.ok("periodic")
		s.log.Debug("backlog: periodic plans due", "plans", len(dues))
	}
	next := time.Time{}
	s.mu.Lock()
	for _, sc := range scheds {
		if n := nextPlan(sc.planner, sc.last, dbNow); next.IsZero() || n.Before(next) {
			next = n
		}
	}
	s.mu.Unlock()
	if next.IsZero() {
		return min(time.Hour, recordIn) // no schedules
	}
	// dbNow was read at readAt on the local clock; whatever that clock's
	// offset from the database, elapsed time on it is real.
	elapsed := s.cfg.clock().Sub(readAt)
	return min(max(next.Sub(dbNow)-elapsed, 0)+time.Millisecond, recordIn)
}

// nextPlan returns the first plan after both the latest enqueued plan
// (zero: none) and now.
func nextPlan(p planner, last, now time.Time) time.Time { return p.next(maxTime(last, now)) }

// duePlan is one plan of one schedule that fell due.
type duePlan struct {
	sc   *schedule
	plan time.Time
}

// enqueuePlans enqueues the jobs of ds in one transaction, each unless
// another process enqueued its plan already, and announces them after the
// commit.
func (s *scheduler) enqueuePlans(ctx context.Context, ds []duePlan) error {
	names := make([]string, len(ds))
	plans := make([]time.Time, len(ds))
	ids := make([]uuid.UUID, len(ds))
	specs := map[uuid.UUID]JobSpec{}
	for i, d := range ds {
		names[i], plans[i], ids[i] = d.sc.name, d.plan, NewID()
		opts := append(append([]EnqueueOption(nil), d.sc.opts...), RunAt(d.plan))
		specs[ids[i]] = JobSpec{ID: ids[i], Type: d.sc.typ, Args: d.sc.args, Options: opts}
	}
	var posts []posting
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		winners, err := s.store.ClaimPlans(ctx, tx, names, plans, ids)
		if err != nil || len(winners) == 0 {
			return err
		}
		batch := make([]JobSpec, 0, len(winners))
		for _, id := range winners {
			batch = append(batch, specs[id])
		}
		posts, err = s.enqueue(ctx, tx, batch)
		return err
	})
	if err != nil {
		return err
	}
	s.announce.committed(posts)
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
func missedPlans(p planner, last, now time.Time, n int) []time.Time {
	if ev, ok := p.(everyPlanner); ok {
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
		for t := p.next(from); !t.After(now) && !t.IsZero(); t = p.next(t) {
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
