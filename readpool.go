package backlog

import (
	"context"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// readPrimaryKey marks a context made by ReadPrimary.
type readPrimaryKey struct{}

// ReadPrimary returns a context whose reads go to the primary (New's
// pool) even when the Queue has a read pool (WithReadPool): Job, List,
// Graph, Stats, Throughput, Latency, Processes, Schedules, Limits and
// Paused made with it read what is committed, never a standby's lagging
// copy. Use it where a read decides or confirms a write: counting the
// jobs a bulk action is about to act on, showing the limit an edit will
// replace, reading back a job just run. Without a read pool it changes
// nothing. ReadPoolStatus, which is about the read pool itself, ignores
// it.
func ReadPrimary(ctx context.Context) context.Context {
	return context.WithValue(ctx, readPrimaryKey{}, true)
}

// readsFor is the store an operator's read made with ctx goes through:
// the read pool's, unless ctx comes from ReadPrimary (or there is no read
// pool), then the primary's.
func (q *Queue) readsFor(ctx context.Context) *store.Store {
	if primary, _ := ctx.Value(readPrimaryKey{}).(bool); primary {
		return q.store
	}
	return q.reads
}

// ReadPoolStatus tells where the operator's reads come from (WithReadPool)
// and how far behind the primary they are.
type ReadPoolStatus struct {
	// Configured is whether the Queue has a read pool (WithReadPool).
	// Without one every read runs on the primary pool and the other
	// fields are zero.
	Configured bool
	// Standby is whether the read pool's server is a hot standby (in
	// recovery). A read pool that connects to a primary is never behind.
	Standby bool
	// CaughtUp is whether the standby had replayed everything the primary
	// had flushed when ReadPoolStatus asked it: reads are then as fresh as
	// the primary's, however long ago the last transaction committed
	// (an idle queue's standby is caught up, not "minutes behind").
	CaughtUp bool
	// BytesBehind is how much WAL the primary had flushed that the
	// standby had not replayed yet (0 when caught up).
	BytesBehind int64
	// Lag is the replay lag when behind: the standby's clock minus the
	// commit time of the last transaction it replayed. It is an upper
	// bound: when the primary had been idle before the transaction being
	// replayed, it counts that idle time too. 0 when caught up.
	Lag time.Duration
	// ReplayPaused is whether replay is paused on the standby
	// (pg_wal_replay_pause): reads then stay where they are.
	ReplayPaused bool
	// LastReplayed is the commit time (on the primary's clock) of the last
	// transaction the standby replayed; zero when it has replayed none
	// since it started.
	LastReplayed time.Time
}

// ReadPoolStatus asks the primary its flushed WAL position, then the read
// pool's server how far it has replayed, and reports the difference: one
// statement on each, reading no table. Without a read pool it returns a
// zero status (Configured false) without a query. An unreachable read
// pool (or primary) returns the error; the dashboard shows it.
func (q *Queue) ReadPoolStatus(ctx context.Context) (*ReadPoolStatus, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	st := &ReadPoolStatus{}
	if q.cfg.readPool == nil {
		return st, nil
	}
	st.Configured = true
	// The primary first: a standby that has replayed past this position
	// had everything committed before the question.
	lsn, err := q.store.FlushedWAL(ctx)
	if err != nil {
		return nil, classify(fmt.Errorf("asking the primary its WAL position: %w", err))
	}
	r, err := q.reads.ReplayedTo(ctx, lsn)
	if err != nil {
		return nil, classify(fmt.Errorf("asking the read pool's server its replay position: %w", err))
	}
	st.Standby, st.ReplayPaused = r.Standby, r.Paused
	if r.LastReplayed != nil {
		st.LastReplayed = *r.LastReplayed
	}
	switch {
	case !st.Standby:
		st.CaughtUp = true
	case r.Behind == nil:
		// The primary pool's server is itself in recovery (a cascade,
		// or a misconfiguration): nothing to compare with.
	case *r.Behind == 0:
		st.CaughtUp = true
	default:
		st.BytesBehind = *r.Behind
		if r.Lag != nil && *r.Lag > 0 {
			st.Lag = *r.Lag
		}
	}
	return st, nil
}
