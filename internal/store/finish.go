package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Lock timeouts of the transactions that finish jobs. The fast lane takes
// every row lock with SKIP LOCKED or NOWAIT, so its timeout is only a
// backstop: a write that would wait longer is split off and retried on its
// own in the slow lane, where waiting delays nobody else.
const (
	FastLockTimeout = 200 * time.Millisecond
	SlowLockTimeout = 2 * time.Second
)

type finishSQL struct {
	fast, skip, wait, ended, held, extend, extendProgress, sweep, sweepIDs, nextExpiry, expired, failExpired string
}

// Finish is one fenced terminal or retry write.
type Finish struct {
	ID           uuid.UUID
	Token        uuid.UUID
	State        string        // completed, failed, cancelled or available
	Delay        time.Duration // for available: run again at now() + Delay, or KeepRunAt
	AttemptDelta int           // GiveAttemptBack: the attempt is not spent (snooze, release)
	Result       json.RawMessage
	Err          *string // appended to the error history when set
	// Outcome, with Err, names how the attempt ended, as its error entry
	// records it (AttemptError.Outcome: error, timeout, panic, lease lost,
	// cancelled; "" is error). The caller decides it from the error values
	// (the error text is not read); only the database's own decision
	// overrides it: a retry of a job whose cancel was requested ends
	// cancelled, and so does its outcome.
	Outcome string
	// Progress is the job's latest progress, written with the outcome
	// (nil: unchanged).
	Progress json.RawMessage
	// Discard, with State completed: the job may be deleted rather than
	// moved to job_history when nobody needs it kept (no result, no Wait,
	// no dependents). Only Finish honours it; FinishGraph keeps the job.
	Discard bool
}

// The values of Finish's fields that give a job back without a retry.
const (
	// KeepRunAt, as Delay, keeps the job's run_at: it goes back ahead of
	// jobs due later (a release).
	KeepRunAt time.Duration = -1
	// GiveAttemptBack, as AttemptDelta, does not spend the attempt.
	GiveAttemptBack = -1
)

// Release is the write that gives a claimed job back at once, keeping its
// place (run_at) and its attempt.
func Release(id, token uuid.UUID) Finish {
	return Finish{ID: id, Token: token, State: "available", Delay: KeepRunAt, AttemptDelta: GiveAttemptBack}
}

// FinishStatus is what became of one Finish.
type FinishStatus uint8

// The statuses of a Finish.
const (
	Written FinishStatus = iota + 1 // the outcome is recorded
	Refused                         // the lease is gone: the row no longer matches id, token and state running
	Busy                            // another transaction held the row: write it again on its own, waiting
	Graph                           // the job has dependents: write it with FinishGraph
)

// FinishResult is what one Finish call did.
type FinishResult struct {
	Status map[uuid.UUID]FinishStatus
	State  map[uuid.UUID]string // the state written, for Written rows
	Avail  []Avail              // dependents the finishes made available
}

// extendStatement is the lease renewal, writing each job's progress ($4)
// too when progress. It skips rows another transaction holds (being
// finished, typically): it never waits, so it cannot deadlock with a
// finish or be held up by one, and it reports those rows as busy rather
// than lost.
func (s *Store) extendStatement(progress bool) string {
	params, cols := "$1::uuid[], $2::uuid[]", "id, token"
	set, from := "lease_expires_at = now() + $3 * interval '1 millisecond'", "l WHERE j.id = l.id"
	if progress {
		params, cols = params+", $4::jsonb[]", cols+", progress"
		set, from = set+", progress = COALESCE(t.progress, j.progress)", "l JOIN t ON t.id = l.id WHERE j.id = l.id"
	}
	return `WITH t AS (
	SELECT * FROM unnest(` + params + `) AS t(` + cols + `)
), l AS (
	SELECT j.id FROM ` + s.jobs + ` j JOIN t ON j.id = t.id
	WHERE j.lease_token = t.token AND j.state = 'running'
	ORDER BY j.id FOR NO KEY UPDATE OF j SKIP LOCKED
), u AS (
	UPDATE ` + s.jobs + ` j SET ` + set + `
	FROM ` + from + `
	RETURNING j.id, j.cancel_requested
)
SELECT u.id, u.cancel_requested, true FROM u
UNION ALL
SELECT j.id, false, false FROM ` + s.jobs + ` j JOIN t ON j.id = t.id
WHERE j.lease_token = t.token AND j.state = 'running' AND j.id NOT IN (SELECT id FROM u)`
}

