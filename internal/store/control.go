package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/pgerr"
)

// Operator writes on single jobs (Retry, Delete) and on batches of them
// (RetryBatch, CancelBatch, DeleteBatch). Each runs in a graph transaction
// (graph.go's lock order: ordering key, upstream rows, the job) and is
// fenced by the job's state, so a worker finishing the job at the same
// moment either goes first (and the operation sees the finished job) or
// waits for it. The batch forms take the jobs a single statement can
// handle alone (no ordering key, no unique key, no dependents; for a
// retry, no prerequisites) and leave the others, which the caller hands
// to the single forms.

// Errors of the operator writes.
var (
	ErrRunning       = errors.New("the job is running")
	ErrBlocked       = errors.New("the job waits for its prerequisites")
	ErrUniqueKeyHeld = errors.New("another live job holds the job's unique key")
)

type controlSQL struct {
	deleteLive, deleteFinished, retryQueued, retryInPlace, retryFinished string
	retryBatch, retryBatchFailed, cancelBatch                            string
	deleteBatchFinished, deleteBatchFailed, deleteBatchLive              string
}

func (s *Store) buildControl() {
	c := &s.control
	c.deleteLive = `DELETE FROM ` + s.jobs + ` WHERE id = $1`
	c.deleteFinished = `DELETE FROM ` + s.history + ` WHERE id = $1`
	c.retryQueued = `UPDATE ` + s.jobs + ` SET state = 'available', run_at = now() WHERE id = $1 AND state IN ('available', 'scheduled')`
	// A finished job runs again: attempts kept (one more granted when they
	// are used up), its errors kept, its result cleared.
	c.retryInPlace = `UPDATE ` + s.jobs + ` SET state = $2, run_at = now(), blocked_by = $3, finished_at = NULL,
	cancel_requested = false, notify_done = false, result = NULL, max_attempts = greatest(max_attempts, attempt + 1)
WHERE id = $1 AND state IN ('completed', 'failed', 'cancelled')`
	cols := `id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker, ordering_key,
	unique_key, blocked_by, last_error, errors, created_at, started_at, concurrency_key, meta, prereqs`
	back := `SELECT id, type, args, tags, %s, priority, now(), attempt, greatest(max_attempts, attempt + 1), timeout_ms,
	worker, ordering_key, unique_key, %s, last_error, errors, created_at, started_at, concurrency_key, meta, prereqs`
	c.retryFinished = `WITH h AS (DELETE FROM ` + s.history + ` WHERE id = $1 RETURNING *)
INSERT INTO ` + s.jobs + ` (` + cols + `) ` + fmt.Sprintf(back, "$2", "$3") + ` FROM h RETURNING id`
	// Batches of finished jobs are found by finish time, the IDs only
	// filter: a BRIN index answers "id = ANY(500 IDs)" with one scan of
	// the whole index per ID (1.4 s at 1M rows), while the page's finish
	// time range is one scan, of the rows the page's List read anyway. A
	// batch of failed and cancelled jobs reads the partial index of those.
	inRange := func(states string) string {
		return `finished_at BETWEEN $2 AND $3` + states + ` AND (id = ANY($1::uuid[])) IS TRUE`
	}
	const failed = ` AND state IN ('failed', 'cancelled')`
	// Jobs with prerequisites (listed, named by the reason of a cascade, or
	// with an edge still pointing at them) go through Retry one by one:
	// they may have to wait.
	retry := func(where string) string {
		return `WITH h AS (
	DELETE FROM ` + s.history + ` hj WHERE ` + where + ` AND ordering_key IS NULL AND unique_key IS NULL
	  AND prereqs IS NULL AND (last_error LIKE 'cancelled: prerequisite %') IS NOT TRUE
	  AND NOT EXISTS (SELECT 1 FROM ` + s.edges + ` e WHERE e.job = hj.id)
	RETURNING *
)
INSERT INTO ` + s.jobs + ` (` + cols + `) ` + fmt.Sprintf(back, "'available'", "0") + ` FROM h RETURNING id, type, tags`
	}
	c.retryBatch, c.retryBatchFailed = retry(inRange("")), retry(inRange(failed))
	// Queued jobs without dependents, ordering key or other holder;
	// completion notices for waiters.
	c.cancelBatch = `WITH l AS (
	SELECT j.id FROM ` + s.jobs + ` j WHERE j.id = ANY($1::uuid[]) AND j.state IN ('scheduled', 'available')
	  AND j.ordering_key IS NULL AND NOT EXISTS (SELECT 1 FROM ` + s.edges + ` e WHERE e.prereq = j.id)
	ORDER BY j.id FOR UPDATE SKIP LOCKED
), c AS (
	UPDATE ` + s.jobs + ` j SET state = 'cancelled', finished_at = now(), last_error = 'cancelled by request'
	FROM l WHERE j.id = l.id RETURNING j.id, j.notify_done
)
SELECT c.id, (SELECT count(pg_notify($2, ` + s.postingSQL("p_done => x.id") + `)) FROM c x WHERE x.notify_done) FROM c`
	c.deleteBatchFinished = `DELETE FROM ` + s.history + ` WHERE ` + inRange("") + ` RETURNING id`
	c.deleteBatchFailed = `DELETE FROM ` + s.history + ` WHERE ` + inRange(failed) + ` RETURNING id`
	c.deleteBatchLive = `DELETE FROM ` + s.jobs + ` j WHERE j.id IN (
	SELECT f.id FROM ` + s.jobs + ` f WHERE f.id = ANY($1::uuid[])
	  AND f.state IN ('scheduled', 'available', 'completed', 'failed', 'cancelled')
	  AND f.ordering_key IS NULL AND NOT EXISTS (SELECT 1 FROM ` + s.edges + ` e WHERE e.prereq = f.id)
	ORDER BY f.id FOR UPDATE SKIP LOCKED) RETURNING j.id`
}

