// Package maintain is a Queue's maintenance service: the promoter of
// Scheduled jobs, the expired-lease sweep, the retirer and the cleaner.
package maintain

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// Batch sizes of the maintenance statements: small, so no statement holds
// many row locks or runs long.
const (
	sweepBatch   = 500
	cleanBatch   = 1000
	retireBatch  = 1000
	PromoteBatch = 1000
	// cleanMaxBatches bounds one cleaner pass; the next pass goes on.
	cleanMaxBatches = 100
	// promoteGap is the least time between two promotions of a process:
	// Scheduled jobs due within it are promoted together.
	promoteGap = 10 * time.Millisecond
	// retireGap is the least time between two retire passes: graph writes
	// that leave finished rows in place are moved together.
	retireGap = 100 * time.Millisecond
	// summarizeGap is how often, while jobs finish, job_history's BRIN
	// indexes are brought up to date (SummarizeHistory).
	summarizeGap = 2 * time.Second
	// vacuumDead is how many dead rows the jobs table may hold, as its
	// statistics count them, before the maintenance loop (on its summary
	// tick, while jobs finish) vacuums it; vacuumGap the least time since
	// the last vacuum (store.VacuumJobs).
	vacuumDead    = 100_000
	vacuumLive    = 100_000 // and only while it holds this many live ones (store.VacuumJobs)
	vacuumGap     = summarizeGap
	vacuumSpacing = 4
	// sweepSlack is how long after a lease's expiry the sweep looks, at
	// most (jittered from a tenth of it), so that many processes do not
	// Sweep in step.
	sweepSlack = 300 * time.Millisecond
)

// Service is the Queue's maintenance service. Any number of processes
// may run it: every statement skips rows another one holds.
//   - The promoter makes scheduled jobs available when they are due and
//     announces them. It sleeps until the earliest scheduled job it knows
//     of: it learns of new ones from postings (scheduled) and, as a backup,
//     looks every poll interval.
//   - The expired-lease sweep runs just after the earliest lease of a
//     running job expires (so a crashed worker's jobs run again about a
//     lease after it stopped renewing them), and at least every sweep
//     interval.
//   - The retirer moves finished jobs that the graph paths wrote in place
//     into job_history, soon after such a write (retireSoon) and on every
//     sweep.
//   - The cleaner drops expired job_history partitions, creates the ones
//     needed ahead, trims periodic_runs and deletes the rows of dead
//     processes and of ordering keys with no live job, every clean
//     interval.
//
// Intervals are jittered by ±20 % so that processes do not run in step.
type Service struct {
	group    run.Group
	store    *store.Store
	cfg      Config
	log      *slog.Logger
	faults   *outage.Tracker
	announce func(ps []posting.Posting) // announces jobs made available

	ensureMu sync.Mutex
	ensured  bool // EnsurePartitions ran

	promoteBusy time.Duration // backoff while due jobs are held by others
	sweepBusy   time.Duration // backoff while expired leases cannot be swept

	finished atomic.Bool // jobs moved to job_history since the last summary

	// vacuuming: a vacuum of the jobs table runs in its own goroutine (at
	// most one at a time; the loop goes on promoting, sweeping and
	// retiring meanwhile). The fields below belong to that goroutine: one
	// runs only after the previous one cleared vacuuming.
	vacuuming atomic.Bool
	noVacuum  bool // the role may not vacuum the jobs table
	// vacuumLeft: the dead rows the last vacuum could not remove: a
	// vacuum waits for vacuumDead more, so that a long transaction holding
	// them back does not make it vacuum in vain every tick.
	vacuumLeft int64
	// vacuumTook: how long the last vacuum took; the next waits at least
	// vacuumSpacing times that, so that vacuuming a large table keeps to a
	// fraction of the time.
	vacuumTook time.Duration

	mu        sync.Mutex
	promoteAt time.Time // earliest known scheduled job; zero: none known
	retire    bool      // retire soon
	kick      chan struct{}
}