func (s *Store) buildFinish() {
	f := &s.fin
	// The finish: fenced by id, lease token and state; a cancel request
	// turns a retry into cancelled; completion clears the current error
	// (the history keeps it). Rows are locked FOR UPDATE, the lock every
	// move to a terminal state takes (see graph.go), in ID order. Each
	// error entry's outcome is the one the process sent ($14 of finish(),
	// $10 here; NULL: error), but 'cancelled' where the job ends
	// cancelled: the process cannot know of a cancel requested meanwhile.
	f.fast = `SELECT id, state, status, txid_current(), (SELECT ` + timelineSQL + `) FROM ` + pgx.Identifier{s.schema, "finish"}.Sanitize() +
		`($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::integer[], $6::jsonb[], $7::text[], $8::uuid[], $9, $10, $11, $12, $13::jsonb[], $14::text[])`
	stmt := func(lock string) string {
		return `WITH f AS (
	SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::integer[], $6::jsonb[], $7::text[], $9::jsonb[], $10::text[])
	       AS t(id, token, state, delay_ms, attempt_delta, result, err, progress, outcome)
), l AS (
	SELECT j.id FROM ` + s.jobs + ` j JOIN f ON j.id = f.id
	WHERE j.lease_token = f.token AND j.state = 'running'
	ORDER BY j.id FOR UPDATE OF j ` + lock + `
), done AS (
	UPDATE ` + s.jobs + ` j SET
		state = CASE WHEN j.cancel_requested AND f.state = 'available' THEN 'cancelled'
		             WHEN f.state = 'available' AND f.delay_ms > 0 THEN 'scheduled' ELSE f.state END,
		run_at = CASE WHEN f.state = 'available' AND f.delay_ms >= 0 THEN now() + f.delay_ms * interval '1 millisecond' ELSE j.run_at END,
		attempt = j.attempt + f.attempt_delta,
		result = f.result,
		progress = COALESCE(f.progress, j.progress),
		last_error = CASE WHEN f.state = 'completed' THEN NULL
		                  WHEN j.cancel_requested AND f.state = 'available' THEN 'cancelled by request' || COALESCE('; its last attempt ended with: ' || f.err, '')
		                  ELSE COALESCE(f.err, j.last_error) END,
		errors = CASE WHEN f.err IS NULL THEN j.errors ELSE ` + errorsAppend("j.attempt", "f.err",
			`CASE WHEN f.state = 'cancelled' OR j.cancel_requested AND f.state = 'available' THEN 'cancelled' ELSE COALESCE(f.outcome, 'error') END`) + ` END,
		lease_token = NULL, lease_expires_at = NULL,
		finished_at = CASE WHEN f.state IN ('completed', 'failed', 'cancelled') OR j.cancel_requested THEN now() END
	FROM f, l WHERE j.id = f.id AND j.id = l.id
	RETURNING j.id, j.state, j.notify_done
)
SELECT d.id, d.state FROM done d
UNION ALL
SELECT NULL::uuid, NULL::text FROM (
	SELECT pg_notify($8, ` + s.postingSQL("p_done => d.id") + `) FROM done d WHERE d.notify_done AND d.state IN ('completed', 'failed', 'cancelled')) w`
	}
	f.skip = stmt("SKIP LOCKED")
	f.wait = stmt("")
	// Run after the finish, on a newer snapshot: the batch members that
	// ended and have dependents. An edge committed after the finish's
	// snapshot is seen here (its transaction held KEY SHARE on the row, so
	// it committed before the finish could lock it).
	f.ended = `SELECT DISTINCT e.prereq FROM ` + s.edges + ` e JOIN ` + s.jobs + ` p ON p.id = e.prereq
WHERE e.prereq = ANY($1::uuid[]) AND p.state IN ('completed', 'failed', 'cancelled')`
	// Which of the leases not written are still held (the row was busy).
	f.held = `SELECT j.id FROM ` + s.jobs + ` j JOIN unnest($1::uuid[], $2::uuid[]) AS t(id, token) ON j.id = t.id
WHERE j.lease_token = t.token AND j.state = 'running'`

	// Lease renewal (extendStatement).
	f.extend = s.extendStatement(false)
	// The same, writing each job's latest progress ($4; NULL: unchanged)
	// with its renewal: only when a job reported progress since the last
	// renewal, so that the renewal of jobs that report none stays as it
	// was.
	f.extendProgress = s.extendStatement(true)

	// The expired-lease sweep: back to available keeping run_at (ahead of
	// jobs due later), failed once attempts are used up, cancelled when a
	// cancel was requested.
	sweep := func(filter string) string {
		msg := `CASE WHEN j.cancel_requested THEN 'cancelled by request; its last attempt ended with: ' ELSE '' END
			|| 'lease expired: worker ' || COALESCE(j.worker, '?') || ' stopped renewing it'`
		return `WITH expired AS (
	SELECT id FROM ` + s.jobs + ` WHERE state = 'running' AND lease_expires_at < now() ` + filter + `
	ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
), swept AS (
	UPDATE ` + s.jobs + ` j SET
		state = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'available' END,
		last_error = ` + msg + `,
		errors = ` + errorsAppend("j.attempt", msg, "'lease expired'") + `,
		lease_token = NULL, lease_expires_at = NULL, worker = NULL,
		finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END
	FROM expired WHERE j.id = expired.id
	RETURNING j.id, j.state, j.type, j.tags, j.run_at, j.notify_done
)
SELECT s.id, s.state, s.type, s.tags, s.run_at, greatest(0, ceil(extract(epoch FROM s.run_at - now()) * 1000))::bigint FROM swept s
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL FROM (SELECT pg_notify($2, ` + s.postingSQL("p_done => id") + `)
	FROM swept WHERE notify_done AND state <> 'available') w`
	}
	f.sweep = sweep("")
	f.sweepIDs = sweep("AND id = ANY($3::uuid[])")
	// When the earliest lease of a running job expires, in milliseconds
	// from now (<= 0: expired; NULL: nothing runs).
	f.nextExpiry = `SELECT ceil(extract(epoch FROM min(lease_expires_at) - now()) * 1000)::bigint FROM ` + s.jobs + ` WHERE state = 'running'`
	f.expired = `SELECT id FROM ` + s.jobs + ` WHERE state = 'running' AND lease_expires_at < now() ORDER BY id LIMIT $1`
	// A row the sweep could not write: failed, with the reason, carrying
	// none of its data.
	f.failExpired = `WITH x AS (
	SELECT id FROM ` + s.jobs + ` WHERE id = $1 AND state = 'running' AND lease_expires_at < now() FOR UPDATE
), u AS (
	UPDATE ` + s.jobs + ` j SET state = 'failed', last_error = $2, errors = ` + errorsAppend("j.attempt", "$2::text", "'lease expired'") + `,
		lease_token = NULL, lease_expires_at = NULL, worker = NULL, finished_at = now()
	FROM x WHERE j.id = x.id RETURNING j.id, j.notify_done
)
SELECT count(*), count(pg_notify($3, ` + s.postingSQL("p_done => id") + `)) FILTER (WHERE notify_done) FROM u`
}