// ControlOutcome is what an operator write did.
type ControlOutcome struct {
	State string  // the job's state after the call (Delete: before it)
	Avail []Avail // jobs made available (to announce)
}

// Delete removes a job that is not running. A queued job is cancelled
// first, as Cancel does (its dependents are cancelled, its ordering chain
// spliced), then removed.
func (s *Store) Delete(ctx context.Context, id uuid.UUID) (ControlOutcome, error) {
	var out ControlOutcome
	err := s.onJob(ctx, id, func(tx pgx.Tx, p *lockPlan, state, okey string) error {
		out = ControlOutcome{State: state}
		switch state {
		case "running":
			return ErrRunning
		case "blocked", "scheduled", "available":
			avail, err := s.cancelQueuedTx(ctx, tx, p, id, okey)
			if err != nil {
				return err
			}
			out.Avail = avail
		}
		tag, err := tx.Exec(ctx, s.control.deleteLive, Mode, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			tag, err = tx.Exec(ctx, s.control.deleteFinished, Mode, id)
			if err != nil {
				return err
			}
		}
		if tag.RowsAffected() == 0 {
			return errStateChanged
		}
		return nil
	})
	return out, err
}

// Retry makes a finished job available now, or blocked when it must
// wait (retry.go): for its prerequisites that are live again (retried
// themselves), and behind the tail of its ordering key's chain when that
// has live jobs. Its attempts and errors are kept, one more attempt is
// granted when they are used up, its result is cleared. A scheduled or
// available job is made due now. A prerequisite that failed or was
// cancelled refuses the retry with a *PrerequisiteError. Dependents that
// the job's failure cancelled stay cancelled.
func (s *Store) Retry(ctx context.Context, id uuid.UUID) (ControlOutcome, error) {
	g := &s.graph
	var out ControlOutcome
	err := s.onJob(ctx, id, func(tx pgx.Tx, p *lockPlan, state, okey string) error {
		out = ControlOutcome{}
		switch state {
		case "running":
			return ErrRunning
		case "blocked":
			return ErrBlocked
		case "scheduled", "available":
			tag, err := tx.Exec(ctx, s.control.retryQueued, Mode, id)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errStateChanged
			}
			out.State = "available"
			return nil
		}
		// Finished: the key first, then the upstream rows, then the job.
		if okey != "" && !containsKey(p.keys, okey) {
			return &restartError{keys: []string{okey}}
		}
		rp, err := s.planRetry(ctx, tx, id, okey)
		if err != nil {
			return err
		}
		state, blocked := "available", len(rp.edges)
		if blocked > 0 {
			state = "blocked"
		}
		tag, err := tx.Exec(ctx, s.control.retryInPlace, Mode, id, state, blocked)
		if err == nil && tag.RowsAffected() == 0 {
			tag, err = tx.Exec(ctx, s.control.retryFinished, Mode, id, state, blocked)
		}
		if pgerr.DuplicateKey(err, "jobs_unique_key_idx") {
			return ErrUniqueKeyHeld
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errStateChanged
		}
		if blocked > 0 {
			var ps, js []uuid.UUID
			var ks []string
			for _, e := range rp.edges {
				ps, js, ks = append(ps, e.prereq), append(js, id), append(ks, e.kind)
			}
			if _, err := tx.Exec(ctx, g.edges, Mode, ps, js, ks); err != nil {
				return err
			}
		}
		if len(rp.done) > 0 {
			// Given their results again (planRetry kept them: the
			// release that did it once may be long gone, and with it
			// the kept copy), and listing them.
			if err := s.listInputs(ctx, tx, id, rp.done); err != nil {
				return fmt.Errorf("listing prerequisites: %w", err)
			}
		}
		out.State, out.Avail = state, rp.locked
		return nil
	})
	if err == nil && out.State == "available" {
		var a Avail
		if qerr := s.pool.QueryRow(ctx, `SELECT type, tags FROM `+s.jobs+` WHERE id = $1`, Mode, id).Scan(&a.Type, &a.Tags); qerr == nil {
			out.Avail = append(out.Avail, a)
		}
	}
	return out, err
}

