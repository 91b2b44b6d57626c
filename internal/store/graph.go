package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The job graph: dependencies (edges of kind 'depends'), per-key ordering
// (kind 'order', from the tail of the key's chain to the new job), unique
// keys, cancellation and completion notices.
//
// Lock discipline. A dependent is added under its prerequisite's row lock
// (FOR NO KEY UPDATE), re-reading the prerequisite's state after the lock;
// a prerequisite with dependents finishes in a transaction whose first
// statement takes that row lock and whose later statements (on a newer
// snapshot) consume the edges. So an edge is either seen by the finish or
// added after it, by an enqueue that then sees the terminal state. Chains
// of one ordering key are changed only under a transaction-scoped advisory
// lock on the key (enqueue, and cancelling a blocked job of the chain).

type graphSQL struct {
	lockKeys, tails, lockPrereqs, mark, insert, insertUnique, edges, dups string
	cascadeKeys, splice, release                                          string
	read, cancelQueued, requestCancel, markWaiting                        string
}

const live = `('blocked', 'available', 'running')`

func (s *Store) buildGraph() {
	edges := pgx.Identifier{s.Schema, "job_edges"}.Sanitize()
	g := &s.graph
	g.lockKeys = `SELECT count(*) FROM (SELECT pg_advisory_xact_lock(hashtext($1), hashtext(k))
	FROM (SELECT DISTINCT unnest($2::text[]) AS k ORDER BY 1) s) l`
	// The tail of a key's chain: its live job with no live successor.
	g.tails = `SELECT DISTINCT ON (j.ordering_key) j.ordering_key, j.id FROM ` + s.jobs + ` j
WHERE j.ordering_key = ANY($1::text[]) AND j.state IN ` + live + `
  AND NOT EXISTS (SELECT 1 FROM ` + edges + ` e JOIN ` + s.jobs + ` n ON n.id = e.job
                  WHERE e.prereq = j.id AND e.kind = 'order' AND n.state IN ` + live + `)
ORDER BY j.ordering_key, j.created_at DESC, j.id DESC`
	// Locking an available job makes concurrent claims skip it (SKIP LOCKED)
	// and possibly park: whoever locks one announces it, and the posting is
	// delivered when the lock is released (at commit).
	g.lockPrereqs = `WITH l AS (
	SELECT id, state, type, tags FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
SELECT id, state FROM l
UNION ALL
SELECT NULL::uuid, NULL::text FROM (SELECT pg_notify($2, json_build_object('type', type, 'tags', tags)::text)
	FROM (SELECT DISTINCT type, tags FROM l WHERE state = 'available') d) n`
	g.mark = `UPDATE ` + s.jobs + ` SET has_dependents = true WHERE id = ANY($1::uuid[]) AND NOT has_dependents`
	cols := `(id, type, args, tags, priority, run_at, max_attempts, timeout_ms, state, blocked_by, ordering_key, unique_key, last_error, finished_at)`
	sel := `SELECT t.id, t.type, t.args, t.tags, t.priority,
	       COALESCE(t.run_at, now() + t.delay_ms * interval '1 millisecond'), t.max_attempts, t.timeout_ms,
	       t.state, t.blocked_by, t.ordering_key, t.unique_key, t.last_error,
	       CASE WHEN t.state = 'cancelled' THEN now() END
	FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::smallint[], $6::timestamptz[], $7::bigint[], $8::integer[],
	            $9::bigint[], $10::text[], $11::integer[], $12::text[], $13::text[], $14::text[])
	     AS t(id, type, args, tags, priority, run_at, delay_ms, max_attempts, timeout_ms, state, blocked_by, ordering_key, unique_key, last_error)`
	g.insert = `INSERT INTO ` + s.jobs + ` ` + cols + ` ` + sel + ` RETURNING id`
	g.insertUnique = `INSERT INTO ` + s.jobs + ` ` + cols + ` ` + sel + `
	ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ` + live + ` DO NOTHING RETURNING id`
	g.edges = `INSERT INTO ` + edges + ` (prereq, job, kind) SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[])`
	g.dups = `SELECT unique_key, id FROM ` + s.jobs + ` WHERE unique_key = ANY($1::text[]) AND state IN ` + live

	// Keys of blocked jobs that a failed or cancelled prerequisite is about
	// to cancel: their chains change, so their keys are locked first.
	g.cascadeKeys = `SELECT DISTINCT j.ordering_key FROM ` + edges + ` e
	JOIN ` + s.jobs + ` p ON p.id = e.prereq JOIN ` + s.jobs + ` j ON j.id = e.job
WHERE e.prereq = ANY($1::uuid[]) AND e.kind = 'depends' AND p.state IN ('failed', 'cancelled')
  AND j.state = 'blocked' AND j.ordering_key IS NOT NULL`
	// A job cancelled while blocked in a chain hands its live predecessor
	// on to its successor, so the chain keeps its order.
	g.splice = `WITH preds AS (
	SELECT e.prereq AS pred, e.job AS mid FROM ` + edges + ` e WHERE e.job = ANY($1::uuid[]) AND e.kind = 'order'
), locked AS (
	SELECT p.id, p.state, p.type, p.tags FROM ` + s.jobs + ` p WHERE p.id IN (SELECT pred FROM preds) AND p.state IN ` + live + `
	ORDER BY p.id FOR NO KEY UPDATE
), wake AS (
	SELECT pg_notify($2, json_build_object('type', type, 'tags', tags)::text)
	FROM (SELECT DISTINCT type, tags FROM locked WHERE state = 'available') d
), ins AS (
	INSERT INTO ` + edges + ` (prereq, job, kind)
	SELECT pr.pred, x.job, 'order' FROM preds pr JOIN locked l ON l.id = pr.pred
	JOIN ` + edges + ` x ON x.prereq = pr.mid AND x.kind = 'order'
	JOIN ` + s.jobs + ` n ON n.id = x.job AND n.state = 'blocked'
	ON CONFLICT DO NOTHING RETURNING job
), upd AS (
	UPDATE ` + s.jobs + ` j SET blocked_by = j.blocked_by + c.n
	FROM (SELECT job, count(*)::int AS n FROM ins GROUP BY job) c WHERE j.id = c.job
	RETURNING j.id
)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM wake)`
	// Consume the edges of terminal prerequisites: a completed one (or any
	// terminal predecessor in a chain) unblocks, a failed or cancelled
	// dependency cancels. Returns the newly cancelled jobs that have
	// dependents of their own, and notifies.
	g.release = `WITH e AS (
	DELETE FROM ` + edges + ` x USING ` + s.jobs + ` p
	WHERE x.prereq = p.id AND p.id = ANY($1::uuid[]) AND p.state IN ('completed', 'failed', 'cancelled')
	RETURNING x.job, x.kind, x.prereq, p.state AS pstate
), agg AS (
	SELECT job, count(*)::int AS n,
	       (array_agg(prereq::text || ' ' || pstate ORDER BY prereq) FILTER (WHERE kind = 'depends' AND pstate <> 'completed'))[1] AS bad
	FROM e GROUP BY job
), upd AS (
	UPDATE ` + s.jobs + ` j SET
		blocked_by = j.blocked_by - agg.n,
		state = CASE WHEN agg.bad IS NOT NULL THEN 'cancelled' WHEN j.blocked_by - agg.n <= 0 THEN 'available' ELSE 'blocked' END,
		last_error = CASE WHEN agg.bad IS NOT NULL THEN 'cancelled: prerequisite ' || agg.bad ELSE j.last_error END,
		finished_at = CASE WHEN agg.bad IS NOT NULL THEN now() END
	FROM agg WHERE j.id = agg.job AND j.state = 'blocked'
	RETURNING j.id, j.state, j.type, j.tags, j.run_at, j.has_dependents, j.notify_done
)
SELECT u.id FROM upd u WHERE u.state = 'cancelled' AND u.has_dependents
UNION ALL
SELECT NULL::uuid FROM (SELECT pg_notify($2, json_build_object('type', d.type, 'tags', d.tags,
		'in', greatest(0, ceil(extract(epoch FROM d.run_at - now()) * 1000))::bigint)::text)
	FROM (SELECT type, tags, min(run_at) AS run_at FROM upd WHERE state = 'available' GROUP BY type, tags) d) n
UNION ALL
SELECT NULL::uuid FROM (SELECT pg_notify($2, json_build_object('done', u.id)::text) FROM upd u
	WHERE u.notify_done AND u.state = 'cancelled') w`

	g.read = `SELECT state, ordering_key FROM ` + s.jobs + ` WHERE id = $1`
	g.cancelQueued = `WITH c AS (
	UPDATE ` + s.jobs + ` SET state = 'cancelled', finished_at = now(), last_error = 'cancelled by request'
	WHERE id = $1 AND state IN ('blocked', 'available') RETURNING id, notify_done
)
SELECT count(*), count(pg_notify($2, json_build_object('done', id)::text)) FILTER (WHERE notify_done) FROM c`
	g.requestCancel = `WITH c AS (
	UPDATE ` + s.jobs + ` SET cancel_requested = true WHERE id = $1 AND state = 'running' RETURNING id
)
SELECT count(*), count(pg_notify($2, json_build_object('cancel', id)::text)) FROM c`
	g.markWaiting = `WITH u AS (
	UPDATE ` + s.jobs + ` SET notify_done = true WHERE id = $1 RETURNING state, type, tags
)
SELECT u.state, (SELECT count(pg_notify($2, json_build_object('type', w.type, 'tags', w.tags)::text))
                 FROM u w WHERE w.state = 'available') FROM u`
}

