package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/pgerr"
)

// The job graph: dependencies (edges of kind 'depends'), per-key ordering
// (kind 'order', from the tail of the key's chain to the new job),
// cancellation and the release of dependents.
//
// # Lock order
//
// Every operation that locks more than one job or key takes its locks in
// this order, and only in this order:
//
//  1. Ordering-key advisory locks (pg_advisory_xact_lock(hashtext(schema),
//     hashtext(key))), in sorted key order, before any row lock. A key's
//     chain is changed only under its key lock (enqueue, splice, retry).
//  2. The keys' rows in job_ordering_keys (orderkeys.go), in sorted key
//     order, written by an operation that adds a job to a key's chain
//     (enqueue, retry) right after its key locks. Every writer of a key's
//     row (those, and the cleaner, which deletes it) holds the key's
//     advisory lock, so no one ever waits for such a row.
//  3. Job rows, a job's prerequisites (and chain predecessors) before the
//     job itself: upstream before downstream. Rows at the same level are
//     locked in ascending ID order.
//
// A lock that would break the order (a key, or an upstream row, found only
// after rows are held) is only ever tried without waiting
// (pg_try_advisory_xact_lock, NOWAIT). When the try fails the transaction
// rolls back and starts again with that key or row in its lockPlan, taken
// first and in order (runGraphTx). So no two graph operations can wait for
// each other in a cycle.
//
// # Lock modes
//
//   - Adding a dependent to a job (enqueue with DependsOn or an ordering
//     key, splicing a chain, a retry by hand putting a finished job back
//     behind it: retry.go) takes FOR KEY SHARE on the job's row and reads
//     its state after the lock; the job's row itself is never written. So
//     a caller's transaction that enqueued a dependent holds nothing
//     stronger than KEY SHARE on the prerequisite for as long as it stays
//     open.
//   - Every move of a job to a terminal state (finish, sweep, cancel,
//     cascade, a dependent failed because its release failed) takes FOR
//     UPDATE on its row first (or deletes the row). FOR UPDATE conflicts
//     with KEY SHARE: a finish either comes after the transaction adding a
//     dependent has committed, or goes first, and the enqueue then reads
//     the terminal state. A finish reads its rows' edges in a second
//     statement, on a snapshot taken after it holds the row locks, so an
//     edge committed while it waited is never missed; it releases the
//     dependents in the same transaction.
//   - Lease renewal takes FOR NO KEY UPDATE SKIP LOCKED: it never waits,
//     and KEY SHARE does not hold it back, so a caller's open transaction
//     that added a dependent never costs a running prerequisite its lease.
//   - Claims and batched finishes take FOR UPDATE SKIP LOCKED: one locked
//     row never delays the others of a batch; the caller retries a skipped
//     (busy) row on its own, where waiting delays nobody else.
//
// # Caller transactions above READ COMMITTED
//
// See orderkeys.go: why an enqueue at REPEATABLE READ or SERIALIZABLE,
// reading on an old snapshot, is still right or fails retryably, and so
// why every move to a terminal state must take FOR UPDATE (above).
//
// # Flow-control locks (migration 0009)
//
// A claim never takes a graph lock that waits: its job rows are FOR UPDATE
// SKIP LOCKED. Before them it takes, in ascending hashtext(type) order,
// each of its types' limit lock (pg_advisory_xact_lock_shared(hashtext(
// schema.job_limits), hashtext(type))), then each type's claim lock (the
// same, exclusive, on schema.job_claims: every claim since migration 0024,
// so one claim of a type runs at a time; before it only the claims of
// types with limits or keyed jobs), and last the rows of job_limits,
// job_rates and job_key_cursors of the types that have limits. SetLimit and RemoveLimit take one type's
// limit lock exclusive before they touch its rows; the cleaner deletes
// job_rates rows with SKIP LOCKED. None of these waits for a graph lock,
// and no graph operation takes them, so the two orders cannot form a cycle.
//
// # Kept results (migration 0012)
//
// A release, and the locking read of an enqueue or a retry by hand that
// finds a prerequisite completed, only ever insert rows into job_inputs
// (no unique key, no update), so no writer of job_inputs waits for
// another, whatever order their transactions take; the cleaner deletes job_inputs rows with SKIP LOCKED
// and takes no job lock. job_inputs is thus in no lock order at all.

