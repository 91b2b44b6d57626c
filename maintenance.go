package backlog

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// Batch sizes of the maintenance statements: small, so no statement holds
// many row locks or runs long.
const (
	sweepBatch   = 500
	cleanBatch   = 1000
	retireBatch  = 1000
	promoteBatch = 1000
	// cleanMaxBatches bounds one cleaner pass; the next pass goes on.
	cleanMaxBatches = 100
	// promoteGap is the least time between two promotions of a process:
	// scheduled jobs due within it are promoted together.
	promoteGap = 10 * time.Millisecond
	// retireGap is the least time between two retire passes: graph writes
	// that leave finished rows in place are moved together.
	retireGap = 100 * time.Millisecond
	// summarizeGap is how often, while jobs finish, job_history's BRIN
	// indexes are brought up to date (SummarizeHistory).
	summarizeGap = 2 * time.Second
	// sweepSlack is how long after a lease's expiry the sweep looks, at
	// most (jittered from a tenth of it), so that many processes do not
	// sweep in step.
	sweepSlack = 300 * time.Millisecond
)

// maintenance is the Queue's maintenance service. Any number of processes
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
type maintenance struct {
	run      runner
	store    *store.Store
	cfg      *config
	log      *slog.Logger
	faults   *outages
	announce announcer

	ensureMu sync.Mutex
	ensured  bool // ensurePartitions ran

	promoteBusy time.Duration // backoff while due jobs are held by others
	sweepBusy   time.Duration // backoff while expired leases cannot be swept

	finished atomic.Bool // jobs moved to job_history since the last summary

	mu        sync.Mutex
	promoteAt time.Time // earliest known scheduled job; zero: none known
	retire    bool      // retire soon
	kick      chan struct{}
}

func newMaintenance(st *store.Store, cfg *config, log *slog.Logger, faults *outages, a announcer) *maintenance {
	return &maintenance{store: st, cfg: cfg, log: log, faults: faults, announce: a, kick: make(chan struct{}, 1)}
}

func (m *maintenance) start() { m.run.start(m.loop) }
func (m *maintenance) stop()  { m.run.stop() }

// ensurePartitions makes the job_history partitions of the days ahead the
// first time a Work call starts, before any of its jobs can finish: a
// finish into a day without its partition lands in the default partition,
// from which the cleaner must move the day later. Failing is not fatal
// (the cleaner tries again every clean interval).
func (m *maintenance) ensurePartitions(ctx context.Context) {
	m.ensureMu.Lock()
	defer m.ensureMu.Unlock()
	if m.ensured {
		return
	}
	m.ensured = true
	if _, err := m.store.EnsurePartitions(ctx); err != nil && ctx.Err() == nil && !m.faults.failed("partitions", err) {
		m.log.Warn("backlog: creating job_history partitions failed; the cleaner tries again", "err", classify(err))
	} else if err == nil {
		m.faults.ok("partitions")
	}
}

