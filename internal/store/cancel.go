package store

import (
	"context"
	"errors"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// CancelOutcome is what Cancel did.
type CancelOutcome struct {
	State     string  // the job's state after the call
	Requested bool    // the job was running: its worker was asked to stop
	Avail     []Avail // jobs made available (chain successors spliced past it)
}

// errStateChanged restarts a Cancel whose job changed state between the
// read and the lock.
var errStateChanged = errors.New("job changed state")

// Cancel cancels a blocked or available job at once (cascading to its
// dependents), asks the worker of a running job to stop, and leaves a
// finished job alone. It locks in the order of graph.go: the job's
// ordering key, its live chain predecessors (KEY SHARE: they get its
// successors), then the job (FOR UPDATE).
func (s *Store) Cancel(ctx context.Context, id uuid.UUID) (CancelOutcome, error) {
	g := &s.graph
	var out CancelOutcome
	err := s.onJob(ctx, id, func(tx pgx.Tx, p *lockPlan, state, okey string) error {
		out = CancelOutcome{}
		switch state {
		case "blocked", "scheduled", "available":
			avail, err := s.cancelQueuedTx(ctx, tx, p, id, okey)
			out = CancelOutcome{State: "cancelled", Avail: avail}
			return err
		case "running":
			var n, notified int64
			if err := tx.QueryRow(ctx, g.requestCancel, Mode, id, s.channel).Scan(&n, &notified); err != nil {
				return err
			}
			if n == 0 {
				return errStateChanged
			}
			out = CancelOutcome{State: "running", Requested: true}
			return nil
		default:
			out = CancelOutcome{State: state}
			return nil
		}
	})
	return out, err
}

// onJob runs fn in a graph transaction (see graph.go) with the job's state
// and ordering key as read at its start, starting over when fn returns
// errStateChanged (the job changed between the read and fn's lock) or a
// restartError (fn needs locks taken first).
func (s *Store) onJob(ctx context.Context, id uuid.UUID, fn func(tx pgx.Tx, p *lockPlan, state, okey string) error) error {
	var plan lockPlan
	for range maxGraphRestarts {
		err := s.runGraphTxPlan(ctx, 0, plan, func(tx pgx.Tx, p *lockPlan) error {
			var state, okey string
			if err := tx.QueryRow(ctx, s.graph.read, Mode, id).Scan(&state, &okey); err != nil {
				if errors.Is(err, pgx.ErrNoRows) {
					return ErrNotFound
				}
				return err
			}
			return fn(tx, p, state, okey)
		})
		if errors.Is(err, errStateChanged) {
			continue
		}
		return err
	}
	return ErrGraphContention
}

// cancelQueuedTx cancels a blocked, scheduled or available job inside a
// graph transaction: in the lock order, its ordering key, its live chain
// predecessors (KEY SHARE: they get its successors), then the job (FOR
// UPDATE); its dependents are cancelled or released in the same
// transaction. It returns the jobs it made available.
func (s *Store) cancelQueuedTx(ctx context.Context, tx pgx.Tx, p *lockPlan, id uuid.UUID, okey string) ([]Avail, error) {
	g := &s.graph
	if okey != "" && !slices.Contains(p.keys, okey) {
		return nil, &restartError{keys: []string{okey}}
	}
	preds, err := s.chainPreds(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	var missing []uuid.UUID
	for _, pr := range preds {
		if !slices.Contains(p.rows, pr) {
			missing = append(missing, pr)
		}
	}
	if len(missing) > 0 {
		return nil, &restartError{rows: missing}
	}
	var state string
	if err := tx.QueryRow(ctx, g.lockOne, Mode, id).Scan(&state); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, errStateChanged // finished and retired meanwhile
		}
		return nil, err
	}
	if state != "blocked" && state != "scheduled" && state != "available" {
		return nil, errStateChanged
	}
	var n, notified int64
	if err := tx.QueryRow(ctx, g.cancelQueued, Mode, id, s.channel).Scan(&n, &notified); err != nil {
		return nil, err
	}
	return s.release(ctx, tx, []uuid.UUID{id}, p, false)
}

// chainPreds returns the live chain predecessors of a job.
func (s *Store) chainPreds(ctx context.Context, tx pgx.Tx, id uuid.UUID) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, s.graph.chainPreds, Mode, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// Waiting is what MarkWaiting found.
type Waiting struct {
	State string
	Avail *Avail // the job, when available: the mark locked it for an instant
}

// MarkWaiting asks for a completion notice of the job and returns its
// current state.
func (s *Store) MarkWaiting(ctx context.Context, id uuid.UUID) (Waiting, error) {
	var w Waiting
	var typ string
	var tags []byte
	err := s.pool.QueryRow(ctx, s.graph.markWaiting, Mode, id).Scan(&w.State, &typ, &tags)
	if errors.Is(err, pgx.ErrNoRows) {
		// Finished (and moved to job_history), or unknown.
		err = s.pool.QueryRow(ctx, s.graph.finishedState, Mode, id).Scan(&w.State)
		if errors.Is(err, pgx.ErrNoRows) {
			return w, ErrNotFound
		}
		return w, err
	}
	if err == nil && w.State == "available" {
		w.Avail = &Avail{Type: typ, Tags: tags}
	}
	return w, err
}