type graphSQL struct {
	lockKeys, tryKeys, lockPrereqs, insert, insertUnique, edges, liveHolders       string
	level, lockCancel, lockCancelSkip, blockedCount, splice, release               string
	read, lockOne, cancelQueued, requestCancel, markWaiting, orderPreds, lockShare string
	chainPreds, dependents, failDependent, finishedStates, finishedState           string
}

const live = `('blocked', 'scheduled', 'available', 'running')`

func (s *Store) buildGraph() {
	g := &s.graph
	g.lockKeys = `SELECT count(*) FROM (SELECT pg_advisory_xact_lock(hashtext($1), hashtext(k))
	FROM (SELECT DISTINCT unnest($2::text[]) AS k ORDER BY 1) s) l`
	// Out of order: returns the keys it could not lock.
	g.tryKeys = `SELECT COALESCE(array_agg(k), '{}') FROM (SELECT DISTINCT unnest($2::text[]) AS k ORDER BY 1) s
WHERE NOT pg_try_advisory_xact_lock(hashtext($1), hashtext(k))`
	// Prerequisites, upstream rows: KEY SHARE, waiting, in ID order. An
	// available one is skipped by concurrent claims while locked: the
	// caller announces it, to be delivered when the lock goes (at commit).
	// The results of the completed ones among $2 (dependencies, not chain
	// predecessors) are kept (inputs.go).
	g.lockPrereqs = s.keeping(`SELECT id, state, type, tags, run_at, result, finished_at FROM `+s.jobs+` WHERE id = ANY($1::uuid[]) ORDER BY id FOR KEY SHARE`,
		"$2", "id, state, type, tags, run_at")
	cols := `(id, type, args, tags, priority, run_at, max_attempts, timeout_ms, state, blocked_by, ordering_key, unique_key, last_error, finished_at, concurrency_key, meta, prereqs)`
	// A job that would be available but is due later is scheduled. A job
	// with dependencies lists them all in prereqs from the start (passed as
	// comma-separated text: unnest cannot take an array of arrays), so a
	// retry by hand knows what it must wait for after its edges are gone
	// (control.go).
	sel := `SELECT t.id, t.type, t.args, t.tags, t.priority, t.run_at, t.max_attempts, t.timeout_ms,
	       CASE WHEN t.state = 'available' AND t.run_at > now() THEN 'scheduled' ELSE t.state END,
	       t.blocked_by, t.ordering_key, t.unique_key, t.last_error,
	       CASE WHEN t.state = 'cancelled' THEN now() END, t.concurrency_key, t.meta, string_to_array(t.prereqs, ',')::uuid[]
	FROM (SELECT u.id, u.type, u.args, u.tags, u.priority, COALESCE(u.run_at, now() + u.delay_ms * interval '1 millisecond') AS run_at,
	             u.max_attempts, u.timeout_ms, u.state, u.blocked_by, u.ordering_key, u.unique_key, u.last_error,
	             u.concurrency_key, u.meta, u.prereqs
	      FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::smallint[], $6::timestamptz[], $7::bigint[], $8::integer[],
	                  $9::bigint[], $10::text[], $11::integer[], $12::text[], $13::text[], $14::text[], $15::text[], $16::jsonb[], $17::text[])
	           AS u(id, type, args, tags, priority, run_at, delay_ms, max_attempts, timeout_ms, state, blocked_by, ordering_key, unique_key, last_error,
	                concurrency_key, meta, prereqs)) t`
	ret := ` RETURNING id, state, greatest(0, ceil(extract(epoch FROM run_at - now()) * 1000))::bigint`
	g.insert = `INSERT INTO ` + s.jobs + ` ` + cols + ` ` + sel + ret
	g.insertUnique = `INSERT INTO ` + s.jobs + ` ` + cols + ` ` + sel + `
	ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ` + live + ` DO NOTHING` + ret
	g.edges = `INSERT INTO ` + s.edges + ` (prereq, job, kind) SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[]) ON CONFLICT DO NOTHING`
	g.liveHolders = `SELECT unique_key, id FROM ` + s.jobs + ` WHERE unique_key = ANY($1::text[]) AND state IN ` + live

	// One level of a release: the edges of terminal prerequisites, with
	// what a dependent needs to know. Read without locks; the writes below
	// re-check under their own.
	g.level = `SELECT e.job, e.kind, p.id, p.state, j.state, COALESCE(j.ordering_key, '')
FROM ` + s.edges + ` e JOIN ` + s.jobs + ` p ON p.id = e.prereq JOIN ` + s.jobs + ` j ON j.id = e.job
WHERE e.prereq = ANY($1::uuid[]) AND p.state IN ('completed', 'failed', 'cancelled')`
	// Dependents about to be cancelled: a terminal transition, FOR UPDATE.
	// Downstream of rows already held: may wait (bounded by lock_timeout).
	g.lockCancel = `SELECT id FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[]) AND state = 'blocked' ORDER BY id FOR UPDATE`
	g.lockCancelSkip = `SELECT count(*) FROM (SELECT id FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[]) AND state = 'blocked' ORDER BY id FOR UPDATE SKIP LOCKED) l`
	g.blockedCount = `SELECT count(*) FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[]) AND state = 'blocked'`
	// Live predecessors of jobs that ended while blocked in a chain: they
	// get the jobs' successors. Upstream of rows already held: NOWAIT (the
	// caller restarts with them in its plan when one is busy).
	g.orderPreds = `SELECT DISTINCT e.prereq FROM ` + s.edges + ` e JOIN ` + s.jobs + ` p ON p.id = e.prereq
WHERE e.job = ANY($1::uuid[]) AND e.kind = 'order' AND p.state IN ` + live + `
  AND EXISTS (SELECT 1 FROM ` + s.edges + ` x WHERE x.prereq = e.job AND x.kind = 'order')`
	g.lockShare = `SELECT id FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[]) ORDER BY id FOR KEY SHARE`
	g.splice = `WITH preds AS (
	SELECT e.prereq AS pred, e.job AS mid FROM ` + s.edges + ` e WHERE e.job = ANY($1::uuid[]) AND e.kind = 'order'
), locked AS (
	SELECT p.id FROM ` + s.jobs + ` p WHERE p.id IN (SELECT pred FROM preds) AND p.state IN ` + live + `
	ORDER BY p.id FOR KEY SHARE NOWAIT
), ins AS (
	INSERT INTO ` + s.edges + ` (prereq, job, kind)
	SELECT pr.pred, x.job, 'order' FROM preds pr JOIN locked l ON l.id = pr.pred
	JOIN ` + s.edges + ` x ON x.prereq = pr.mid AND x.kind = 'order'
	JOIN ` + s.jobs + ` n ON n.id = x.job AND n.state = 'blocked'
	ON CONFLICT DO NOTHING RETURNING prereq, job
), upd AS (
	UPDATE ` + s.jobs + ` j SET blocked_by = j.blocked_by + c.n
	FROM (SELECT job, count(*)::int AS n FROM ins GROUP BY job) c WHERE j.id = c.job
	RETURNING j.id
)
SELECT count(*) FROM upd`
	// Consume the edges of terminal prerequisites: a completed one (or any
	// terminal predecessor in a chain) unblocks, a failed or cancelled
	// dependency cancels. Returns the jobs made available (to announce) and
	// the newly cancelled jobs (the next level), and sends completion
	// notices. A dependency that completed is recorded in the dependent's
	// prereqs (where a job enqueued by this version lists it already; one
	// enqueued by an earlier version lists only those that completed), and
	// its result copied aside into job_inputs (see inputs.go), so the
	// dependent can read it whatever becomes of the prerequisite's row.
	g.release = `WITH e AS (
	DELETE FROM ` + s.edges + ` x USING ` + s.jobs + ` p
	WHERE x.prereq = p.id AND p.id = ANY($1::uuid[]) AND p.state IN ('completed', 'failed', 'cancelled')
	  AND ($3::uuid[] IS NULL OR x.job = ANY($3::uuid[]))
	RETURNING x.job, x.kind, x.prereq, p.state AS pstate
), kept AS (
	INSERT INTO ` + s.inputs + ` (id, type, result, finished_at)
	SELECT p.id, p.type, p.result, p.finished_at FROM ` + s.jobs + ` p
	WHERE p.id IN (SELECT prereq FROM e WHERE kind = 'depends' AND pstate = 'completed')
	  AND ` + s.inputsFresh("p") + `
), agg AS (
	SELECT job, count(*)::int AS n,
	       (array_agg(prereq::text || ' ' || pstate ORDER BY prereq) FILTER (WHERE kind = 'depends' AND pstate <> 'completed'))[1] AS bad,
	       array_agg(prereq ORDER BY prereq) FILTER (WHERE kind = 'depends' AND pstate = 'completed') AS done
	FROM e GROUP BY job
), upd AS (
	UPDATE ` + s.jobs + ` j SET
		blocked_by = j.blocked_by - agg.n,
		prereqs = CASE WHEN agg.done IS NULL OR j.prereqs @> agg.done THEN j.prereqs
		               ELSE COALESCE(j.prereqs, '{}') || ARRAY(SELECT d FROM unnest(agg.done) d WHERE NOT d = ANY(COALESCE(j.prereqs, '{}'))) END,
		state = CASE WHEN agg.bad IS NOT NULL THEN 'cancelled'
		             WHEN j.blocked_by - agg.n <= 0 THEN (CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'available' END)
		             ELSE 'blocked' END,
		last_error = CASE WHEN agg.bad IS NOT NULL THEN '` + cancelPrefix + `' || agg.bad ELSE j.last_error END,
		finished_at = CASE WHEN agg.bad IS NOT NULL THEN now() END
	FROM agg WHERE j.id = agg.job AND j.state = 'blocked'
	RETURNING j.id, j.state, j.type, j.tags, j.run_at, j.notify_done
)
SELECT u.id, u.state, u.type, u.tags, u.run_at, greatest(0, ceil(extract(epoch FROM u.run_at - now()) * 1000))::bigint
FROM upd u WHERE u.state IN ('cancelled', 'scheduled', 'available')
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL FROM (SELECT pg_notify($2, ` + s.postingSQL("p_done => u.id") + `) FROM upd u
	WHERE u.notify_done AND u.state = 'cancelled') w`

	g.dependents = `SELECT DISTINCT job FROM ` + s.edges + ` WHERE prereq = ANY($1::uuid[]) ORDER BY 1`
	// A dependent that could not be released: failed, with the reason; its
	// edges from the level are consumed. Its own dependents follow it as
	// the next level.
	// Locked FOR UPDATE first, like every move to a terminal state:
	// downstream of rows already held, so it may wait (bounded by
	// lock_timeout).
	g.failDependent = `WITH l AS (
	SELECT id FROM ` + s.jobs + ` WHERE id = $2 AND state = 'blocked' FOR UPDATE
), d AS (
	DELETE FROM ` + s.edges + ` WHERE prereq = ANY($1::uuid[]) AND job = $2
), u AS (
	UPDATE ` + s.jobs + ` j SET state = 'failed', last_error = $3, finished_at = now(), blocked_by = 0
	FROM l WHERE j.id = l.id AND j.state = 'blocked' RETURNING j.id, j.notify_done
)
SELECT count(*), count(pg_notify($4, ` + s.postingSQL("p_done => id") + `)) FILTER (WHERE notify_done) FROM u`
	g.read = `SELECT state, COALESCE(ordering_key, '') FROM ` + s.jobs + ` WHERE id = $1
UNION ALL SELECT state, COALESCE(ordering_key, '') FROM ` + s.history + ` WHERE id = $1 LIMIT 1`
	// Finished jobs' states, for prerequisites no longer in jobs.
	g.finishedStates = s.keeping(`SELECT id, state, type, result, finished_at FROM `+s.history+` WHERE id = ANY($1::uuid[])`, "$2", "id, state")
	g.finishedState = `SELECT state FROM ` + s.history + ` WHERE id = $1`
	g.lockOne = `SELECT state FROM ` + s.jobs + ` WHERE id = $1 FOR UPDATE`
	g.cancelQueued = `WITH c AS (
	UPDATE ` + s.jobs + ` SET state = 'cancelled', finished_at = now(), last_error = 'cancelled by request'
	WHERE id = $1 AND state IN ('blocked', 'scheduled', 'available') RETURNING id, notify_done
)
SELECT count(*), count(pg_notify($2, ` + s.postingSQL("p_done => id") + `)) FILTER (WHERE notify_done) FROM c`
	g.requestCancel = `WITH c AS (
	UPDATE ` + s.jobs + ` SET cancel_requested = true WHERE id = $1 AND state = 'running' RETURNING id
)
SELECT count(*), count(pg_notify($2, ` + s.postingSQL("p_cancel => id") + `)) FROM c`
	g.markWaiting = `UPDATE ` + s.jobs + ` SET notify_done = true WHERE id = $1 RETURNING state, type, tags`
	g.chainPreds = `SELECT e.prereq FROM ` + s.edges + ` e JOIN ` + s.jobs + ` p ON p.id = e.prereq
WHERE e.job = $1 AND e.kind = 'order' AND p.state IN ` + live + ` ORDER BY 1`
}

