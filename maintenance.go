package backlog

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// Batch sizes of the maintenance statements: small, so no statement holds
// many row locks or runs long.
const (
	sweepBatch = 500
	cleanBatch = 1000
	// cleanMaxBatches bounds one cleaner pass; the next pass goes on.
	cleanMaxBatches = 100
)

// maintenance is the Queue's maintenance service: the expired-lease sweep
// every sweep interval and the cleaner every clean interval, each jittered
// by ±20 % so that many processes do not run in step. Any number of
// processes may run it: both skip rows another one holds.
type maintenance struct {
	run      runner
	store    *store.Store
	cfg      *config
	log      *slog.Logger
	announce announcer
}

func (m *maintenance) start() { m.run.start(m.loop) }
func (m *maintenance) stop()  { m.run.stop() }

func (m *maintenance) loop(ctx context.Context) {
	jitter := func(d time.Duration) time.Duration {
		return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
	}
	nextSweep := time.NewTimer(jitter(m.cfg.sweepInterval))
	defer nextSweep.Stop()
	nextClean := time.NewTimer(jitter(m.cfg.cleanInterval))
	defer nextClean.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-nextSweep.C:
			if _, err := m.sweep(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("backlog: expired-lease sweep failed", "err", err)
			}
			nextSweep.Reset(jitter(m.cfg.sweepInterval))
		case <-nextClean.C:
			if _, err := m.clean(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("backlog: cleaner failed", "err", err)
			}
			nextClean.Reset(jitter(m.cfg.cleanInterval))
		}
	}
}

func (m *maintenance) sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		res, err := m.store.SweepExpired(ctx, sweepBatch)
		total += res.Swept
		m.announce.committed(postingsOf(res.Avail))
		if res.Poisoned > 0 {
			m.log.Error("backlog: expired jobs that could not be swept were failed", "jobs", res.Poisoned)
		}
		if err != nil {
			return total, classify(fmt.Errorf("sweeping expired leases: %w", err))
		}
		if res.Swept < sweepBatch {
			if total > 0 {
				m.log.Info("backlog: swept expired leases", "jobs", total)
			} else {
				m.log.Debug("backlog: expired-lease sweep found nothing")
			}
			return total, nil
		}
	}
}

// CleanResult counts what one cleaner pass deleted.
type CleanResult struct {
	Jobs          int // finished jobs past their retention
	PeriodicRuns  int // periodic_runs rows past retention
	Batches       int // statements run
	MoreRemaining bool
}

func (m *maintenance) clean(ctx context.Context) (CleanResult, error) {
	var total CleanResult
	for total.Batches < cleanMaxBatches {
		r, err := m.store.Clean(ctx, m.cfg.keepCompleted, m.cfg.keepFailed, cleanBatch)
		total.Batches++
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
	if total.Jobs > 0 || total.PeriodicRuns > 0 {
		m.log.Info("backlog: cleaner deleted finished jobs", "jobs", total.Jobs, "periodic_runs", total.PeriodicRuns,
			"batches", total.Batches, "more", total.MoreRemaining)
	} else {
		m.log.Debug("backlog: cleaner found nothing to delete")
	}
	return total, nil
}