// finishArrays are a batch of Finish as the statements' parameter arrays.
type finishArrays struct {
	ids, tokens uuidArray
	states      textArray
	delays      []int64
	deltas      []int32
	results     []json.RawMessage
	errs        []*string
	outcomes    []*string         // beside each error; nil when no job has one
	progress    []json.RawMessage // nil when no job has any
}

// finishArraysOf builds the arrays of fs; discard: completions marked
// Discard are sent as 'discarded' (finish() of migration 21).
func finishArraysOf(fs []Finish, discard bool) finishArrays {
	n := len(fs)
	a := finishArrays{ids: make(uuidArray, n), tokens: make(uuidArray, n), states: make(textArray, n),
		delays: make([]int64, n), deltas: make([]int32, n), results: make([]json.RawMessage, n), errs: make([]*string, n)}
	for i, f := range fs {
		a.ids[i], a.tokens[i], a.states[i] = f.ID, f.Token, f.State
		if discard && f.Discard && f.State == "completed" {
			a.states[i] = "discarded"
		}
		a.delays[i], a.deltas[i] = f.Delay.Milliseconds(), int32(f.AttemptDelta)
		if f.Delay < 0 {
			a.delays[i] = -1 // KeepRunAt
		}
		a.results[i], a.errs[i] = f.Result, f.Err
		if f.Err != nil && f.Outcome != "" {
			if a.outcomes == nil {
				a.outcomes = make([]*string, n)
			}
			o := f.Outcome
			a.outcomes[i] = &o
		}
		if f.Progress != nil {
			if a.progress == nil {
				a.progress = make([]json.RawMessage, n)
			}
			a.progress[i] = f.Progress
		}
	}
	return a
}