// scheduled hears that jobs become due in `in`.
func (m *maintenance) scheduled(in time.Duration) {
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

// finishedSome notes that jobs entered job_history: its BRIN indexes want
// a summary soon.
func (m *maintenance) finishedSome() { m.finished.Store(true) }

// retireSoon asks for finished jobs written in place to be moved.
func (m *maintenance) retireSoon() {
	m.mu.Lock()
	m.retire = true
	m.mu.Unlock()
	m.wake()
}

func (m *maintenance) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

func (m *maintenance) loop(ctx context.Context) {
	// Partitions first: a finish never fails without them (the default
	// partition takes the rows), but retention is cheap only with them.
	m.cleanPass(ctx)
	now := time.Now()
	nextClean := now.Add(jitter(m.cfg.cleanInterval))
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
		promoteAt = maxTime(promoteAt, lastPromote.Add(promoteGap))
		retireAt := lastRetire.Add(retireGap)
		now := time.Now()
		switch {
		case !now.Before(promoteAt):
			lastPromote = now
			m.promotePass(ctx)
			backupLook = time.Now().Add(jitter(m.cfg.pollInterval))
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
			nextClean = now.Add(jitter(m.cfg.cleanInterval))
			continue
		case m.finished.Load() && !now.Before(lastSummary.Add(summarizeGap)):
			lastSummary = now
			m.finished.Store(false)
			if _, err := m.store.SummarizeHistory(ctx); err != nil && ctx.Err() == nil && !m.faults.failed("summaries", err) {
				m.log.Warn("backlog: summarizing job_history's indexes failed", "err", classify(err))
			} else if err == nil {
				m.faults.ok("summaries")
			}
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

// promotePass promotes every due scheduled job and learns when the next
// one is due.
func (m *maintenance) promotePass(ctx context.Context) {
	m.mu.Lock()
	m.promoteAt = time.Time{}
	m.mu.Unlock()
	n, next, err := m.promote(ctx)
	if err != nil {
		if ctx.Err() == nil {
			if !m.faults.failed("promoter", err) {
				m.log.Warn("backlog: promoting scheduled jobs failed", "err", err)
			}
			m.scheduled(time.Second) // try again
		}
		return
	}
	m.faults.ok("promoter")
	if n > 0 {
		m.log.Debug("backlog: promoted scheduled jobs", "jobs", n)
	}
	if next >= 0 {
		m.scheduled(next)
	}
}

// promote promotes due scheduled jobs in batches and returns how many, and
// the time until the next one (< 0: none). Jobs locked by another
// transaction (another process promoting them, usually) are looked at
// again shortly.
func (m *maintenance) promote(ctx context.Context) (int, time.Duration, error) {
	total := 0
	for busy := 0; ; {
		p, err := m.store.Promote(ctx, promoteBatch)
		total += p.Jobs
		m.announce.committed(postingsOf(p.Avail))
		if err != nil {
			return total, -1, classify(fmt.Errorf("promoting scheduled jobs: %w", err))
		}
		switch {
		case !p.More:
			m.promoteBusy = 0
			return total, p.Next, nil
		case p.Jobs == promoteBatch:
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
// sweep interval.
func (m *maintenance) sweepPass(ctx context.Context) time.Duration {
	backup := jitter(m.cfg.sweepInterval)
	if _, err := m.sweep(ctx); err != nil {
		if ctx.Err() == nil && !m.faults.failed("sweep", err) {
			m.log.Warn("backlog: expired-lease sweep failed", "err", err)
		}
		return backup
	}
	m.faults.ok("sweep")
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

func (m *maintenance) sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		res, err := m.store.SweepExpired(ctx, sweepBatch)
		total += res.Swept
		ps := postingsOf(res.Avail)
		for _, t := range res.Types {
			// A freed slot, for a claim held back by the type's
			// concurrency limit, whatever its tags (the job itself may
			// have failed or been cancelled).
			ps = append(ps, posting{Type: t})
		}
		m.announce.committed(ps)
		if res.Poisoned > 0 {
			m.log.Error("backlog: expired jobs that could not be swept were failed", "jobs", res.Poisoned)
		}
		if err != nil {
			return total, classify(fmt.Errorf("sweeping expired leases: %w", err))
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
func (m *maintenance) retirePass(ctx context.Context) {
	m.mu.Lock()
	m.retire = false
	m.mu.Unlock()
	for range cleanMaxBatches {
		n, err := m.store.Retire(ctx, retireBatch)
		if n > 0 {
			m.finishedSome()
		}
		if err != nil {
			if ctx.Err() == nil && !m.faults.failed("retirer", err) {
				m.log.Warn("backlog: moving finished jobs to job_history failed", "err", classify(err))
			}
			return
		}
		m.faults.ok("retirer")
		if n < retireBatch {
			return
		}
	}
}

// CleanResult counts what one cleaner pass did.
type CleanResult struct {
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

func (m *maintenance) cleanPass(ctx context.Context) {
	if _, err := m.clean(ctx); err != nil && ctx.Err() == nil && !m.faults.failed("cleaner", err) {
		m.log.Warn("backlog: cleaner failed", "err", err)
	} else if err == nil {
		m.faults.ok("cleaner")
	}
	m.warnOldTransaction(ctx)
}

// warnOldTransaction logs the oldest open transaction of the database when
// it is older than OldTransactionWarning: it keeps PostgreSQL from cleaning
// up dead job rows, and claims slow down while they pile up.
func (m *maintenance) warnOldTransaction(ctx context.Context) {
	s, err := m.store.OldestSnapshot(ctx)
	if err != nil || s == nil || s.Age < OldTransactionWarning {
		return
	}
	m.log.Warn("backlog: an old transaction holds back the cleanup of dead job rows; claims slow down until it ends",
		"kind", s.Kind, "pid", s.PID, "age", s.Age.Round(time.Second), "state", s.State, "application", s.Application, "query", s.Query)
}

func (m *maintenance) clean(ctx context.Context) (CleanResult, error) {
	var total CleanResult
	if _, err := m.store.EnsurePartitions(ctx); err != nil {
		// Not fatal: finishes fall back to the default partition.
		if !m.faults.failed("partitions", err) {
			m.log.Warn("backlog: creating job_history partitions failed", "err", classify(err))
		}
	} else {
		m.faults.ok("partitions")
	}
	for total.Batches < cleanMaxBatches {
		r, err := m.store.Clean(ctx, m.cfg.keepFailed, cleanBatch)
		total.Batches++
		total.Partitions += r.Partitions
		total.Jobs += r.Jobs
		total.PeriodicRuns += r.Runs
		if err != nil {
			return total, classify(fmt.Errorf("cleaning finished jobs: %w", err))
		}
		if r.Jobs < cleanBatch && r.Runs < cleanBatch {
			break
		}
	}
	total.MoreRemaining = total.Batches == cleanMaxBatches
	if _, err := m.store.RollUpCounts(ctx, MaxRetention); err != nil {
		return total, classify(fmt.Errorf("rolling up job counts: %w", err))
	}
	n, err := m.store.CleanProcesses(ctx)
	total.Processes = n
	total.Batches++
	if err != nil {
		return total, classify(fmt.Errorf("removing dead processes: %w", err))
	}
	if _, err := m.store.CleanRates(ctx); err != nil {
		return total, classify(fmt.Errorf("removing spent rate limit states: %w", err))
	}
	n, err = m.store.CleanInputs(ctx, cleanBatch)
	total.Inputs = n
	total.Batches++
	if err != nil {
		return total, classify(fmt.Errorf("removing kept prerequisite results: %w", err))
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
func (m *maintenance) cleanOrderingKeys(ctx context.Context, total *CleanResult) error {
	after := ""
	for range cleanMaxBatches {
		n, last, err := m.store.CleanOrderingKeys(ctx, after, cleanBatch)
		total.OrderingKeys += n
		total.Batches++
		if err != nil {
			return classify(err)
		}
		if last == "" {
			return nil
		}
		after = last
	}
	total.MoreRemaining = true
	return nil
}