// lockPlan is what a graph transaction locks first, in the lock order: the
// keys and upstream rows an earlier attempt found it needed out of order.
type lockPlan struct {
	keys []string
	rows []uuid.UUID
}

// restartError asks runGraphTx to start over with more locks in its plan.
type restartError struct {
	keys []string
	rows []uuid.UUID
}

func (e *restartError) Error() string {
	return fmt.Sprintf("graph transaction must restart with %d more key(s) and %d more row(s) locked first", len(e.keys), len(e.rows))
}

// maxGraphRestarts bounds runGraphTx's attempts. Each restart only grows
// the plan, and a plan only needs the keys and rows of one neighbourhood of
// the graph, so a few suffice unless the graph keeps changing under us.
const maxGraphRestarts = 20

// ErrGraphContention is returned when a graph transaction kept needing
// locks held by others. It is transient: try again.
var ErrGraphContention = errors.New("graph operation kept restarting for locks held by concurrent transactions")

// runGraphTx runs fn in a transaction on the pool with lock_timeout set to
// lockTimeout (0: none), taking plan's locks first. When fn returns a
// restartError the transaction rolls back and runs again with the plan
// grown.
func (s *Store) runGraphTx(ctx context.Context, lockTimeout time.Duration, fn func(tx pgx.Tx, plan *lockPlan) error) error {
	return s.runGraphTxPlan(ctx, lockTimeout, lockPlan{}, fn)
}

