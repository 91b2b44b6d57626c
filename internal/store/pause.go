package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Paused is one paused job type.
type Paused struct {
	Type     string
	PausedAt time.Time
}

func (s *Store) pausedTable() string { return pgx.Identifier{s.schema, "paused_types"}.Sanitize() }

// Pause marks types paused (the claim function skips them) and returns
// those that were not paused yet, which it records under a new flow epoch
// (FlowChanges).
func (s *Store) Pause(ctx context.Context, types []string) (paused []string, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, readCommitted, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `INSERT INTO `+s.pausedTable()+` (type) SELECT DISTINCT unnest($1::text[])
ON CONFLICT (type) DO NOTHING RETURNING type`, Mode, types)
		if err != nil {
			return err
		}
		if paused, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(paused) == 0 {
			return err
		}
		return s.bumpFlow(ctx, tx, paused)
	})
	return paused, err
}

// Resume unpauses types and returns those that were paused.
func (s *Store) Resume(ctx context.Context, types []string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `DELETE FROM `+s.pausedTable()+` WHERE type = ANY($1::text[]) RETURNING type`, Mode, types)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// PausedTypes lists the paused types, by type.
func (s *Store) PausedTypes(ctx context.Context) ([]Paused, error) {
	rows, err := s.pool.Query(ctx, `SELECT type, paused_at FROM `+s.pausedTable()+` ORDER BY type`, Mode)
	if err != nil {
		return nil, err
	}
	var out []Paused
	var p Paused
	_, err = pgx.ForEachRow(rows, []any{&p.Type, &p.PausedAt}, func() error {
		out = append(out, p)
		return nil
	})
	return out, err
}
