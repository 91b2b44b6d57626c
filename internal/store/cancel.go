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
	var plan lockPlan
	for range maxGraphRestarts {
		err := s.runGraphTxPlan(ctx, 0, plan, func(tx pgx.Tx, p *lockPlan) error {
			out = CancelOutcome{}
			var state, okey string
			if err := tx.QueryRow(ctx, g.read, Mode, id).Scan(&state, &okey); err != nil {
				if errors.Is(err, pgx.ErrNoRows) {
					return ErrNotFound
				}
				return err
			}
			switch state {
			case "blocked", "scheduled", "available":
				if okey != "" && !slices.Contains(p.keys, okey) {
					return &restartError{keys: []string{okey}}
				}
				preds, err := s.chainPreds(ctx, tx, id)
				if err != nil {
					return err
				}
				var missing []uuid.UUID
				for _, pr := range preds {
					if !slices.Contains(p.rows, pr) {
						missing = append(missing, pr)
					}
				}
				if len(missing) > 0 {
					return &restartError{rows: missing}
				}
				if err := tx.QueryRow(ctx, g.lockOne, Mode, id).Scan(&state); err != nil {
					if errors.Is(err, pgx.ErrNoRows) {
						return errStateChanged // finished and retired meanwhile
					}
					return err
				}
				if state != "blocked" && state != "scheduled" && state != "available" {
					return errStateChanged
				}
				var n, notified int64
				if err := tx.QueryRow(ctx, g.cancelQueued, Mode, id, s.channel).Scan(&n, &notified); err != nil {
					return err
				}
				out.State = "cancelled"
				out.Avail, err = s.release(ctx, tx, []uuid.UUID{id}, p, false)
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
		if errors.Is(err, errStateChanged) {
			continue
		}
		return out, err
	}
	return out, ErrGraphContention
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
