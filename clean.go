package backlog

import (
	"context"
	"fmt"
	"time"
)

// The operator surface: maintenance by hand and stats.

// SweepExpired makes jobs whose lease has expired (their worker died or was
// cut off) available again, or failed when their attempts are used up, and
// returns how many it handled. Work runs it periodically (WithSweepInterval);
// any number of processes may run it at once. A job whose row cannot be
// swept (a trigger of yours that raises, say) is failed with the reason
// rather than holding back the others.
func (q *Queue) SweepExpired(ctx context.Context) (int, error) {
	if q.isClosed() {
		return 0, ErrClosed
	}
	n, err := q.maint.Sweep(ctx)
	return n, classify(err)
}

// Clean drops the job_history partitions whose jobs are all past their
// retention (WithRetention; a partition someone is reading is left for the
// next pass, so no finish ever waits behind the drop), creates the
// partitions of the days ahead, deletes expired rows of the default
// partition and old periodic_runs rows in batches of at most 1,000, each
// its own statement that skips rows others hold, and the rows of ordering
// keys that have no live job left (skipping a key being enqueued to at
// that moment). Work runs it periodically
// (WithCleanInterval); running it on many processes at once is harmless.
func (q *Queue) Clean(ctx context.Context) (CleanResult, error) {
	if q.isClosed() {
		return CleanResult{}, ErrClosed
	}
	r, err := q.maint.Clean(ctx)
	return CleanResult(r), classify(err)
}

// Stats returns counts of jobs by state and type (live jobs as they are,
// finished ones over the last StatsWindow), the age of the oldest waiting
// job, running jobs per worker, the paused types and the oldest open
// transaction. It reads the live table (only live jobs are there) and
// per-minute counters, never the finished jobs, so its cost does not grow
// with the history kept.
func (q *Queue) Stats(ctx context.Context) (*Stats, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	fail := func(what string, err error) (*Stats, error) {
		return nil, q.readErr(ctx, fmt.Errorf("reading stats (%s): %w", what, err))
	}
	live, oldest, err := q.store.LiveCounts(ctx)
	if err != nil {
		return fail("live jobs", err)
	}
	now, err := q.store.Now(ctx)
	if err != nil {
		return fail("clock", err)
	}
	finished, err := q.store.FinishedCounts(ctx, now.Add(-StatsWindow))
	if err != nil {
		return fail("finished jobs", err)
	}
	st := buildStats(live, finished, oldest)
	paused, err := q.store.PausedTypes(ctx)
	if err != nil {
		return fail("paused types", err)
	}
	for _, p := range paused {
		st.Paused = append(st.Paused, p.Type)
	}
	snap, err := q.store.OldestSnapshot(ctx)
	if err != nil {
		return fail("open transactions", err)
	}
	st.OldestTransaction = oldTransactionOf(snap)
	st.DatabaseErrors = DatabaseErrors(q.faults.Snapshot())
	return st, nil
}

// Throughput returns how many jobs finished, per type and bucket, since
// `since` (on the database clock): buckets of a minute or of an hour
// (bucket must be a whole number of minutes). Minute counts are kept for
// two hours, hour counts for 90 days; older buckets are empty.
func (q *Queue) Throughput(ctx context.Context, since time.Time, bucket time.Duration) ([]Throughput, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	if bucket < time.Minute || bucket%time.Minute != 0 {
		return nil, invalid("bucket", "must be a whole number of minutes, got %s", bucket)
	}
	points, err := q.store.Series(ctx, since, bucket)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading throughput: %w", err))
	}
	var out []Throughput
	idx := map[string]int{}
	started := map[string]int64{}
	waits, runs := map[string]int64{}, map[string]int64{}
	for _, p := range points {
		k := p.At.String() + "\x00" + p.Type
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, Throughput{At: p.At, Type: p.Type})
		}
		switch State(p.State) {
		case StateCompleted:
			out[i].Completed += p.N
		case StateFailed:
			out[i].Failed += p.N
		case StateCancelled:
			out[i].Cancelled += p.N
		}
		started[k] += p.N
		waits[k] += p.WaitMS
		runs[k] += p.RunMS
	}
	for k, i := range idx {
		if n := started[k]; n > 0 {
			out[i].AvgWait = time.Duration(waits[k]/n) * time.Millisecond
			out[i].AvgRun = time.Duration(runs[k]/n) * time.Millisecond
		}
	}
	return out, nil
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
