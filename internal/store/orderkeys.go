package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Caller transactions above READ COMMITTED, and ordering keys' rows
// (job_ordering_keys, migration 0014).
//
// An enqueue inside a caller's transaction at REPEATABLE READ or
// SERIALIZABLE reads on the snapshot of that transaction's first
// statement, however long ago, not on one taken after its locks (as at
// READ COMMITTED, where graph.go's lock order alone makes it right). What
// it reads is still right, or the enqueue fails with a serialization
// failure (40001, wrapped as ErrSnapshot; the caller retries the whole
// transaction):
//
//   - The chain's jobs: a job of the key committed after the snapshot is
//     invisible. So every operation that adds a job to a key's chain
//     (InsertGraph, enqueue() in SQL, Retry) first writes the key's row
//     (tails), and writing a row that another transaction wrote, inserted
//     or deleted after the snapshot fails.
//   - The states of the chain's tail and of the prerequisites, read under
//     KEY SHARE: PostgreSQL takes an update made under FOR UPDATE for a key
//     update, which KEY SHARE conflicts with, so locking a row that a
//     finish, sweep, cancel or claim (FOR UPDATE SKIP LOCKED) changed, or
//     that a finish or the retirer deleted, after the snapshot fails.
//     Updates made without FOR UPDATE (a release to available, a renewal)
//     do not change whether a job is live, so their old version is as
//     good. Hence graph.go's rule that every move to a terminal state
//     takes FOR UPDATE first. Retry makes a finished job live again with
//     a plain update (or a move back from job_history): it writes the key's row when the job has an ordering
//     key, and a dependent enqueued on a snapshot where the job is still
//     completed counts it completed, as one enqueued just before the
//     retry does.
//   - Unique keys: the insert's ON CONFLICT on the index of live unique
//     keys fails when the live holder is invisible to the snapshot; a
//     holder that ended since no longer conflicts.
//   - A prerequisite enqueued after the snapshot is invisible: when the
//     pool sees every such ID, ErrSnapshot, not ErrUnknownPrerequisites.
//
// The Queue's own graph transactions run at the pool's default level,
// which must be READ COMMITTED (finish() refuses any other).
//
// The keys' rows are written only under their key's advisory lock, by
// enqueues and retries, and deleted by the cleaner (CleanOrderingKeys)
// once the key has no live job. Claims, finishes, renewals and the sweep
// never touch them.

// ErrSnapshot is wrapped by InsertGraph when the caller's transaction, at
// REPEATABLE READ or SERIALIZABLE, cannot see a change that the enqueue
// depends on: a job of the same ordering key or unique key committed after
// its snapshot was taken, a prerequisite or chain predecessor that started
// or ended since, a prerequisite enqueued since. The enqueue cannot be
// right on that snapshot; retrying the whole transaction can.
var ErrSnapshot = errors.New("a job, ordering key or unique key this enqueue depends on changed after the transaction's snapshot was taken " +
	"(it runs at REPEATABLE READ or SERIALIZABLE, and sees nothing committed since its first statement): roll back and retry the whole transaction")

type orderKeysSQL struct {
	tails, candidates, clean, isolation, exist string
}

