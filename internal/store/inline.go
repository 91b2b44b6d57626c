package store

import (
	"context"
	"encoding/json"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Statements of the inline runs of package backlogtest (never on the
// path of Work).

// LockOthers locks, in tx, every other available job of type typ than id
// (FOR KEY SHARE, the weakest lock a claim's FOR UPDATE SKIP LOCKED skips),
// so that a claim of the type made meanwhile on another connection takes
// id if it takes anything.
func (s *Store) LockOthers(ctx context.Context, tx pgx.Tx, typ string, id uuid.UUID) error {
	_, err := tx.Exec(ctx, `SELECT 1 FROM `+s.jobs+` WHERE state = 'available' AND type = $1 AND id <> $2
FOR KEY SHARE SKIP LOCKED`, typ, id)
	return err
}

// MakeDue makes every scheduled job of the types whose tags are within
// tags due now (the promoter then makes them available).
func (s *Store) MakeDue(ctx context.Context, types []string, tags json.RawMessage) error {
	_, err := s.pool.Exec(ctx, `UPDATE `+s.jobs+` SET run_at = now()
WHERE state = 'scheduled' AND type = ANY($1) AND tags <@ $2::jsonb AND run_at > now()`, types, string(tags))
	return err
}

// Busy reports whether jobs of the types are running, or are available
// and due (but were not claimed: locked by another transaction or held
// back by a limit), their types not paused.
func (s *Store) Busy(ctx context.Context, types []string, tags json.RawMessage) (bool, error) {
	var busy bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.jobs+` WHERE state = 'running' AND type = ANY($1))
OR EXISTS (SELECT 1 FROM `+s.jobs+` j WHERE j.state = 'available' AND j.type = ANY($1) AND j.tags <@ $2::jsonb
	AND j.run_at <= now() AND NOT EXISTS (SELECT 1 FROM `+pgx.Identifier{s.schema, "paused_types"}.Sanitize()+` p WHERE p.type = j.type))`,
		types, string(tags)).Scan(&busy)
	return busy, err
}
