package backlog

import (
	"context"
)

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
