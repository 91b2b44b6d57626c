package backlog_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/pgerr"
)

// Enqueues in transactions at REPEATABLE READ and SERIALIZABLE, whose
// snapshot is older than a change the enqueue depends on: the SQL
// function enqueue(), Queue.Retry joining a chain, and the cleaner of
// ordering keys' rows. backlogtest/internal/sqltx holds the Go API's own tests.

var snapshotLevels = []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable}

// snapshotTx begins a transaction at level on conn and takes its snapshot.
func (e *env) snapshotTx(conn *pgx.Conn, level pgx.TxIsoLevel) pgx.Tx {
	e.t.Helper()
	ctx := context.Background()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
	require.NoError(e.t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM "`+e.schema+`".jobs`)
	require.NoError(e.t, err)
	return tx
}

// sqlRetryTx runs enqueue in transactions at level on conn until one
// commits: the first takes its snapshot, then meanwhile runs (another
// session's change), then enqueue. A failed enqueue must be a
// serialization failure (40001), and the transaction is tried again.
func (e *env) sqlRetryTx(conn *pgx.Conn, level pgx.TxIsoLevel, meanwhile func(), enqueue func(tx pgx.Tx) error) {
	e.t.Helper()
	ctx := context.Background()
	for attempt := 0; ; attempt++ {
		require.Less(e.t, attempt, 3, "the enqueue kept failing")
		tx := e.snapshotTx(conn, level)
		if attempt == 0 {
			meanwhile()
		}
		if err := enqueue(tx); err != nil {
			require.Equal(e.t, "40001", pgerr.Code(err), "want a serialization failure, got %v", err)
			require.NoError(e.t, tx.Rollback(ctx))
			continue
		}
		require.NoError(e.t, tx.Commit(ctx))
		return
	}
}

// orderEdges returns the order edges into the key's live jobs (job →
// predecessors) and requires that at most one of its jobs is available or
// running.
func (e *env) orderEdges(key string) map[uuid.UUID][]uuid.UUID {
	e.t.Helper()
	require.LessOrEqual(e.t, e.countLive("ordering_key = $1 AND state IN ('available', 'running')", key), 1,
		"two jobs of key %q available or running at once", key)
	rows, err := e.pool.Query(context.Background(), `SELECT job, prereq FROM "`+e.schema+`".job_edges WHERE kind = 'order'
		AND job IN (SELECT id FROM "`+e.schema+`".jobs WHERE ordering_key = $1)`, key)
	require.NoError(e.t, err)
	out := map[uuid.UUID][]uuid.UUID{}
	var j, p uuid.UUID
	_, err = pgx.ForEachRow(rows, []any{&j, &p}, func() error { out[j] = append(out[j], p); return nil })
	require.NoError(e.t, err)
	return out
}

// TestSQLEnqueueAfterSnapshot: enqueue() in a transaction at REPEATABLE
// READ or SERIALIZABLE whose snapshot predates another session's job of
// the same ordering key (the fork: the new job must follow that job), of
// the same unique key (the duplicate), or the cancel of a prerequisite.
// Each either is right or raises a serialization failure that a retry of
// the transaction gets past.
func TestSQLEnqueueAfterSnapshot(t *testing.T) {
	t.Parallel()
	for _, level := range snapshotLevels {
		t.Run(string(level), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, backlog.WithPollInterval(time.Hour))
			ctx := context.Background()
			conn := sqlConn(t)

			p, err := e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
			require.NoError(t, err)
			var a, b uuid.UUID
			for i, other := range []string{"Go", "SQL"} {
				prev := b // the chain so far: p, or p → a → b
				e.sqlRetryTx(conn, level, func() {
					if other == "Go" {
						a, err = e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
					} else {
						a, err = e.sqlEnqueue(e.pool, `'o', ordering_key => 'k'`)
					}
					require.NoError(t, err)
				}, func(tx pgx.Tx) (err error) {
					b, err = e.sqlEnqueue(tx, `'o', ordering_key => 'k'`)
					return err
				})
				edges := e.orderEdges("k")
				if i == 0 {
					prev = p
				}
				require.Equal(t, []uuid.UUID{prev}, edges[a])
				require.Equal(t, []uuid.UUID{a}, edges[b], "%s's job is followed, not forked from", other)
				require.Len(t, edges, 2*(i+1), "one chain")
			}

			// Unique key: the holder committed after the snapshot is the
			// duplicate.
			var holder, dup uuid.UUID
			e.sqlRetryTx(conn, level, func() {
				holder, err = e.q.Enqueue(ctx, "u", nil, backlog.UniqueKey("u"))
				require.NoError(t, err)
			}, func(tx pgx.Tx) (err error) {
				dup, err = e.sqlEnqueue(tx, `'u', unique_key => 'u'`)
				return err
			})
			require.Equal(t, holder, dup)
			require.Equal(t, 1, e.count("unique_key = 'u'"))

			// A prerequisite cancelled after the snapshot cancels the job.
			pre, err := e.q.Enqueue(ctx, "pre", nil)
			require.NoError(t, err)
			var d uuid.UUID
			e.sqlRetryTx(conn, level, func() {
				_, err := e.q.Cancel(ctx, pre)
				require.NoError(t, err)
			}, func(tx pgx.Tx) (err error) {
				d, err = e.sqlEnqueue(tx, `'dep', depends_on => ARRAY[$1::uuid]`, pre.String())
				return err
			})
			info, err := e.q.Job(ctx, d)
			require.NoError(t, err)
			require.Equal(t, backlog.StateCancelled, info.State)

			// A prerequisite enqueued after the snapshot is unknown to it:
			// the error says it may only be unseen.
			tx := e.snapshotTx(conn, level)
			late, err := e.q.Enqueue(ctx, "pre", nil)
			require.NoError(t, err)
			_, err = e.sqlEnqueue(tx, `'dep', depends_on => ARRAY[$1::uuid]`, late.String())
			requireSQLInvalid(t, err, "depends_on", "prerequisite after the snapshot")
			require.ErrorContains(t, err, "or committed after this "+strings.ToUpper(string(level))+" transaction's snapshot was taken")
			require.NoError(t, tx.Rollback(ctx))
		})
	}
}

// TestRetryJoinsChainAfterSnapshot: Queue.Retry puts a finished job back
// at the end of its key's chain; an enqueue of the key whose snapshot
// still shows the job finished must not start a second chain beside it.
func TestRetryJoinsChainAfterSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	conn := sqlConn(t)
	a, err := e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
	require.NoError(t, err)
	_, err = e.q.Cancel(ctx, a)
	require.NoError(t, err)
	var b uuid.UUID
	e.sqlRetryTx(conn, pgx.RepeatableRead, func() {
		st, err := e.q.Retry(ctx, a)
		require.NoError(t, err)
		require.Equal(t, backlog.StateAvailable, st)
	}, func(tx pgx.Tx) error {
		var err error
		b, err = e.q.EnqueueTx(ctx, tx, "o", nil, backlog.OrderingKey("k"))
		if err != nil {
			require.ErrorIs(t, err, backlog.ErrRetryable)
			return err
		}
		return nil
	})
	require.Equal(t, map[uuid.UUID][]uuid.UUID{b: {a}}, e.orderEdges("k"))
}

// TestCleanOrderingKeys: the cleaner deletes a key's row once the key has
// no live job, not before, and not while an enqueue of the key is under
// way; an enqueue whose snapshot still has the deleted row fails
// retryably rather than forking the chain.
func TestCleanOrderingKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	rows := func() []string {
		r, err := e.pool.Query(ctx, `SELECT key FROM "`+e.schema+`".job_ordering_keys ORDER BY key`)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	// 2,500 keys (three of the cleaner's pages), one job each, and a
	// chain of two on "k".
	specs := make([]backlog.JobSpec, 2500)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "o", Options: []backlog.EnqueueOption{backlog.OrderingKey(fmt.Sprintf("bulk:%04d", i))}}
	}
	bulk, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	a, err := e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
	require.NoError(t, err)
	b, err := e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
	require.NoError(t, err)
	require.Len(t, rows(), 2501)

	res, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, res.OrderingKeys, "every key has live jobs")

	// "k"'s tail b ends, a is still live: kept. Every bulk job ends: their
	// rows go, all three pages of them.
	_, err = e.q.Cancel(ctx, b)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET state = 'cancelled', finished_at = now() WHERE id = ANY($1)`, bulk)
	require.NoError(t, err)
	res, err = e.q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 2500, res.OrderingKeys)
	require.Equal(t, []string{"k"}, rows())

	// a ends too, but an enqueue of "k" holds the key's lock: kept.
	_, err = e.q.Cancel(ctx, a)
	require.NoError(t, err)
	hold, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = hold.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1), hashtext('k'))`, e.schema)
	require.NoError(t, err)
	res, err = e.q.Clean(ctx)
	require.NoError(t, err)
	require.Zero(t, res.OrderingKeys)
	require.NoError(t, hold.Rollback(ctx))

	// Deleted under a REPEATABLE READ snapshot that still has the row,
	// and a new job enqueued: the snapshot's enqueue retries.
	conn := sqlConn(t)
	var c, d uuid.UUID
	e.sqlRetryTx(conn, pgx.RepeatableRead, func() {
		res, err := e.q.Clean(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, res.OrderingKeys)
		require.Empty(t, rows())
		c, err = e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
		require.NoError(t, err)
	}, func(tx pgx.Tx) (err error) {
		d, err = e.sqlEnqueue(tx, `'o', ordering_key => 'k'`)
		return err
	})
	require.Equal(t, map[uuid.UUID][]uuid.UUID{d: {c}}, e.orderEdges("k"))
}
