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

// A finished job retried by hand takes its place in the graph again. Its
// dependency edges were consumed when its prerequisites ended, so it
// waits for what it lists in prereqs (every prerequisite since migration
// 0018), for the prerequisites of edges still pointing at it (a
// prerequisite that was live when the job was cancelled), and for the
// tail of its ordering key's chain. In graph.go's lock order: the key,
// then those upstream rows (FOR KEY SHARE, in ID order, their states read
// after the lock), then the job. A prerequisite that failed or was
// cancelled refuses the retry (PrerequisiteError): the job would wait for
// a job that has ended; retrying that one first gives the job something
// to wait for. A prerequisite no longer known (deleted, or past its
// retention) holds nothing back, as it would not for a new dependent
// whose prerequisite's record is gone.

// ErrPrerequisiteFailed is wrapped by a PrerequisiteError.
var ErrPrerequisiteFailed = errors.New("a prerequisite of the job failed or was cancelled")

// PrerequisiteError refuses the retry of a job one of whose prerequisites
// failed or was cancelled and is not retried.
type PrerequisiteError struct {
	ID    uuid.UUID // the prerequisite
	State string    // failed or cancelled
}

func (e *PrerequisiteError) Error() string {
	return fmt.Sprintf("prerequisite %s %s: %v", e.ID, e.State, ErrPrerequisiteFailed)
}

func (e *PrerequisiteError) Unwrap() error { return ErrPrerequisiteFailed }

type retrySQL struct {
	own, edgesIn, historyStates, lockNowait string
}

func (s *Store) buildRetry() {
	r := &s.retry
	r.own = `SELECT prereqs, last_error FROM ` + s.jobs + ` WHERE id = $1
UNION ALL SELECT prereqs, last_error FROM ` + s.history + ` WHERE id = $1 LIMIT 1`
	r.edgesIn = `SELECT prereq, kind FROM ` + s.edges + ` WHERE job = $1`
	r.lockNowait = s.keeping(`SELECT id, state, type, tags, run_at, result, finished_at FROM `+s.jobs+` WHERE id = ANY($1::uuid[]) ORDER BY id FOR KEY SHARE NOWAIT`,
		"$2", "id, state, type, tags, run_at")
	// By ranges of IDs: job_history's BRIN index answers a range with one
	// scan, "id = ANY" with one scan per ID (see ExistingIDs).
	r.historyStates = s.keeping(`SELECT h.* FROM unnest($3::uuid[], $4::uuid[]) AS b(lo, hi)
CROSS JOIN LATERAL (SELECT id, state, type, result, finished_at FROM `+s.history+` WHERE id BETWEEN b.lo AND b.hi AND (id = ANY($1::uuid[])) IS TRUE) h`,
		"$2", "id, state")
}

// retryEdge is an edge into the retried job.
type retryEdge struct {
	prereq uuid.UUID
	kind   string
}

// retryPlan is where a finished job goes back to: the edges it waits on
// (all from live jobs), the completed prerequisites whose results it must
// be given, and the available upstream rows locked (to announce at
// commit).
type retryPlan struct {
	edges  []retryEdge
	done   []uuid.UUID
	locked []Avail
}

// planRetry decides, inside a graph transaction holding the job's key
// lock, what the finished job id must wait for, locking its upstream rows.
func (s *Store) planRetry(ctx context.Context, tx pgx.Tx, id uuid.UUID, okey string) (retryPlan, error) {
	var rp retryPlan
	var declared []uuid.UUID
	var lastErr *string
	if err := tx.QueryRow(ctx, s.retry.own, Mode, id).Scan(&declared, &lastErr); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return rp, errStateChanged // deleted meanwhile
		}
		return rp, err
	}
	if lastErr != nil {
		if m := cancelReason.FindStringSubmatch(*lastErr); m != nil { // a job enqueued before migration 0018 lists no other trace of it
			if p, err := uuid.Parse(m[1]); err == nil && !slices.Contains(declared, p) {
				declared = append(declared, p)
			}
		}
	}
	rows, err := tx.Query(ctx, s.retry.edgesIn, Mode, id)
	if err != nil {
		return rp, err
	}
	var e retryEdge
	standing, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (retryEdge, error) {
		err := r.Scan(&e.prereq, &e.kind)
		return e, err
	})
	if err != nil {
		return rp, err
	}
	var tail *uuid.UUID
	if okey != "" {
		// The job joins the key's chain: the key's row records it
		// (orderkeys.go).
		tails, err := s.tails(ctx, tx, []string{okey}, []uuid.UUID{id})
		if err != nil {
			return rp, err
		}
		if t, ok := tails[okey]; ok && t != id {
			tail = &t
		}
	}
	upstream := slices.Clone(declared)
	for _, e := range standing {
		upstream = append(upstream, e.prereq)
	}
	if tail != nil {
		upstream = append(upstream, *tail)
	}
	slices.SortFunc(upstream, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	upstream = slices.Compact(upstream)
	if len(upstream) == 0 {
		return rp, nil
	}
	states, err := s.lockUpstream(ctx, tx, upstream, declared, &rp)
	if err != nil {
		return rp, err
	}
	live := func(p uuid.UUID) bool { st, ok := states[p]; return ok && !terminal(st) }
	add := func(p uuid.UUID, kind string) {
		if e := (retryEdge{p, kind}); !slices.Contains(rp.edges, e) {
			rp.edges = append(rp.edges, e)
		}
	}
	for _, p := range declared {
		switch st, known := states[p]; {
		case !known:
		case st == "completed":
			rp.done = append(rp.done, p)
		case st == "failed" || st == "cancelled":
			return rp, &PrerequisiteError{ID: p, State: st}
		default:
			add(p, "depends")
		}
	}
	if tail != nil && live(*tail) {
		add(*tail, "order")
	}
	// Edges still pointing at the job from live jobs stay, and count: a
	// chain predecessor it waited for before it was cancelled will
	// release it when it ends. (Those of jobs that ended while we waited
	// for their locks were consumed by their finish.)
	for _, e := range standing {
		if live(e.prereq) {
			add(e.prereq, e.kind)
		}
	}
	return rp, nil
}