func (s *Store) buildOrderKeys() {
	o := &s.okeys
	keys := pgx.Identifier{s.schema, "job_ordering_keys"}.Sanitize()
	// The keys' rows ($1 keys, distinct; $2 the job each one's chain gets
	// last), then the tail of each key's chain: its live job with no live
	// successor. Run under the keys' advisory locks: at READ COMMITTED the
	// statement's snapshot is taken after them and sees every job of the
	// keys; at REPEATABLE READ or SERIALIZABLE the upsert fails (40001)
	// when another transaction wrote a row after the caller's snapshot.
	o.tails = `WITH rows AS (
	INSERT INTO ` + keys + ` AS k (key, tail)
	SELECT * FROM unnest($1::text[], $2::uuid[]) ORDER BY 1
	ON CONFLICT (key) DO UPDATE SET tail = EXCLUDED.tail
)
SELECT DISTINCT ON (j.ordering_key) j.ordering_key, j.id FROM ` + s.jobs + ` j
WHERE j.ordering_key = ANY($1::text[]) AND j.state IN ` + live + `
  AND NOT EXISTS (SELECT 1 FROM ` + s.edges + ` e JOIN ` + s.jobs + ` n ON n.id = e.job
                  WHERE e.prereq = j.id AND e.kind = 'order' AND n.state IN ` + live + `)
ORDER BY j.ordering_key, j.created_at DESC, j.id DESC`
	// A page of rows after key $1 and, for each whose recorded tail is no
	// longer live (a hint: a primary key probe), whether the key's
	// advisory lock was free (tried, never waited for). CASE keeps the try
	// off the others.
	o.candidates = `SELECT c.key, CASE WHEN c.done THEN pg_try_advisory_xact_lock(hashtext($3), hashtext(c.key)) ELSE false END
FROM (SELECT k.key, NOT EXISTS (SELECT 1 FROM ` + s.jobs + ` j WHERE j.id = k.tail AND j.state IN ` + live + `) AS done
      FROM ` + keys + ` k WHERE k.key > $1 ORDER BY k.key LIMIT $2) c
ORDER BY c.key`
	// Run after the locks (a snapshot that sees every enqueue of the keys
	// that committed): the rows of keys with no live job.
	o.clean = `DELETE FROM ` + keys + ` k WHERE k.key = ANY($1::text[])
  AND NOT EXISTS (SELECT 1 FROM ` + s.jobs + ` j WHERE j.ordering_key = k.key AND j.state IN ` + live + `)`
	o.isolation = `SELECT current_setting('transaction_isolation')`
	o.exist = `SELECT count(*) FROM (SELECT id FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[])
	UNION SELECT id FROM ` + s.history + ` WHERE id = ANY($1::uuid[])) x`
}

// tails writes the rows of keys (each one's chain gets ids[i] last) and
// returns the tail of each key's chain. The caller holds the keys'
// advisory locks.
func (s *Store) tails(ctx context.Context, tx DB, keys []string, ids []uuid.UUID) (map[string]uuid.UUID, error) {
	return idsByKey(ctx, tx, s.okeys.tails, keys, ids)
}

// invisibleAll reports whether tx runs at REPEATABLE READ or SERIALIZABLE
// and every job of ids, which tx cannot see, was committed (a snapshot of
// the pool sees it): they were after tx's snapshot was taken.
func (s *Store) invisibleAll(ctx context.Context, tx DB, ids []uuid.UUID) (bool, error) {
	var level string
	if err := tx.QueryRow(ctx, s.okeys.isolation).Scan(&level); err != nil {
		return false, err
	}
	if level == "read committed" {
		return false, nil
	}
	var n int
	if err := s.pool.QueryRow(ctx, s.okeys.exist, Mode, ids).Scan(&n); err != nil {
		return false, err
	}
	return n == len(ids), nil
}

// CleanOrderingKeys deletes the rows of job_ordering_keys, among up to
// limit rows after the key after, whose key has no live job, and returns
// how many it deleted and the last key it looked at ("" when it reached
// the end). A key whose advisory lock another transaction holds (an
// enqueue of it under way) is left for the next pass.
func (s *Store) CleanOrderingKeys(ctx context.Context, after string, limit int) (deleted int, last string, err error) {
	// READ COMMITTED whatever the database's default: the delete must see
	// what committed before the locks were taken.
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		deleted, last = 0, ""
		rows, err := tx.Query(ctx, s.okeys.candidates, Mode, after, limit, s.schema)
		if err != nil {
			return err
		}
		var (
			key    string
			locked bool
			keys   []string
			seen   int
		)
		if _, err := pgx.ForEachRow(rows, []any{&key, &locked}, func() error {
			seen++
			last = key
			if locked {
				keys = append(keys, key)
			}
			return nil
		}); err != nil {
			return err
		}
		if seen < limit {
			last = ""
		}
		if len(keys) == 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, s.okeys.clean, Mode, keys)
		deleted = int(tag.RowsAffected())
		return err
	})
	if err != nil {
		return 0, "", fmt.Errorf("removing ordering keys' rows: %w", err)
	}
	return deleted, last, nil
}