// Config is what the service needs of the Queue's options.
type Config struct {
	PollInterval  time.Duration // the promoter's backup look
	SweepInterval time.Duration // the sweep's backup interval
	CleanInterval time.Duration
	KeepFailed    time.Duration // retention of failed and cancelled jobs
	// Retention is the longest retention of any state: counts are rolled
	// up past it.
	Retention time.Duration
	// VacuumDead is how many dead rows the jobs table may hold before the
	// loop vacuums it (0: vacuumDead); VacuumLive how many live rows it
	// must hold (0: vacuumLive).
	VacuumDead, VacuumLive int64
}

// OldTransaction is the age past which the cleaner warns of the oldest
// open transaction (the Queue's OldTransactionWarning).
const OldTransaction = time.Minute

// New returns the service; announce announces jobs the promoter or the
// Sweep made available.
func New(st *store.Store, cfg Config, log *slog.Logger, faults *outage.Tracker, announce func(ps []posting.Posting)) *Service {
	return &Service{store: st, cfg: cfg, log: log, faults: faults, announce: announce, kick: make(chan struct{}, 1)}
}

// Start starts the service's loop (once).
func (m *Service) Start() { m.group.Start(m.loop) }

// Stop stops the loop and waits for it.
func (m *Service) Stop() { m.group.Stop(0) }

// EnsurePartitions makes the job_history partitions of the days ahead the
// first time a Work call starts, before any of its jobs can finish: a
// finish into a day without its partition lands in the default partition,
// from which the cleaner must move the day later. Failing is not fatal
// (the cleaner tries again every clean interval).
func (m *Service) EnsurePartitions(ctx context.Context) {
	m.ensureMu.Lock()
	defer m.ensureMu.Unlock()
	if m.ensured {
		return
	}
	m.ensured = true
	if _, err := m.store.EnsurePartitions(ctx); err != nil && ctx.Err() == nil && !m.faults.Failed("partitions", err) {
		m.log.Warn("backlog: creating job_history partitions failed; the cleaner tries again", "err", err)
	} else if err == nil {
		m.faults.OK("partitions")
	}
}

// Scheduled hears that jobs become due in `in`.
func (m *Service) Scheduled(in time.Duration) {
	at := time.Now().Add(in)
	m.mu.Lock()
	earlier := m.promoteAt.IsZero() || at.Before(m.promoteAt)
	if earlier {
		m.promoteAt = at
	}
	m.mu.Unlock()
	if earlier {
		m.wake()
	}
}

// FinishedSome notes that jobs entered job_history: its BRIN indexes want
// a summary soon.
func (m *Service) FinishedSome() { m.finished.Store(true) }

// RetireSoon asks for finished jobs written in place to be moved.
func (m *Service) RetireSoon() {
	m.mu.Lock()
	m.retire = true
	m.mu.Unlock()
	m.wake()
}

func (m *Service) wake() {
	run.Wake(m.kick)
}

func (m *Service) loop(ctx context.Context) {
	// Partitions first: a finish never fails without them (the default
	// partition takes the rows), but retention is cheap only with them.
	m.cleanPass(ctx)
	now := time.Now()
	nextClean := now.Add(run.Jitter(m.cfg.CleanInterval))
	nextSweep := now
	backupLook := now // the promoter's look, whatever it knows
	var lastPromote, lastRetire, lastSummary time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		m.mu.Lock()
		promoteAt, retire := m.promoteAt, m.retire
		m.mu.Unlock()
		if promoteAt.IsZero() || backupLook.Before(promoteAt) {
			promoteAt = backupLook
		}
		if next := lastPromote.Add(promoteGap); next.After(promoteAt) {
			promoteAt = next
		}
		retireAt := lastRetire.Add(retireGap)
		now := time.Now()
		switch {
		case !now.Before(promoteAt):
			lastPromote = now
			m.promotePass(ctx)
			backupLook = time.Now().Add(run.Jitter(m.cfg.PollInterval))
			continue
		case !now.Before(nextSweep):
			nextSweep = now.Add(m.sweepPass(ctx))
			continue
		case retire && !now.Before(retireAt):
			lastRetire = now
			m.retirePass(ctx)
			continue
		case !now.Before(nextClean):
			m.cleanPass(ctx)
			nextClean = now.Add(run.Jitter(m.cfg.CleanInterval))
			continue
		case m.finished.Load() && !now.Before(lastSummary.Add(summarizeGap)):
			lastSummary = now
			m.finished.Store(false)
			if _, err := m.store.SummarizeHistory(ctx); err != nil && ctx.Err() == nil && !m.faults.Failed("summaries", err) {
				m.log.Warn("backlog: summarizing job_history's indexes failed", "err", err)
			} else if err == nil {
				m.faults.OK("summaries")
			}
			m.vacuumPass()
			continue
		}
		wait := min(promoteAt.Sub(now), nextSweep.Sub(now), nextClean.Sub(now))
		if m.finished.Load() {
			wait = min(wait, lastSummary.Add(summarizeGap).Sub(now))
		}
		if retire {
			wait = min(wait, retireAt.Sub(now))
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
			t.Stop()
		case <-t.C:
		}
	}
}

