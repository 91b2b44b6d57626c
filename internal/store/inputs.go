package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Results down a DAG (migration 0012). A job's dependency edges are
// consumed when its prerequisites end, so a dependent lists its
// prerequisites in its prereqs column (all of them from its enqueue on,
// since migration 0018; only those that completed for a job enqueued
// earlier), and the results of those that completed are copied aside
// into job_inputs: the release of the edges does it (graph.go), and so
// does the statement that reads (and locks) the prerequisites of a job
// enqueued, or retried by hand, after they completed (keeping). A handler
// reads them from job_inputs (Inputs), one statement for all of a job's
// prerequisites, whatever the retention of finished jobs: the cleaner
// deletes a job_inputs row only when no live job lists it (CleanInputs).

type inputsSQL struct {
	read, list, clean string
}

// InputsKeep is how long the cleaner keeps a row of job_inputs after it was
// written, even when no live job lists its prerequisite any more: a
// transaction giving the result to a new dependent writes a fresh row when
// the one it finds is older than half of this, so it may stay open that
// long (its dependent is invisible to the cleaner until it commits).
const InputsKeep = time.Hour

func (s *Store) buildInputs() {
	in := &s.in
	// The kept result, or else the prerequisite's own row (a prerequisite
	// listed by a job that was not given it through a release or enqueue
	// of this version).
	cols := `id, type, state, result`
	in.read = `SELECT x.id, COALESCE(k.type, a.type, ''), COALESCE(CASE WHEN k.id IS NOT NULL THEN 'completed' END, a.state, ''),
       COALESCE(k.result, a.result)
FROM unnest($1::uuid[]) WITH ORDINALITY AS x(id, i)
LEFT JOIN LATERAL (
	SELECT i.id, i.type, i.result FROM ` + s.inputs + ` i WHERE i.id = x.id
	ORDER BY i.finished_at DESC NULLS LAST, i.kept_at DESC LIMIT 1) k ON true
LEFT JOIN LATERAL (
	SELECT ` + cols + ` FROM ` + s.jobs + ` WHERE id = x.id AND k.id IS NULL
	UNION ALL
	SELECT ` + cols + ` FROM ` + s.history + ` WHERE id = x.id AND k.id IS NULL
	LIMIT 1) a ON true
ORDER BY x.i`
	// A retried job (control.go) lists every prerequisite whose result it
	// was given: a job enqueued before migration 0018 may not list them all.
	in.list = `UPDATE ` + s.jobs + ` SET prereqs = COALESCE(prereqs, '{}') || ARRAY(SELECT d FROM unnest($2::uuid[]) d WHERE NOT d = ANY(COALESCE(prereqs, '{}')))
WHERE id = $1 AND (prereqs IS NULL OR NOT prereqs @> $2::uuid[])`
	// Kept results no live job lists, written more than InputsKeep ago. A
	// writer adds a fresh row rather than touching an old one
	// (inputsFresh), so a dependent committed after this statement's
	// snapshot relies on a row too young to be deleted here.
	in.clean = `WITH d AS (
	SELECT k.ctid FROM ` + s.inputs + ` k
	WHERE k.kept_at < now() - $1::bigint * interval '1 millisecond'
	  AND NOT EXISTS (SELECT 1 FROM ` + s.jobs + ` j WHERE j.prereqs @> ARRAY[k.id] AND j.prereqs IS NOT NULL
	                  AND j.state IN ` + live + `)
	LIMIT $2 FOR UPDATE SKIP LOCKED
)
DELETE FROM ` + s.inputs + ` k USING d WHERE k.ctid = d.ctid`
}

// inputsFresh is the condition under which a writer adds a job_inputs row
// for the completed prerequisite row p: unless a row of the same
// completion written in the last 30 minutes (half InputsKeep) is there.
// Writers only insert, so none waits for another.
func (s *Store) inputsFresh(p string) string {
	return `NOT EXISTS (SELECT 1 FROM ` + s.inputs + ` k WHERE k.id = ` + p + `.id AND k.finished_at IS NOT DISTINCT FROM ` + p + `.finished_at
	AND k.kept_at > now() - interval '30 minutes')`
}

// Input is one prerequisite of a job as Inputs reads it.
type Input struct {
	ID     uuid.UUID
	Type   string // "" when the prerequisite is unknown (its row is gone)
	State  string // "" when unknown
	Result json.RawMessage
}

// Inputs reads the given prerequisites' types, states and results, in one
// statement, in the order given.
func (s *Store) Inputs(ctx context.Context, ids []uuid.UUID) ([]Input, error) {
	rows, err := s.pool.Query(ctx, s.in.read, Mode, ids)
	if err != nil {
		return nil, err
	}
	out := make([]Input, 0, len(ids))
	var in Input
	var id [16]byte
	_, err = pgx.ForEachRow(rows, []any{&id, &in.Type, &in.State, &in.Result}, func() error {
		in.ID = id
		out = append(out, in)
		in = Input{}
		return nil
	})
	return out, err
}

// keeping wraps read, a statement reading prerequisite rows (with at least
// the columns id, state, type, result and finished_at), so that the same
// statement keeps the results of those that completed and are listed in
// the array parameter deps (inputs.go), and returns the columns out of
// them. In the same statement, so on the same rows: a later statement
// could find a completed prerequisite retried meanwhile, its result
// cleared (a retry does not wait for the KEY SHARE lock that read may
// hold). A kept row that ends up unused (the transaction inserts no
// dependent after all) goes with the cleaner, as any other.
func (s *Store) keeping(read, deps, out string) string {
	return `WITH r AS (` + read + `), kept AS (
	INSERT INTO ` + s.inputs + ` (id, type, result, finished_at)
	SELECT r.id, r.type, r.result, r.finished_at FROM r
	WHERE r.state = 'completed' AND r.id = ANY(` + deps + `::uuid[]) AND ` + s.inputsFresh("r") + `
)
SELECT ` + out + ` FROM r`
}

// listInputs adds to job id's prereqs those of done it does not list.
func (s *Store) listInputs(ctx context.Context, tx DB, id uuid.UUID, done []uuid.UUID) error {
	_, err := tx.Exec(ctx, s.in.list, Mode, id, done)
	return err
}

// CleanInputs deletes up to limit kept results that no live job needs,
// and returns how many.
func (s *Store) CleanInputs(ctx context.Context, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, s.in.clean, Mode, InputsKeep.Milliseconds(), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