func (s *Store) runGraphTxPlan(ctx context.Context, lockTimeout time.Duration, plan lockPlan, fn func(tx pgx.Tx, plan *lockPlan) error) error {
	for range maxGraphRestarts {
		err := s.graphTx(ctx, lockTimeout, func(tx pgx.Tx) error {
			if err := s.takePlan(ctx, tx, &plan); err != nil {
				return err
			}
			return fn(tx, &plan)
		})
		var rs *restartError
		if !errors.As(err, &rs) {
			return err
		}
		plan.keys = append(plan.keys, rs.keys...)
		plan.rows = append(plan.rows, rs.rows...)
	}
	return ErrGraphContention
}

// graphTx runs fn in a READ COMMITTED transaction with lock_timeout set
// (0: the server's) and commits it, resolving a commit whose answer is
// lost (commitKnown): a graph operation that wrote is never reported as
// failed, nor one that did not as done.
func (s *Store) graphTx(ctx context.Context, lockTimeout time.Duration, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.BeginTx(ctx, readCommittedTx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after the commit: does nothing
	timeout := ""                                                  // keep the server's
	if lockTimeout > 0 {
		timeout = fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1))
	}
	var xid int64
	var tl string
	if err := tx.QueryRow(ctx, `SELECT txid_current(), `+timelineSQL+`, CASE WHEN $1 <> '' THEN set_config('lock_timeout', $1, true) END`, Mode,
		timeout).Scan(&xid, &tl, nil); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return s.commitKnown(ctx, tx, xid, tl)
}