// vacuumPass starts a vacuum of the jobs table in the service's group
// unless one runs: a VACUUM of a large table takes a while (0.2 s at a
// million rows, longer past it, far longer under a cost delay), and the
// loop must not stop promoting, sweeping and retiring for it.
func (m *Service) vacuumPass() {
	if !m.vacuuming.CompareAndSwap(false, true) {
		return
	}
	if !m.group.Go(func(ctx context.Context) {
		defer m.vacuuming.Store(false)
		m.vacuum(ctx)
	}) {
		m.vacuuming.Store(false) // stopping
	}
}

// vacuum vacuums the jobs table once it holds vacuumDead dead rows
// (store.VacuumJobs: a draining backlog's dead index entries slow every
// claim), unless the role may not.
func (m *Service) vacuum(ctx context.Context) {
	if m.noVacuum {
		return
	}
	dead := m.cfg.VacuumDead
	if dead <= 0 {
		dead = vacuumDead
	}
	start := time.Now()
	live := m.cfg.VacuumLive
	if live <= 0 {
		live = vacuumLive
	}
	r, err := m.store.VacuumJobs(ctx, m.vacuumLeft+dead, live, max(vacuumGap, vacuumSpacing*m.vacuumTook))
	switch {
	case pgerr.StatementTimeout(err) && ctx.Err() == nil:
		// Cancelled by the role's statement_timeout: it would be every
		// time (not an outage); leave the table to autovacuum. (A
		// migration cancels a running one too: that is the case below.)
		m.noVacuum = true
		m.log.Info("backlog: vacuuming the jobs table outlasts the pool's statement_timeout; autovacuum alone removes its dead rows", "err", err)
	case pgerr.Code(err) == "57014" && ctx.Err() == nil:
		// Cancelled on request: a migration that needs the table does so
		// (migrate.cancelVacuum). Not a fault; vacuum again later.
		m.vacuumTook = time.Since(start)
		m.log.Info("backlog: the vacuum of the jobs table was cancelled (by a migration?); it runs again later", "err", err)
	case err != nil:
		m.vacuumTook = time.Since(start) // back off as after a vacuum that long
		if ctx.Err() == nil && !m.faults.Failed("vacuum", err) {
			m.log.Warn("backlog: vacuuming the jobs table failed", "err", err)
		}
	case r.NotOwner:
		m.noVacuum = true
		m.log.Info("backlog: the pool's role may not vacuum the jobs table (it does not own it); autovacuum alone removes its dead rows")
	default:
		m.faults.OK("vacuum")
		switch {
		case r.Vacuumed:
			m.vacuumLeft, m.vacuumTook = r.Left, time.Since(start)
			m.log.Debug("backlog: vacuumed the jobs table", "dead", r.Dead, "left", r.Left)
		case r.Dead < m.vacuumLeft:
			m.vacuumLeft = r.Dead // removed since (by autovacuum, or another process)
		}
	}
}

// promotePass promotes every due scheduled job and learns when the next
// one is due.
func (m *Service) promotePass(ctx context.Context) {
	m.mu.Lock()
	m.promoteAt = time.Time{}
	m.mu.Unlock()
	n, next, err := m.promote(ctx)
	if err != nil {
		if ctx.Err() == nil {
			if !m.faults.Failed("promoter", err) {
				m.log.Warn("backlog: promoting scheduled jobs failed", "err", err)
			}
			m.Scheduled(time.Second) // try again
		}
		return
	}
	m.faults.OK("promoter")
	if n > 0 {
		m.log.Debug("backlog: promoted scheduled jobs", "jobs", n)
	}
	if next >= 0 {
		m.Scheduled(next)
	}
}

