package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Commits whose answer is lost. When the connection fails after COMMIT
// was sent (a network cut, a failover, the server restarting), the
// transaction may or may not have committed: the server got the command,
// the answer never arrived. Writing the same outcomes again would be
// refused by their lease tokens if the first commit landed, and the queue
// would report outcomes it had written as refused. So the transactions
// that write outcomes learn their transaction ID first (in a statement
// they run anyway), and a commit whose answer is lost is resolved by
// asking the database, on another connection, whether that ID committed
// (txid_status): the answer is final once the old backend has ended.
//
// Unless the server it asks is not the one the transaction ran on: after a
// failover the new primary goes on from the last transaction it received,
// so it hands out again the IDs the old primary gave to transactions that
// never reached it, and txid_status then answers for another transaction
// (seen in the HA failover test: "committed" for a write that was lost,
// and the job ran again after its lease). A promotion starts a new
// timeline, so each such transaction also learns its server's timeline,
// and an answer from another timeline is not taken: the commit stays
// unknown (*CommitUnknownError), and the completer writes the outcomes
// again, fenced by their lease tokens.

// timelineSQL is the server's current timeline (the first eight hex digits
// of its WAL file names); only on a primary.
const timelineSQL = `substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)`

// CommitUnknownError is a commit whose outcome could not be learnt before
// the caller's context ended: the transaction may have committed.
type CommitUnknownError struct {
	XID int64
	Err error // the commit's own error
}

func (e *CommitUnknownError) Error() string {
	return fmt.Sprintf("the commit of transaction %d may or may not have landed: %v", e.XID, e.Err)
}

func (e *CommitUnknownError) Unwrap() error { return e.Err }

// readCommittedTx is how outcome writes begin: the finish statements need
// READ COMMITTED whatever the pool's default isolation is.
var readCommittedTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// commitKnown commits tx, whose transaction ID is xid on timeline tl. An
// error the server answered means it did not commit.
// Otherwise the answer was lost: commitKnown asks the database whether
// xid committed, until the answer is final, and returns nil when it did,
// the commit's error when it did not, and a *CommitUnknownError when ctx
// ends first.
func (s *Store) commitKnown(ctx context.Context, tx pgx.Tx, xid int64, tl string) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	// Only the server's own answer is final. Not even an error that says
	// nothing was sent: pgx may send COMMIT in more than one exchange, and
	// report the last one's failure to lock a connection the first one
	// found broken.
	var pe *pgconn.PgError
	if errors.As(err, &pe) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return err
	}
	return s.resolveCommit(ctx, xid, tl, err)
}

// resolveCommit asks, until the answer is final or ctx ends, whether
// transaction xid of timeline tl committed. Asked on another timeline (a
// failover came between), it cannot know: the ID may name another
// transaction there.
func (s *Store) resolveCommit(ctx context.Context, xid int64, tl string, cause error) error {
	b := newWait(10*time.Millisecond, time.Second)
	for {
		var status *string
		var now string
		err := s.pool.QueryRow(ctx, `SELECT txid_status($1), `+timelineSQL, xid).Scan(&status, &now)
		switch {
		case err == nil && now != tl:
			return &CommitUnknownError{XID: xid, Err: fmt.Errorf("the server changed timeline (from %s to %s: a failover) since the transaction began, so its status there says nothing of it: %w", tl, now, cause)}
		case err == nil && status == nil:
			// Too old to be known (wraparound): never for a transaction of
			// moments ago, but say so rather than guess.
			return &CommitUnknownError{XID: xid, Err: cause}
		case err == nil && *status == "committed":
			return nil
		case err == nil && *status == "aborted":
			return fmt.Errorf("the transaction did not commit: %w", cause)
		}
		// In progress (its backend has not ended yet), or the database is
		// not reachable yet: ask again.
		select {
		case <-ctx.Done():
			return &CommitUnknownError{XID: xid, Err: cause}
		case <-time.After(b.next()):
		}
	}
}

// wait is a capped doubling delay.
type wait struct{ d, max time.Duration }

func newWait(first, max time.Duration) *wait { return &wait{d: first, max: max} }

func (w *wait) next() time.Duration {
	d := w.d
	w.d = min(2*w.d, w.max)
	return d
}