// Finish writes outcomes of jobs without dependents in one statement (the
// function finish() of migration 6; its attempts' outcomes as data since
// migration 25) in a transaction of its own: BEGIN and the statement in
// one round trip, COMMIT in a second (three round trips on a pool whose
// default query mode does not describe statements). Terminal outcomes
// move the job to job_history, retries are written in place. Each write
// is fenced by id, lease token and state running.
//
// A row held by another transaction is Busy: finish it again alone with
// FinishGraph and wait. A job that has dependents is left untouched and
// reported as Graph: finish it with FinishGraph, which releases its
// dependents in the same transaction. An error of the whole call may come
// from any row: the caller splits the batch to find it (internal/isolate).
func (s *Store) Finish(ctx context.Context, fs []Finish) (FinishResult, error) {
	n := len(fs)
	seen := make(map[uuid.UUID]bool, n)
	for _, f := range fs {
		if seen[f.ID] {
			// Each job's status is reported once: one batch, one outcome
			// a job (the caller keeps a second for the next batch).
			return FinishResult{}, fmt.Errorf("finish: job %s appears twice in one batch", f.ID)
		}
		seen[f.ID] = true
	}
	a := finishArraysOf(fs, true)
	exclude := [][16]byte{}
	for range n + 1 {
		res, graph, err := s.finishOnce(ctx, &a, exclude)
		if err != nil {
			return FinishResult{}, err
		}
		if len(graph) == 0 {
			if len(res.Status) != n {
				return FinishResult{}, fmt.Errorf("finish answered for %d of %d jobs", len(res.Status), n)
			}
			return res, nil
		}
		// Jobs that turned out to have dependents: the call was rolled
		// back; again without them.
		exclude = append(exclude, graph...)
	}
	return FinishResult{}, errors.New("finish: the jobs with dependents kept changing")
}