// promote promotes due scheduled jobs in batches and returns how many, and
// the time until the next one (< 0: none). Jobs locked by another
// transaction (another process promoting them, usually) are looked at
// again shortly.
func (m *Service) promote(ctx context.Context) (int, time.Duration, error) {
	total := 0
	for busy := 0; ; {
		p, err := m.store.Promote(ctx, PromoteBatch)
		total += p.Jobs
		m.announce(posting.OfAvail(p.Avail))
		if err != nil {
			return total, -1, fmt.Errorf("promoting scheduled jobs: %w", err)
		}
		switch {
		case !p.More:
			m.promoteBusy = 0
			return total, p.Next, nil
		case p.Jobs == PromoteBatch:
			continue
		case busy < 3:
			busy++
			continue
		default:
			// Due jobs held by another transaction (another process
			// promoting them, usually): look again soon, backing off while
			// it lasts.
			m.promoteBusy = min(m.promoteBusy*2+50*time.Millisecond, time.Second)
			return total, m.promoteBusy, nil
		}
	}
}

// sweepPass sweeps expired leases and returns when to look again: just
// after the earliest lease of a running job expires, and at least every
// Sweep interval.
func (m *Service) sweepPass(ctx context.Context) time.Duration {
	backup := run.Jitter(m.cfg.SweepInterval)
	if _, err := m.Sweep(ctx); err != nil {
		if ctx.Err() == nil && !m.faults.Failed("sweep", err) {
			m.log.Warn("backlog: expired-lease sweep failed", "err", err)
		}
		return backup
	}
	m.faults.OK("sweep")
	m.retirePass(ctx)
	in, ok, err := m.store.NextExpiry(ctx)
	if err != nil || !ok {
		m.sweepBusy = 0
		return backup
	}
	if in <= 0 {
		// Still expired: rows the sweep skipped because another
		// transaction holds them. Back off while that lasts.
		m.sweepBusy = min(m.sweepBusy*2+sweepSlack, backup)
		return m.sweepBusy
	}
	m.sweepBusy = 0
	return min(in+sweepSlack/10+rand.N(sweepSlack), backup)
}

func (m *Service) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		res, err := m.store.SweepExpired(ctx, sweepBatch)
		total += res.Swept
		ps := posting.OfAvail(res.Avail)
		for _, t := range res.Types {
			// A freed slot, for a claim held back by the type's
			// concurrency limit, whatever its tags (the job itself may
			// have failed or been cancelled).
			ps = append(ps, posting.Posting{Type: t})
		}
		m.announce(ps)
		if res.Poisoned > 0 {
			m.log.Error("backlog: expired jobs that could not be swept were failed", "jobs", res.Poisoned)
		}
		if err != nil {
			return total, fmt.Errorf("sweeping expired leases: %w", err)
		}
		if res.Swept < sweepBatch {
			if total > 0 {
				m.log.Info("backlog: swept expired leases", "jobs", total)
			}
			return total, nil
		}
	}
}

// retirePass moves finished jobs written in place into job_history.
func (m *Service) retirePass(ctx context.Context) {
	m.mu.Lock()
	m.retire = false
	m.mu.Unlock()
	for range cleanMaxBatches {
		n, err := m.store.Retire(ctx, retireBatch)
		if n > 0 {
			m.FinishedSome()
		}
		if err != nil {
			if ctx.Err() == nil && !m.faults.Failed("retirer", err) {
				m.log.Warn("backlog: moving finished jobs to job_history failed", "err", err)
			}
			return
		}
		m.faults.OK("retirer")
		if n < retireBatch {
			return
		}
	}
}

func (m *Service) cleanPass(ctx context.Context) {
	if _, err := m.Clean(ctx); err != nil && ctx.Err() == nil && !m.faults.Failed("cleaner", err) {
		m.log.Warn("backlog: cleaner failed", "err", err)
	} else if err == nil {
		m.faults.OK("cleaner")
	}
	m.warnOldTransaction(ctx)
}