// lockUpstream takes FOR KEY SHARE on the live ones of ids (sorted), and
// returns the states of all of them that exist, read after the lock. The
// same statements keep the results of the completed ones among deps.
//
// A job found in neither table may be moving between them (a retry moves
// it from job_history to jobs, the retirer back) between the statements
// that look, each on its own snapshot: it is looked for again, in jobs,
// then in job_history, each direction covered once more. A job not found
// then is gone. The late look in jobs takes its lock out of ID order, so
// only with NOWAIT: a busy row restarts the transaction with it in the
// lock plan (runGraphTx).
func (s *Store) lockUpstream(ctx context.Context, tx pgx.Tx, ids, deps []uuid.UUID, rp *retryPlan) (map[uuid.UUID]string, error) {
	states := make(map[uuid.UUID]string, len(ids))
	missing := func(ids []uuid.UUID) []uuid.UUID {
		var out []uuid.UUID
		for _, id := range ids {
			if _, ok := states[id]; !ok {
				out = append(out, id)
			}
		}
		return out
	}
	if err := s.lockLive(ctx, tx, s.graph.lockPrereqs, ids, deps, states, rp); err != nil {
		return nil, err
	}
	for round := 0; round < 2; round++ {
		gone := missing(ids)
		if len(gone) == 0 {
			break
		}
		if err := s.finishedStates(ctx, tx, gone, deps, states); err != nil {
			return nil, err
		}
		if gone = missing(gone); len(gone) == 0 || round == 1 {
			break
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.lockLive(ctx, sp, s.retry.lockNowait, gone, deps, states, rp); err != nil {
			_ = sp.Rollback(ctx)
			if pgerr.Busy(err) {
				return nil, &restartError{rows: gone}
			}
			return nil, err
		}
		if err := sp.Commit(ctx); err != nil {
			return nil, err
		}
	}
	return states, nil
}

// lockLive runs a locking read of ids in jobs (lockPrereqs' columns,
// keeping the results of deps) and records their states, and the
// available ones in rp.locked.
func (s *Store) lockLive(ctx context.Context, tx pgx.Tx, sql string, ids, deps []uuid.UUID, states map[uuid.UUID]string, rp *retryPlan) error {
	rows, err := tx.Query(ctx, sql, Mode, ids, deps)
	if err != nil {
		return fmt.Errorf("locking prerequisites: %w", err)
	}
	var (
		id    uuid.UUID
		state string
		typ   string
		tags  []byte
		runAt time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &state, &typ, &tags, &runAt}, func() error {
		states[id] = state
		if state == "available" {
			rp.locked = append(rp.locked, Avail{Type: typ, Tags: slices.Clone(tags), RunAt: runAt})
		}
		return nil
	}); err != nil {
		return fmt.Errorf("locking prerequisites: %w", err)
	}
	return nil
}

// finishedStates records the states of those of ids in job_history,
// keeping the results of deps.
func (s *Store) finishedStates(ctx context.Context, tx pgx.Tx, ids, deps []uuid.UUID, states map[uuid.UUID]string) error {
	lo, hi := idRanges(ids, 1000)
	rows, err := tx.Query(ctx, s.retry.historyStates, Mode, ids16(ids), deps, ids16(lo), ids16(hi))
	if err != nil {
		return fmt.Errorf("reading finished prerequisites: %w", err)
	}
	var id uuid.UUID
	var state string
	if _, err := pgx.ForEachRow(rows, []any{&id, &state}, func() error {
		states[id] = state
		return nil
	}); err != nil {
		return fmt.Errorf("reading finished prerequisites: %w", err)
	}
	return nil
}