// finishOnce runs the finish function once, in a transaction of its own
// whose commit is resolved when its answer is lost (commitKnown). When it
// finds finished jobs with dependents it rolls back and returns them
// instead.
func (s *Store) finishOnce(ctx context.Context, a *finishArrays, exclude [][16]byte) (FinishResult, [][16]byte, error) {
	args := []any{a.ids, a.tokens, a.states, a.delays, a.deltas, a.results, a.errs,
		exclude, s.channel, s.keepCompleted.Milliseconds(), s.keepFailed.Milliseconds(), MaxErrors, a.progress, a.outcomes}
	var tx pgx.Tx
	var res FinishResult
	var xid int64
	var tl string
	var graph [][16]byte
	var err error
	if s.pipelines {
		// BEGIN and the finish in one round trip; COMMIT is sent once the
		// transaction's ID is known.
		b := &pgx.Batch{}
		b.BeginTx(readCommittedTx)
		b.Queue(s.fin.fast, args...)
		br := s.pool.SendBatch(ctx, b)
		tx = br.Tx()
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after the commit: does nothing
		res, xid, tl, graph, err = readFinish(br, len(a.ids))
		if cerr := br.Close(); err == nil && graph == nil {
			err = cerr
		}
	} else {
		// Modes that do not ask for parameter types run a batch without
		// them: three round trips.
		if tx, err = s.pool.BeginTx(ctx, readCommittedTx); err != nil {
			return FinishResult{}, nil, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after the commit: does nothing
		rows, qerr := tx.Query(ctx, s.fin.fast, append([]any{Mode}, args...)...)
		res, xid, tl, graph, err = readFinishRows(rows, qerr, len(a.ids))
	}
	if err != nil || graph != nil {
		return FinishResult{}, graph, err
	}
	return res, nil, s.commitKnown(ctx, tx, xid, tl)
}

// readFinish reads the finish's answer from a batch (its BEGIN, then the
// finish).
func readFinish(br pgx.BatchResults, n int) (FinishResult, int64, string, [][16]byte, error) {
	if _, err := br.Exec(); err != nil {
		return FinishResult{}, 0, "", nil, err
	}
	rows, err := br.Query()
	return readFinishRows(rows, err, n)
}

// readFinishRows reads the rows of the finish function: each job's
// status, the transaction's ID and timeline; graph: the finished jobs
// with dependents, when it refused for them (nothing was written).
func readFinishRows(rows pgx.Rows, err error, n int) (FinishResult, int64, string, [][16]byte, error) {
	res := FinishResult{Status: make(map[uuid.UUID]FinishStatus, n), State: make(map[uuid.UUID]string, n)}
	var (
		id        [16]byte
		state, tl internedText // the same few values on every row
		status    int16
		xid       int64
	)
	if err == nil { // else the error may be the function's (a batch's Query reports it)
		_, err = pgx.ForEachRow(rows, []any{&id, &state, &status, &xid, &tl}, func() error {
			switch status {
			case 0:
				res.Status[id], res.State[id] = Written, state.v
			case 1:
				res.Status[id] = Busy
			case 2:
				res.Status[id] = Refused
			case 3:
				res.Status[id] = Graph
			}
			return nil
		})
	}
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "BLGRF" {
		var graph [][16]byte
		for _, x := range strings.Split(pe.Detail, ",") {
			id, perr := uuid.Parse(x)
			if perr != nil {
				return FinishResult{}, 0, "", nil, fmt.Errorf("finish: reading the jobs with dependents: %w", perr)
			}
			graph = append(graph, id)
		}
		return FinishResult{}, 0, "", graph, nil
	}
	return res, xid, tl.v, nil, err
}

// FinishGraph writes outcomes in one transaction, in place (the retirer
// moves terminal rows to job_history later). Statement one writes every
// row it can lock at once (all of them when wait is set, waiting up to
// SlowLockTimeout); statement two, on a newer snapshot, finds which rows
// that ended have dependents, and those are released in the same
// transaction. Each write is fenced by id, lease token and state running.
//
// A row held by another transaction is Busy (only without wait): finish it
// again alone with wait. An error of the whole call may come from any row:
// the caller splits the batch to find it (internal/isolate).
func (s *Store) FinishGraph(ctx context.Context, fs []Finish, wait bool) (FinishResult, error) {
	// In ID order, like every other writer that locks several rows.
	fs = append([]Finish(nil), fs...)
	sort.Slice(fs, func(i, j int) bool { return bytes.Compare(fs[i].ID[:], fs[j].ID[:]) < 0 })
	n := len(fs)
	a := finishArraysOf(fs, false)
	stmt, timeout := s.fin.skip, FastLockTimeout
	if wait {
		stmt, timeout = s.fin.wait, SlowLockTimeout
	}
	var res FinishResult
	err := s.runGraphTx(ctx, timeout, func(tx pgx.Tx, plan *lockPlan) error {
		res = FinishResult{Status: make(map[uuid.UUID]FinishStatus, n), State: make(map[uuid.UUID]string, n)}
		rows, err := tx.Query(ctx, stmt, Mode, a.ids, a.tokens, a.states, a.delays, a.deltas, a.results, a.errs, s.channel, a.progress, a.outcomes)
		if err != nil {
			return err
		}
		var id *[16]byte
		var state *string
		if _, err := pgx.ForEachRow(rows, []any{&id, &state}, func() error {
			if id != nil {
				res.Status[*id], res.State[*id] = Written, *state
			}
			return nil
		}); err != nil {
			return err
		}
		// A newer snapshot: see the comment on finishSQL.ended.
		rows, err = tx.Query(ctx, s.fin.ended, Mode, a.ids)
		if err != nil {
			return err
		}
		frontier, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err
		}
		if len(frontier) > 0 {
			if res.Avail, err = s.release(ctx, tx, frontier, plan, !wait); err != nil {
				return err
			}
		}
		if len(res.Status) < n {
			return s.classifyUnwritten(ctx, tx, fs, &res, wait)
		}
		return nil
	})
	if err != nil {
		return FinishResult{}, err
	}
	return res, nil
}

