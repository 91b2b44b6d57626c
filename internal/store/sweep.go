package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/isolate"
	"github.com/backlogq/backlog/internal/pgerr"
)

// SweepResult is what one sweep call did.
type SweepResult struct {
	Swept    int     // jobs whose expired lease was ended
	Poisoned int     // of those, jobs failed because their row could not be swept
	Avail    []Avail // jobs made available again (to announce)
	// Types of the jobs swept, each once: a job that stopped running
	// freed a slot of its type's concurrency limit, if it has one.
	Types []string
}

// SweepExpired ends up to limit expired leases: the jobs go back to
// available, keeping their run_at so they go ahead of jobs due later (or to
// failed when their attempts are used up, cancelled when a cancel was
// requested), and dependents of those that ended are released in the same
// transaction.
//
// One bad row never stops the sweep: when the batch fails for a reason
// other than a transient one, the expired jobs are swept in halves until
// the offending row is alone, and that job is failed with the reason. A job
// whose dependents another transaction holds is left for a later pass.
func (s *Store) SweepExpired(ctx context.Context, limit int) (SweepResult, error) {
	var res SweepResult
	// Usually nothing has expired: one statement, no transaction.
	if in, ok, err := s.NextExpiry(ctx); err != nil || !ok || in > 0 {
		return res, err
	}
	err := s.sweepTx(ctx, nil, limit, false, &res)
	if err == nil || ctx.Err() != nil || pgerr.Transient(err) {
		return res, err
	}
	rows, qerr := s.pool.Query(ctx, s.fin.expired, Mode, limit)
	if qerr != nil {
		return res, fmt.Errorf("%w; listing expired leases: %w", err, qerr)
	}
	ids, qerr := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if qerr != nil {
		return res, fmt.Errorf("%w; listing expired leases: %w", err, qerr)
	}
	var busy []uuid.UUID
	w := isolate.Writer[uuid.UUID]{
		Write: func(ctx context.Context, ids []uuid.UUID) error { return s.sweepTx(ctx, ids, len(ids), false, &res) },
		Busy:  func(id uuid.UUID) { busy = append(busy, id) },
		Poison: func(ctx context.Context, id uuid.UUID, cause error) error {
			return s.failExpired(ctx, id, fmt.Sprintf("lease expired, and sweeping the job failed: %v", cause), &res)
		},
	}
	if _, err := w.Run(ctx, ids); err != nil {
		return res, err
	}
	for _, id := range busy {
		// Wait for the other transaction, a little; else the next pass.
		_ = s.sweepTx(ctx, []uuid.UUID{id}, 1, true, &res)
	}
	return res, nil
}

// sweepTx sweeps up to limit expired leases (of ids only, when given) in
// one transaction with the release of their dependents.
func (s *Store) sweepTx(ctx context.Context, ids []uuid.UUID, limit int, wait bool, out *SweepResult) error {
	timeout := FastLockTimeout
	if wait {
		timeout = SlowLockTimeout
	}
	var res SweepResult
	err := s.runGraphTx(ctx, timeout, func(tx pgx.Tx, plan *lockPlan) error {
		res = SweepResult{}
		var rows pgx.Rows
		var err error
		if ids == nil {
			rows, err = tx.Query(ctx, s.fin.sweep, Mode, limit, s.channel)
		} else {
			rows, err = tx.Query(ctx, s.fin.sweepIDs, Mode, limit, s.channel, ids16(ids))
		}
		if err != nil {
			return err
		}
		var (
			ended []uuid.UUID
			id    *[16]byte
			state *string
			typ   *string
			tags  []byte
			runAt *time.Time
			inMS  *int64
		)
		if _, err := pgx.ForEachRow(rows, []any{&id, &state, &typ, &tags, &runAt, &inMS}, func() error {
			if id == nil {
				return nil
			}
			res.Swept++
			if !slices.Contains(res.Types, *typ) {
				res.Types = append(res.Types, *typ)
			}
			if *state == "available" {
				res.Avail = append(res.Avail, Avail{Type: *typ, Tags: slices.Clone(tags), RunAt: *runAt, In: time.Duration(*inMS) * time.Millisecond})
			} else {
				ended = append(ended, *id)
			}
			return nil
		}); err != nil {
			return err
		}
		return s.releaseEnded(ctx, tx, ended, plan, !wait, &res.Avail)
	})
	if err != nil {
		return err
	}
	out.Swept += res.Swept
	out.Avail = append(out.Avail, res.Avail...)
	for _, t := range res.Types {
		if !slices.Contains(out.Types, t) {
			out.Types = append(out.Types, t)
		}
	}
	return nil
}

// releaseEnded releases the dependents of jobs that just ended in tx.
func (s *Store) releaseEnded(ctx context.Context, tx pgx.Tx, ended []uuid.UUID, plan *lockPlan, skip bool, avail *[]Avail) error {
	if len(ended) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.fin.ended, Mode, ids16(ended))
	if err != nil {
		return err
	}
	frontier, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(frontier) == 0 {
		return err
	}
	a, err := s.release(ctx, tx, frontier, plan, skip)
	*avail = append(*avail, a...)
	return err
}

// failExpired fails one expired job that could not be swept, with reason.
func (s *Store) failExpired(ctx context.Context, id uuid.UUID, reason string, out *SweepResult) error {
	var res SweepResult
	err := s.runGraphTx(ctx, SlowLockTimeout, func(tx pgx.Tx, plan *lockPlan) error {
		res = SweepResult{}
		var n, notified int64
		if err := tx.QueryRow(ctx, s.fin.failExpired, Mode, id, reason, s.channel).Scan(&n, &notified); err != nil {
			return err
		}
		if n == 0 {
			return nil // renewed or swept meanwhile
		}
		res.Swept, res.Poisoned = 1, 1
		return s.releaseEnded(ctx, tx, []uuid.UUID{id}, plan, false, &res.Avail)
	})
	if err != nil {
		return err
	}
	out.Swept += res.Swept
	out.Poisoned += res.Poisoned
	out.Avail = append(out.Avail, res.Avail...)
	return nil
}

// NextExpiry returns how long until the earliest lease of a running job
// expires (<= 0: one has expired), and false when no job is running.
func (s *Store) NextExpiry(ctx context.Context) (time.Duration, bool, error) {
	var ms *int64
	if err := s.pool.QueryRow(ctx, s.fin.nextExpiry, Mode).Scan(&ms); err != nil || ms == nil {
		return 0, false, err
	}
	return time.Duration(*ms) * time.Millisecond, true, nil
}
