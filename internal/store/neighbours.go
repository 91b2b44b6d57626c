package store

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Reading the graph around one job, for operators (Queue.Graph). Only
// pending edges exist (an edge is consumed when its prerequisite ends), so
// a job's prerequisites and dependents are the ones still waiting; all of
// them are live jobs, read from the hot table by the edges' indexes.

// Neighbour is a job next to another in the graph.
type Neighbour struct {
	ID    uuid.UUID
	Type  string
	State string
	Kind  string // "depends" or "order" (the edge's kind); empty in a chain
}

// Neighbourhood is what Graph reads around a job.
type Neighbourhood struct {
	OrderingKey, UniqueKey string
	Prereqs, Dependents    []Neighbour
	Chain                  []Neighbour // live jobs of the ordering key, oldest first
}

// Graph reads the keys, pending prerequisites and dependents of a job (at
// most limit of each), and the live jobs of its ordering key (at most
// limit), or returns ErrNotFound.
func (s *Store) Graph(ctx context.Context, id uuid.UUID, limit int) (Neighbourhood, error) {
	var n Neighbourhood
	var okey, ukey *string
	err := s.pool.QueryRow(ctx, `SELECT ordering_key, unique_key FROM `+s.jobs+` WHERE id = $1
UNION ALL
SELECT ordering_key, unique_key FROM `+s.history+` WHERE id = $1
LIMIT 1`, Mode, id).Scan(&okey, &ukey)
	if errors.Is(err, pgx.ErrNoRows) {
		return n, ErrNotFound
	}
	if err != nil {
		return n, err
	}
	if okey != nil {
		n.OrderingKey = *okey
	}
	if ukey != nil {
		n.UniqueKey = *ukey
	}
	read := func(sql string, args ...any) ([]Neighbour, error) {
		rows, err := s.pool.Query(ctx, sql, append([]any{Mode}, args...)...)
		if err != nil {
			return nil, err
		}
		var out []Neighbour
		var nb Neighbour
		_, err = pgx.ForEachRow(rows, []any{&nb.ID, &nb.Type, &nb.State, &nb.Kind}, func() error {
			out = append(out, nb)
			return nil
		})
		return out, err
	}
	if n.Prereqs, err = read(`SELECT j.id, j.type, j.state, e.kind FROM `+s.edges+` e JOIN `+s.jobs+` j ON j.id = e.prereq
WHERE e.job = $1 ORDER BY j.id, e.kind LIMIT $2`, id, limit); err != nil {
		return n, err
	}
	if n.Dependents, err = read(`SELECT j.id, j.type, j.state, e.kind FROM `+s.edges+` e JOIN `+s.jobs+` j ON j.id = e.job
WHERE e.prereq = $1 ORDER BY j.id, e.kind LIMIT $2`, id, limit); err != nil {
		return n, err
	}
	if n.OrderingKey != "" {
		if n.Chain, err = read(`SELECT id, type, state, '' FROM `+s.jobs+`
WHERE ordering_key = $1 AND state IN ('blocked', 'scheduled', 'available', 'running')
ORDER BY id LIMIT $2`, n.OrderingKey, limit); err != nil {
			return n, err
		}
	}
	return n, nil
}