// classifyUnwritten tells, for rows a Finish did not write, whether their
// lease is gone or their row was busy.
func (s *Store) classifyUnwritten(ctx context.Context, tx pgx.Tx, fs []Finish, res *FinishResult, wait bool) error {
	var ids, tokens []uuid.UUID
	for _, f := range fs {
		if _, ok := res.Status[f.ID]; !ok {
			ids, tokens = append(ids, f.ID), append(tokens, f.Token)
		}
	}
	rows, err := tx.Query(ctx, s.fin.held, Mode, ids16(ids), ids16(tokens))
	if err != nil {
		return err
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	for _, id := range ids {
		res.Status[id] = Refused
	}
	for _, id := range held {
		if wait {
			// Locked and written in one statement: a row still held
			// under our token cannot have been skipped.
			return fmt.Errorf("finish of job %s neither written nor refused", id)
		}
		res.Status[id] = Busy
	}
	return nil
}

// errBusy is what a fast-lane transaction returns when a row it must wait
// for is held by another transaction: the same SQLSTATE as a lock timeout,
// so callers treat both alike (pgerr.Busy).
var errBusy = &pgconn.PgError{Code: "55P03", Message: "a row the write needs is locked by another transaction"}

// Extended reports one lease a heartbeat found still held.
type Extended struct {
	ID              uuid.UUID
	CancelRequested bool
	// Renewed is false when the row was locked by another transaction
	// (being finished, typically): still held, but not renewed this time.
	Renewed bool
}

// Extend renews the leases given by ids and tokens to now() + lease, fenced
// like Finish. It returns the leases still held; the others are lost.
func (s *Store) Extend(ctx context.Context, ids, tokens []uuid.UUID, lease time.Duration) ([]Extended, error) {
	return s.ExtendWith(ctx, ids, tokens, nil, lease)
}

// ExtendWith is Extend writing, with each renewal, the job's progress[i]
// (nil: unchanged; progress nil: none).
func (s *Store) ExtendWith(ctx context.Context, ids, tokens []uuid.UUID, progress []json.RawMessage, lease time.Duration) ([]Extended, error) {
	var rows pgx.Rows
	var err error
	if progress == nil {
		rows, err = s.pool.Query(ctx, s.fin.extend, Mode, ids16(ids), ids16(tokens), lease.Milliseconds())
	} else {
		rows, err = s.pool.Query(ctx, s.fin.extendProgress, Mode, ids16(ids), ids16(tokens), lease.Milliseconds(), progress)
	}
	if err != nil {
		return nil, err
	}
	var out []Extended
	var id [16]byte
	var e Extended
	_, err = pgx.ForEachRow(rows, []any{&id, &e.CancelRequested, &e.Renewed}, func() error {
		e.ID = id
		out = append(out, e)
		return nil
	})
	return out, err
}
