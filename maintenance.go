package backlog

import (
	"context"
	"fmt"
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

// maintain is the Queue's one maintenance loop: the expired-lease sweep
// every sweep interval and the cleaner every clean interval, each jittered
// by ±20 % so that many processes do not run in step. Any number of
// processes may run it: both statements skip rows another one holds.
func (q *Queue) maintain(ctx context.Context) {
	jitter := func(d time.Duration) time.Duration {
		return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
	}
	nextSweep := time.NewTimer(jitter(q.cfg.sweepInterval))
	defer nextSweep.Stop()
	nextClean := time.NewTimer(jitter(q.cfg.cleanInterval))
	defer nextClean.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-nextSweep.C:
			if _, err := q.SweepExpired(ctx); err != nil && ctx.Err() == nil {
				q.log.Warn("backlog: expired-lease sweep failed", "err", err)
			}
			nextSweep.Reset(jitter(q.cfg.sweepInterval))
		case <-nextClean.C:
			if _, err := q.Clean(ctx); err != nil && ctx.Err() == nil {
				q.log.Warn("backlog: cleaner failed", "err", err)
			}
			nextClean.Reset(jitter(q.cfg.cleanInterval))
		}
	}
}

// SweepExpired makes jobs whose lease has expired (their worker died or was
// cut off) available again, or failed when their attempts are used up, and
// returns how many it handled. Work runs it periodically (WithSweepInterval);
// any number of processes may run it at once.
func (q *Queue) SweepExpired(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := q.store.SweepExpired(ctx, sweepBatch)
		total += n
		if err != nil {
			return total, classify(fmt.Errorf("sweeping expired leases: %w", err))
		}
		if n < sweepBatch {
			if total > 0 {
				q.log.Info("backlog: swept expired leases", "jobs", total)
			} else {
				q.log.Debug("backlog: expired-lease sweep found nothing")
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

// Clean deletes finished jobs past their retention (WithRetention) and old
// periodic_runs rows, in batches of at most 1,000 rows, each its own
// statement that skips rows others hold. Work runs it periodically
// (WithCleanInterval); running it on many processes at once is harmless.
func (q *Queue) Clean(ctx context.Context) (CleanResult, error) {
	var total CleanResult
	for total.Batches < cleanMaxBatches {
		r, err := q.store.Clean(ctx, q.cfg.keepCompleted, q.cfg.keepFailed, cleanBatch)
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
		q.log.Info("backlog: cleaner deleted finished jobs", "jobs", total.Jobs, "periodic_runs", total.PeriodicRuns,
			"batches", total.Batches, "more", total.MoreRemaining)
	} else {
		q.log.Debug("backlog: cleaner found nothing to delete")
	}
	return total, nil
}

// Stats is a snapshot of the queue.
type Stats struct {
	// ByState counts jobs per state.
	ByState map[State]int64
	// ByType counts jobs per type and state.
	ByType map[string]map[State]int64
	// OldestAvailable is how long the oldest due available job has been
	// waiting (0 when none is waiting), on the database clock.
	OldestAvailable time.Duration
	// RunningByWorker counts running jobs per worker (WithWorkerID).
	RunningByWorker map[string]int64
}

// Stats returns counts by state and type, the age of the oldest waiting
// job, and running jobs per worker, in one query. The counts are exact, so
// the query reads every row of the jobs table: its cost grows with the rows
// kept for retention (see the README's operations section for a
// measurement).
func (q *Queue) Stats(ctx context.Context) (*Stats, error) {
	rows, oldest, err := q.store.Stats(ctx)
	if err != nil {
		return nil, classify(fmt.Errorf("reading stats: %w", err))
	}
	return buildStats(rows, oldest), nil
}

func buildStats(rows []store.StatsRow, oldest time.Duration) *Stats {
	s := &Stats{ByState: map[State]int64{}, ByType: map[string]map[State]int64{}, RunningByWorker: map[string]int64{},
		OldestAvailable: oldest}
	for _, r := range rows {
		if r.Worker != "" || r.Type == "" {
			s.RunningByWorker[r.Worker] += r.Count
			continue
		}
		st := State(r.State)
		s.ByState[st] += r.Count
		if s.ByType[r.Type] == nil {
			s.ByType[r.Type] = map[State]int64{}
		}
		s.ByType[r.Type][st] += r.Count
	}
	return s
}