func containsKey(keys []string, k string) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// BatchOutcome is what a batch write did: the jobs it handled, and the
// jobs it made available.
type BatchOutcome struct {
	Done  []uuid.UUID
	Avail []Avail
}

// Batch is a page of jobs for a batch write: their IDs and, for finished
// ones, the range of their finish times (the index that finds them).
type Batch struct {
	IDs []uuid.UUID
	// From and To bound the finish times of the finished jobs among IDs.
	From, To time.Time
	// FailedOnly says every finished job among IDs failed or was
	// cancelled.
	FailedOnly bool
}

// Add puts a job in the batch.
func (b *Batch) Add(id uuid.UUID, finished *time.Time, state string) {
	b.IDs = append(b.IDs, id)
	if finished == nil {
		return
	}
	if b.From.IsZero() {
		b.From, b.To, b.FailedOnly = *finished, *finished, true
	}
	if finished.Before(b.From) {
		b.From = *finished
	}
	if finished.After(b.To) {
		b.To = *finished
	}
	if state != "failed" && state != "cancelled" {
		b.FailedOnly = false
	}
}

// finished picks the statement for the batch's finished jobs.
func (b *Batch) finished(all, failed string) string {
	if b.FailedOnly {
		return failed
	}
	return all
}

// RetryBatch makes the finished jobs of b that have neither ordering key,
// unique key nor prerequisites available now, in one statement.
func (s *Store) RetryBatch(ctx context.Context, b Batch) (BatchOutcome, error) {
	var out BatchOutcome
	if b.From.IsZero() {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, b.finished(s.control.retryBatch, s.control.retryBatchFailed), Mode, ids16(b.IDs), b.From, b.To)
	if err != nil {
		return out, err
	}
	var id [16]byte
	var a Avail
	_, err = pgx.ForEachRow(rows, []any{&id, &a.Type, &a.Tags}, func() error {
		out.Done = append(out.Done, id)
		out.Avail = append(out.Avail, Avail{Type: a.Type, Tags: append([]byte(nil), a.Tags...)})
		return nil
	})
	return out, err
}

// CancelBatch cancels the queued jobs of b that have no ordering key and
// no dependents, in one statement (the retirer moves them to
// job_history).
func (s *Store) CancelBatch(ctx context.Context, b Batch) (BatchOutcome, error) {
	var out BatchOutcome
	rows, err := s.pool.Query(ctx, s.control.cancelBatch, Mode, ids16(b.IDs), s.channel)
	if err != nil {
		return out, err
	}
	var id [16]byte
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out.Done = append(out.Done, id)
		return nil
	})
	return out, err
}

// DeleteBatch deletes the finished jobs of b, and the queued ones that
// have no ordering key and no dependents.
func (s *Store) DeleteBatch(ctx context.Context, b Batch) (BatchOutcome, error) {
	var out BatchOutcome
	collect := func(q string, args ...any) error {
		rows, err := s.pool.Query(ctx, q, append([]any{Mode, ids16(b.IDs)}, args...)...)
		if err != nil {
			return err
		}
		done, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		out.Done = append(out.Done, done...)
		return err
	}
	if !b.From.IsZero() {
		if err := collect(b.finished(s.control.deleteBatchFinished, s.control.deleteBatchFailed), b.From, b.To); err != nil {
			return out, err
		}
	}
	return out, collect(s.control.deleteBatchLive)
}
