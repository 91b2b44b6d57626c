package backlog

import "context"

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