// takePlan takes a plan's locks in the lock order: keys, then rows.
func (s *Store) takePlan(ctx context.Context, tx pgx.Tx, plan *lockPlan) error {
	if len(plan.keys) > 0 {
		if err := s.lockKeys(ctx, tx, plan.keys); err != nil {
			return err
		}
	}
	if len(plan.rows) > 0 {
		rows, err := tx.Query(ctx, s.graph.lockShare, Mode, plan.rows)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	return nil
}

func (s *Store) lockKeys(ctx context.Context, tx DB, keys []string) error {
	var n int64
	if err := tx.QueryRow(ctx, s.graph.lockKeys, Mode, s.schema, keys).Scan(&n); err != nil {
		return fmt.Errorf("locking ordering keys: %w", err)
	}
	return nil
}

// Release consumes the edges of the given terminal prerequisites inside tx:
// dependents whose last prerequisite completed become available (returned,
// to be announced after the commit), dependents of a failed or cancelled
// dependency are cancelled, transitively, and chains that lose a blocked
// member are spliced so they keep their order.
//
// With skip (the fast lane), a dependent to cancel that another transaction
// holds fails the call with errBusy instead of waiting for it.
func (s *Store) release(ctx context.Context, tx pgx.Tx, frontier []uuid.UUID, plan *lockPlan, skip bool) ([]Avail, error) {
	g := &s.graph
	var avail []Avail
	for len(frontier) > 0 {
		// Which dependents this level cancels, and their keys.
		rows, err := tx.Query(ctx, g.level, Mode, frontier)
		if err != nil {
			return nil, fmt.Errorf("reading dependents: %w", err)
		}
		var (
			job, prereq  uuid.UUID
			kind, pstate string
			jstate, okey string
			cancel       []uuid.UUID
			keys         []string
			seenC, seenK = map[uuid.UUID]bool{}, map[string]bool{}
		)
		_, scanErr := pgx.ForEachRow(rows, []any{&job, &kind, &prereq, &pstate, &jstate, &okey}, func() error {
			if kind == "depends" && pstate != "completed" && jstate == "blocked" && !seenC[job] {
				seenC[job] = true
				cancel = append(cancel, job)
				if okey != "" && !seenK[okey] {
					seenK[okey] = true
					keys = append(keys, okey)
				}
			}
			return nil
		})
		if scanErr != nil {
			return nil, fmt.Errorf("reading dependents: %w", scanErr)
		}
		// Keys of chains about to change: found after rows are held, so
		// tried without waiting.
		if len(keys) > 0 {
			var missed []string
			if err := tx.QueryRow(ctx, g.tryKeys, Mode, s.schema, keys).Scan(&missed); err != nil {
				return nil, fmt.Errorf("locking ordering keys: %w", err)
			}
			if len(missed) > 0 {
				return nil, &restartError{keys: missed}
			}
		}
		if len(cancel) > 0 {
			if err := s.lockToCancel(ctx, tx, cancel, skip); err != nil {
				return nil, err
			}
		}
		// Frontier jobs that ended while blocked in a chain hand their
		// live predecessors on to their successors.
		if err := s.splice(ctx, tx, frontier); err != nil {
			return nil, err
		}
		a, next, err := s.releaseLevel(ctx, tx, frontier)
		if err != nil {
			return nil, err
		}
		avail = append(avail, a...)
		frontier = next
	}
	return avail, nil
}

// lockToCancel locks blocked dependents about to be cancelled, FOR UPDATE.
func (s *Store) lockToCancel(ctx context.Context, tx pgx.Tx, ids []uuid.UUID, skip bool) error {
	g := &s.graph
	if !skip {
		rows, err := tx.Query(ctx, g.lockCancel, Mode, ids)
		if err != nil {
			return fmt.Errorf("locking dependents: %w", err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("locking dependents: %w", err)
		}
		return nil
	}
	var locked, blocked int64
	if err := tx.QueryRow(ctx, g.lockCancelSkip, Mode, ids).Scan(&locked); err != nil {
		return fmt.Errorf("locking dependents: %w", err)
	}
	if err := tx.QueryRow(ctx, g.blockedCount, Mode, ids).Scan(&blocked); err != nil {
		return fmt.Errorf("locking dependents: %w", err)
	}
	if locked < blocked {
		return errBusy
	}
	return nil
}

// splice hands the live chain predecessors of frontier jobs on to their
// successors. The predecessors are upstream of rows already held: they are
// locked with NOWAIT, and a busy one restarts the transaction with it in
// the plan.
func (s *Store) splice(ctx context.Context, tx pgx.Tx, frontier []uuid.UUID) error {
	g := &s.graph
	rows, err := tx.Query(ctx, g.orderPreds, Mode, frontier)
	if err != nil {
		return fmt.Errorf("reading chain predecessors: %w", err)
	}
	preds, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return fmt.Errorf("reading chain predecessors: %w", err)
	}
	if len(preds) == 0 {
		return nil
	}
	// Try the locks in a savepoint, so a busy predecessor can be told
	// apart from any other failure.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	var spliced int64
	err = sp.QueryRow(ctx, g.splice, Mode, frontier).Scan(&spliced)
	if err != nil {
		_ = sp.Rollback(ctx)
		if pgerr.Busy(err) {
			return &restartError{rows: preds}
		}
		return fmt.Errorf("splicing ordering chains: %w", err)
	}
	return sp.Commit(ctx)
}

// releaseLevel consumes the edges of one level and returns what became
// available and the next level (jobs it cancelled or failed). When the
// level's one statement fails for a reason tied to one dependent (a value
// or trigger of its own), the dependents are released one at a time, each
// in a savepoint, and one that still fails is failed with the reason: the
// prerequisite's finish and its other dependents go through.
func (s *Store) releaseLevel(ctx context.Context, tx pgx.Tx, frontier []uuid.UUID) ([]Avail, []uuid.UUID, error) {
	avail, next, err := s.releaseIn(ctx, tx, frontier, nil)
	if err == nil || !isolatable(err) {
		return avail, next, err
	}
	rows, qerr := tx.Query(ctx, s.graph.dependents, Mode, frontier)
	if qerr != nil {
		return nil, nil, fmt.Errorf("%w; listing dependents: %w", err, qerr)
	}
	deps, qerr := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if qerr != nil {
		return nil, nil, fmt.Errorf("%w; listing dependents: %w", err, qerr)
	}
	avail, next = nil, nil
	for _, d := range deps {
		a, n, derr := s.releaseIn(ctx, tx, frontier, []uuid.UUID{d})
		if derr == nil {
			avail, next = append(avail, a...), append(next, n...)
			continue
		}
		if !isolatable(derr) {
			return nil, nil, derr
		}
		var failed, notified int64
		reason := fmt.Sprintf("releasing the job after its prerequisites ended failed, so it fails instead: %v", derr)
		if ferr := tx.QueryRow(ctx, s.graph.failDependent, Mode, frontier, d, reason, s.channel).Scan(&failed, &notified); ferr != nil {
			if !isolatable(ferr) {
				// Busy (its lock), or transient: the caller retries.
				return nil, nil, fmt.Errorf("failing dependent %s after its release failed (%v): %w", d, derr, ferr)
			}
			return nil, nil, fmt.Errorf("%w; recording that failure also failed: %w", derr, ferr)
		}
		if failed > 0 {
			next = append(next, d)
		}
	}
	return avail, next, nil
}

// isolatable reports whether err may be tied to one row: not a restart, a
// busy row, or a transient failure of the connection or server.
func isolatable(err error) bool {
	var rs *restartError
	return !errors.As(err, &rs) && !pgerr.Busy(err) && !pgerr.Transient(err) && !errors.Is(err, context.Canceled)
}

// releaseIn runs one release statement in a savepoint (for the dependents
// in only, when given).
func (s *Store) releaseIn(ctx context.Context, tx pgx.Tx, frontier, only []uuid.UUID) ([]Avail, []uuid.UUID, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	rows, err := sp.Query(ctx, s.graph.release, Mode, frontier, s.channel, only)
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, nil, fmt.Errorf("releasing dependents: %w", err)
	}
	var (
		avail []Avail
		next  []uuid.UUID
		id    *uuid.UUID
		state *string
		typ   *string
		tags  []byte
		runAt *time.Time
		inMS  *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &typ, &tags, &runAt, &inMS}, func() error {
		switch {
		case id == nil:
		case *state == "cancelled":
			next = append(next, *id)
		default:
			avail = append(avail, Avail{Type: *typ, Tags: slices.Clone(tags), RunAt: *runAt, In: time.Duration(*inMS) * time.Millisecond,
				Scheduled: *state == "scheduled"})
		}
		return nil
	})
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, nil, fmt.Errorf("releasing dependents: %w", err)
	}
	return avail, next, sp.Commit(ctx)
}
