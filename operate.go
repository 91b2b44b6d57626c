package backlog

import (
	"context"
	"fmt"
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
	return q.maint.sweep(ctx)
}

// Clean drops the job_history partitions whose jobs are all past their
// retention (WithRetention; a partition someone is reading is left for the
// next pass, so no finish ever waits behind the drop), creates the
// partitions of the days ahead, deletes expired rows of the default
// partition and old periodic_runs rows in batches of at most 1,000, each
// its own statement that skips rows others hold. Work runs it periodically
// (WithCleanInterval); running it on many processes at once is harmless.
func (q *Queue) Clean(ctx context.Context) (CleanResult, error) {
	if q.isClosed() {
		return CleanResult{}, ErrClosed
	}
	return q.maint.clean(ctx)
}

// Stats returns counts by state and type, the age of the oldest waiting
// job, and running jobs per worker, in one query. The counts are exact, so
// the query reads every row of the jobs table: its cost grows with the rows
// kept for retention (see the README's operations section for a
// measurement).
func (q *Queue) Stats(ctx context.Context) (*Stats, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	rows, oldest, err := q.store.Stats(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading stats: %w", err))
	}
	st := buildStats(rows, oldest)
	snap, err := q.store.OldestSnapshot(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading open transactions: %w", err))
	}
	st.OldestTransaction = oldTransactionOf(snap)
	return st, nil
}