// ErrUnknownPrerequisites is wrapped by InsertGraph when a dependency names
// a job that does not exist.
var ErrUnknownPrerequisites = errors.New("unknown prerequisite job IDs")

// GraphJob is a job with graph features; see InsertGraph.
type GraphJob struct {
	NewJob
	DependsOn   []uuid.UUID // prerequisites: earlier jobs or members of the batch
	OrderingKey string
	UniqueKey   string
}

// Inserted reports one job of InsertGraph.
type Inserted struct {
	ID        uuid.UUID // the new job, or the existing one for a duplicate
	Duplicate bool      // a live job with the same unique key existed
	State     string    // state of the new job (blocked, available, cancelled)
	Type      string
	Tags      []byte
	Delay     time.Duration
	RunAt     *time.Time
}

// InsertGraph inserts jobs with dependencies, ordering keys or unique keys
// inside tx, following the lock discipline above. The batch has been
// validated (no cycles, no self-dependency, no unique job that another
// batch member depends on).
func (s *Store) InsertGraph(ctx context.Context, tx pgx.Tx, jobs []GraphJob) ([]Inserted, error) {
	g := &s.graph
	inBatch := make(map[uuid.UUID]int, len(jobs))
	for i, j := range jobs {
		inBatch[j.ID] = i
	}

	// 1. Serialise enqueues of each ordering key, then find each key's tail.
	var keys []string
	seenKey := map[string]bool{}
	for _, j := range jobs {
		if j.OrderingKey != "" && !seenKey[j.OrderingKey] {
			seenKey[j.OrderingKey] = true
			keys = append(keys, j.OrderingKey)
		}
	}
	sort.Strings(keys)
	tails := map[string]uuid.UUID{}
	if len(keys) > 0 {
		var n int64
		if err := tx.QueryRow(ctx, g.lockKeys, Mode, s.Schema, keys).Scan(&n); err != nil {
			return nil, fmt.Errorf("locking ordering keys: %w", err)
		}
		var err error
		if tails, err = idsByKey(ctx, tx, g.tails, keys); err != nil {
			return nil, fmt.Errorf("finding ordering tails: %w", err)
		}
	}

	// 2. Lock the external prerequisites (dependencies outside the batch
	// and the chain tails) and read their state after the lock.
	external := map[uuid.UUID]bool{}
	for _, j := range jobs {
		for _, d := range j.DependsOn {
			if _, ok := inBatch[d]; !ok {
				external[d] = true
			}
		}
	}
	for _, t := range tails {
		external[t] = true
	}
	states := map[uuid.UUID]string{}
	if len(external) > 0 {
		ids := make([]uuid.UUID, 0, len(external))
		for id := range external {
			ids = append(ids, id)
		}
		rows, err := tx.Query(ctx, g.lockPrereqs, Mode, ids, s.Channel)
		if err != nil {
			return nil, fmt.Errorf("locking prerequisites: %w", err)
		}
		for rows.Next() {
			var id *uuid.UUID
			var st *string
			if err := rows.Scan(&id, &st); err != nil {
				rows.Close()
				return nil, err
			}
			if id != nil {
				states[*id] = *st
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("locking prerequisites: %w", err)
		}
		var unknown []string
		for id := range external {
			if _, ok := states[id]; !ok {
				unknown = append(unknown, id.String())
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return nil, fmt.Errorf("%w: %v", ErrUnknownPrerequisites, unknown)
		}
	}

	// 3. Dependencies, prerequisites first: a failed or cancelled one
	// cancels the job, an unfinished one blocks it.
	out := make([]Inserted, len(jobs))
	blocked := make([]int32, len(jobs))
	lastErr := make([]*string, len(jobs))
	var eP, eJ []uuid.UUID
	var eK []string
	for _, i := range topoOrder(jobs, inBatch) {
		j := jobs[i]
		out[i] = Inserted{ID: j.ID, State: "available", Type: j.Type, Tags: j.Tags, Delay: j.Delay, RunAt: j.RunAt}
		for _, d := range j.DependsOn {
			st := states[d]
			if bi, in := inBatch[d]; in {
				st = out[bi].State
			}
			switch {
			case st == "completed":
			case st == "failed" || st == "cancelled":
				if lastErr[i] == nil {
					msg := fmt.Sprintf("cancelled: prerequisite %s %s", d, st)
					lastErr[i] = &msg
					out[i].State = "cancelled"
				}
			default:
				blocked[i]++
				eP, eJ, eK = append(eP, d), append(eJ, j.ID), append(eK, "depends")
			}
		}
		if out[i].State != "cancelled" && blocked[i] > 0 {
			out[i].State = "blocked"
		}
	}
	// 4. Ordering chains, in batch order; a job cancelled on arrival is not
	// part of its chain.
	prev := map[string]uuid.UUID{}
	for k, t := range tails {
		if !terminal(states[t]) {
			prev[k] = t
		}
	}
	for i, j := range jobs {
		k := j.OrderingKey
		if k == "" || out[i].State == "cancelled" {
			continue
		}
		if p, ok := prev[k]; ok {
			blocked[i]++
			out[i].State = "blocked"
			eP, eJ, eK = append(eP, p), append(eJ, j.ID), append(eK, "order")
		}
		prev[k] = j.ID
	}
	var open []uuid.UUID
	for _, p := range eP {
		if _, in := inBatch[p]; in || !terminal(states[p]) {
			open = append(open, p)
		}
	}

	// 5. Insert the jobs (unique duplicates are skipped), then the edges of
	// the jobs that were inserted.
	n := len(jobs)
	ids := make([]uuid.UUID, n)
	types := make([]string, n)
	args := make([][]byte, n)
	tags := make([][]byte, n)
	prios := make([]int16, n)
	runAts := make([]*time.Time, n)
	delays := make([]int64, n)
	maxAtt := make([]int32, n)
	timeouts := make([]int64, n)
	stateCol := make([]string, n)
	okeys := make([]*string, n)
	ukeys := make([]*string, n)
	unique := false
	for i, j := range jobs {
		ids[i], types[i], args[i], tags[i] = j.ID, j.Type, j.Args, j.Tags
		prios[i], runAts[i], maxAtt[i] = j.Priority, j.RunAt, j.MaxAttempts
		delays[i], timeouts[i] = j.Delay.Milliseconds(), j.Timeout.Milliseconds()
		stateCol[i] = out[i].State
		if j.OrderingKey != "" {
			okeys[i] = &jobs[i].OrderingKey
		}
		if j.UniqueKey != "" {
			ukeys[i] = &jobs[i].UniqueKey
			unique = true
		}
	}
	q := g.insert
	if unique {
		q = g.insertUnique
	}
	rows, err := tx.Query(ctx, q, Mode, ids, types, args, tags, prios, runAts, delays, maxAtt, timeouts,
		stateCol, blocked, okeys, ukeys, lastErr)
	if err != nil {
		return nil, err
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	if len(inserted) < n {
		got := make(map[uuid.UUID]bool, len(inserted))
		for _, id := range inserted {
			got[id] = true
		}
		var dupKeys []string
		for i, j := range jobs {
			if !got[j.ID] {
				out[i].Duplicate = true
				dupKeys = append(dupKeys, j.UniqueKey)
			}
		}
		existing, err := idsByKey(ctx, tx, g.dups, dupKeys)
		if err != nil {
			return nil, fmt.Errorf("reading duplicates: %w", err)
		}
		for i, j := range jobs {
			if !out[i].Duplicate {
				continue
			}
			id, ok := existing[j.UniqueKey]
			if !ok {
				// The live job ended between the insert and the look-up.
				return nil, fmt.Errorf("unique key %q: the existing job finished during the insert; retry", j.UniqueKey)
			}
			out[i].ID, out[i].State = id, ""
		}
		// Drop the edges of jobs that were not inserted.
		k := 0
		for x := range eJ {
			if got[eJ[x]] {
				eP[k], eJ[k], eK[k] = eP[x], eJ[x], eK[x]
				k++
			}
		}
		eP, eJ, eK = eP[:k], eJ[:k], eK[:k]
	}
	if len(eP) > 0 {
		if _, err := tx.Exec(ctx, g.edges, Mode, eP, eJ, eK); err != nil {
			return nil, fmt.Errorf("inserting edges: %w", err)
		}
	}
	if len(open) > 0 {
		if _, err := tx.Exec(ctx, g.mark, Mode, open); err != nil {
			return nil, fmt.Errorf("marking prerequisites: %w", err)
		}
	}
	return out, nil
}

// idsByKey runs a query returning (key, id) rows for keys.
func idsByKey(ctx context.Context, tx pgx.Tx, sql string, keys []string) (map[string]uuid.UUID, error) {
	rows, err := tx.Query(ctx, sql, Mode, keys)
	if err != nil {
		return nil, err
	}
	out := map[string]uuid.UUID{}
	var k string
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&k, &id}, func() error { out[k] = id; return nil }); err != nil {
		return nil, err
	}
	return out, nil
}

// topoOrder returns batch indexes with in-batch prerequisites first. The
// batch is acyclic (validated by the caller).
func topoOrder(jobs []GraphJob, inBatch map[uuid.UUID]int) []int {
	order := make([]int, 0, len(jobs))
	state := make([]uint8, len(jobs)) // 0 new, 1 visiting, 2 done
	var visit func(i int)
	visit = func(i int) {
		if state[i] != 0 {
			return
		}
		state[i] = 1
		for _, d := range jobs[i].DependsOn {
			if bi, ok := inBatch[d]; ok {
				visit(bi)
			}
		}
		state[i] = 2
		order = append(order, i)
	}
	for i := range jobs {
		visit(i)
	}
	return order
}

func terminal(state string) bool {
	return state == "completed" || state == "failed" || state == "cancelled"
}

// Release consumes the edges of the given terminal prerequisites inside tx:
// dependents whose last prerequisite completed become available (and are
// announced), dependents of a failed or cancelled dependency are cancelled,
// transitively.
func (s *Store) Release(ctx context.Context, tx pgx.Tx, frontier []uuid.UUID) error {
	g := &s.graph
	for len(frontier) > 0 {
		rows, err := tx.Query(ctx, g.cascadeKeys, Mode, frontier)
		if err != nil {
			return fmt.Errorf("releasing dependents: %w", err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("releasing dependents: %w", err)
		}
		if len(keys) > 0 {
			var n int64
			if err := tx.QueryRow(ctx, g.lockKeys, Mode, s.Schema, keys).Scan(&n); err != nil {
				return fmt.Errorf("locking ordering keys: %w", err)
			}
		}
		var spliced, woken int64
		if err := tx.QueryRow(ctx, g.splice, Mode, frontier, s.Channel).Scan(&spliced, &woken); err != nil {
			return fmt.Errorf("splicing ordering chains: %w", err)
		}
		rows, err = tx.Query(ctx, g.release, Mode, frontier, s.Channel)
		if err != nil {
			return fmt.Errorf("releasing dependents: %w", err)
		}
		next, err := pgx.CollectRows(rows, pgx.RowTo[*uuid.UUID])
		if err != nil {
			return fmt.Errorf("releasing dependents: %w", err)
		}
		frontier = frontier[:0]
		for _, id := range next {
			if id != nil {
				frontier = append(frontier, *id)
			}
		}
	}
	return nil
}

// CancelOutcome is what Cancel did.
type CancelOutcome struct {
	State     string // the job's state after the call
	Requested bool   // the job was running: its worker was asked to stop
}

// Cancel cancels a blocked or available job at once (cascading to its
// dependents), asks the worker of a running job to stop, and leaves a
// finished job alone.
func (s *Store) Cancel(ctx context.Context, id uuid.UUID) (CancelOutcome, error) {
	g := &s.graph
	var out CancelOutcome
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		for range 10 { // the state can move under us; a few rounds settle it
			var state string
			var okey *string
			if err := tx.QueryRow(ctx, g.read, Mode, id).Scan(&state, &okey); err != nil {
				if errors.Is(err, pgx.ErrNoRows) {
					return ErrNotFound
				}
				return err
			}
			switch state {
			case "blocked", "available":
				if okey != nil {
					var n int64
					if err := tx.QueryRow(ctx, g.lockKeys, Mode, s.Schema, []string{*okey}).Scan(&n); err != nil {
						return err
					}
				}
				var n, notified int64
				if err := tx.QueryRow(ctx, g.cancelQueued, Mode, id, s.Channel).Scan(&n, &notified); err != nil {
					return err
				}
				if n == 0 {
					continue
				}
				out = CancelOutcome{State: "cancelled"}
				return s.Release(ctx, tx, []uuid.UUID{id})
			case "running":
				var n, notified int64
				if err := tx.QueryRow(ctx, g.requestCancel, Mode, id, s.Channel).Scan(&n, &notified); err != nil {
					return err
				}
				if n == 0 {
					continue
				}
				out = CancelOutcome{State: "running", Requested: true}
				return nil
			default:
				out = CancelOutcome{State: state}
				return nil
			}
		}
		return fmt.Errorf("job %s kept changing state", id)
	})
	return out, err
}

// MarkWaiting asks for a completion notice of the job and returns its
// current state.
func (s *Store) MarkWaiting(ctx context.Context, id uuid.UUID) (string, error) {
	var state string
	var woken int64
	err := s.Pool.QueryRow(ctx, s.graph.markWaiting, Mode, id, s.Channel).Scan(&state, &woken)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	return state, err
}