// warnOldTransaction logs the oldest open transaction of the database when
// it is older than OldTransaction: it keeps PostgreSQL from cleaning
// up dead job rows, and claims slow down while they pile up.
func (m *Service) warnOldTransaction(ctx context.Context) {
	s, err := m.store.OldestSnapshot(ctx)
	if err != nil || s == nil || s.Age < OldTransaction {
		return
	}
	m.log.Warn("backlog: an old transaction holds back the cleanup of dead job rows; claims slow down until it ends",
		"kind", s.Kind, "pid", s.PID, "age", s.Age.Round(time.Second), "state", s.State, "application", s.Application, "query", s.Query)
}

// Clean runs one cleaner pass.
func (m *Service) Clean(ctx context.Context) (Cleaned, error) {
	var total Cleaned
	if _, err := m.store.EnsurePartitions(ctx); err != nil {
		// Not fatal: finishes fall back to the default partition.
		if !m.faults.Failed("partitions", err) {
			m.log.Warn("backlog: creating job_history partitions failed", "err", err)
		}
	} else {
		m.faults.OK("partitions")
	}
	for total.Batches < cleanMaxBatches {
		r, err := m.store.Clean(ctx, m.cfg.KeepFailed, cleanBatch)
		total.Batches++
		total.Partitions += r.Partitions
		total.Jobs += r.Jobs
		total.PeriodicRuns += r.Runs
		if err != nil {
			return total, fmt.Errorf("cleaning finished jobs: %w", err)
		}
		if r.Jobs < cleanBatch && r.Runs < cleanBatch {
			break
		}
	}
	total.MoreRemaining = total.Batches == cleanMaxBatches
	if _, err := m.store.RollUpCounts(ctx, m.cfg.Retention); err != nil {
		return total, fmt.Errorf("rolling up job counts: %w", err)
	}
	n, err := m.store.CleanProcesses(ctx)
	total.Processes = n
	total.Batches++
	if err != nil {
		return total, fmt.Errorf("removing dead processes: %w", err)
	}
	if _, err := m.store.CleanRates(ctx); err != nil {
		return total, fmt.Errorf("removing spent rate limit states: %w", err)
	}
	n, err = m.store.CleanInputs(ctx, cleanBatch)
	total.Inputs = n
	total.Batches++
	if err != nil {
		return total, fmt.Errorf("removing kept prerequisite results: %w", err)
	}
	if err := m.cleanOrderingKeys(ctx, &total); err != nil {
		return total, err
	}
	if total.Partitions > 0 || total.Jobs > 0 || total.PeriodicRuns > 0 || total.Processes > 0 || total.Inputs > 0 || total.OrderingKeys > 0 {
		m.log.Info("backlog: cleaner removed expired history", "partitions", total.Partitions, "jobs", total.Jobs,
			"periodic_runs", total.PeriodicRuns, "processes", total.Processes, "inputs", total.Inputs,
			"ordering_keys", total.OrderingKeys, "batches", total.Batches, "more", total.MoreRemaining)
	}
	return total, nil
}

// cleanOrderingKeys walks job_ordering_keys in key order, a page of
// cleanBatch rows a transaction (two statements), deleting the rows of
// keys that have no live job, up to cleanMaxBatches pages a pass; the
// next pass starts over.
func (m *Service) cleanOrderingKeys(ctx context.Context, total *Cleaned) error {
	after := ""
	for range cleanMaxBatches {
		n, last, err := m.store.CleanOrderingKeys(ctx, after, cleanBatch)
		total.OrderingKeys += n
		total.Batches++
		if err != nil {
			return err
		}
		if last == "" {
			return nil
		}
		after = last
	}
	total.MoreRemaining = true
	return nil
}

// Cleaned counts what one cleaner pass did (the Queue's CleanResult has
// the same fields).
type Cleaned struct {
	Partitions   int // expired job_history partitions dropped
	Jobs         int // expired rows deleted from job_history's default partition
	PeriodicRuns int // periodic_runs rows past retention
	Processes    int // rows of dead processes (see Queue.Processes)
	// Inputs: kept results of prerequisites (see Job.Prerequisites) that
	// no live job needs any more.
	Inputs int
	// OrderingKeys: rows of ordering keys that have no live job any more
	// (the table job_ordering_keys; see OrderingKey).
	OrderingKeys  int
	Batches       int // statements run
	MoreRemaining bool
}
