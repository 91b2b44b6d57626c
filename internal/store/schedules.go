package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Registered periodic schedules (migration 8), so that any process can
// list them with their last and next plans.

type schedSQL struct {
	register, confirm, list string
}

func (s *Store) buildSchedules() {
	q := &s.sched
	t := pgx.Identifier{s.schema, "schedules"}.Sanitize()
	runsT := pgx.Identifier{s.schema, "periodic_runs"}.Sanitize()
	// Rows go in sorted by name, so that processes registering the same
	// schedules at once lock them in one order.
	q.register = `INSERT INTO ` + t + ` AS s (name, kind, spec, type, args, tags, options, registered_by)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[], $7::jsonb[], $8::text[])
ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, spec = EXCLUDED.spec, type = EXCLUDED.type, args = EXCLUDED.args,
	tags = EXCLUDED.tags, options = EXCLUDED.options, registered_by = EXCLUDED.registered_by, registered_at = now(),
	updated_at = CASE WHEN (s.kind, s.spec, s.type, s.args, s.tags, s.options)
	                       IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.spec, EXCLUDED.type, EXCLUDED.args, EXCLUDED.tags, EXCLUDED.options)
	                  THEN now() ELSE s.updated_at END`
	q.confirm = `UPDATE ` + t + ` s SET registered_at = now()
FROM (SELECT name FROM ` + t + ` WHERE name = ANY($1::text[]) ORDER BY name FOR NO KEY UPDATE) l
WHERE s.name = l.name
RETURNING s.name`
	q.list = `SELECT s.name, s.kind, s.spec, s.type, s.args, s.tags, s.options, s.registered_by, s.created_at, s.updated_at,
       s.registered_at, r.plan_time, r.job_id, now()
FROM ` + t + ` s
LEFT JOIN LATERAL (SELECT plan_time, job_id FROM ` + runsT + ` r WHERE r.name = s.name ORDER BY plan_time DESC LIMIT 1) r ON true
ORDER BY s.name`
}

// Schedule is a schedule's definition.
type Schedule struct {
	Name, Kind, Spec, Type string
	Args, Tags, Options    json.RawMessage
	RegisteredBy           string
}

// RegisterSchedules writes the definitions of ss (one row per name; the
// last of a name wins).
func (s *Store) RegisterSchedules(ctx context.Context, ss []Schedule) error {
	byName := map[string]Schedule{}
	for _, sc := range ss {
		byName[sc.Name] = sc
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	n := len(names)
	kinds, specs, types, by := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	args, tags, opts := make([]json.RawMessage, n), make([]json.RawMessage, n), make([]json.RawMessage, n)
	for i, name := range names {
		sc := byName[name]
		kinds[i], specs[i], types[i], by[i] = sc.Kind, sc.Spec, sc.Type, sc.RegisteredBy
		args[i], tags[i], opts[i] = sc.Args, sc.Tags, sc.Options
	}
	_, err := s.pool.Exec(ctx, s.sched.register, Mode, names, kinds, specs, types, args, tags, opts, by)
	return err
}

// ConfirmSchedules records that the named schedules are still registered,
// and returns the names that have no row (deleted meanwhile).
func (s *Store) ConfirmSchedules(ctx context.Context, names []string) (missing []string, err error) {
	rows, err := s.pool.Query(ctx, s.sched.confirm, Mode, names)
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	have := make(map[string]bool, len(found))
	for _, n := range found {
		have[n] = true
	}
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	return missing, nil
}

// ScheduleRow is a stored schedule with its latest recorded plan.
type ScheduleRow struct {
	Schedule
	CreatedAt, UpdatedAt, RegisteredAt time.Time
	LastPlan                           *time.Time // nil: no plan recorded
	LastJobID                          uuid.UUID
}

// Schedules lists the stored schedules by name, and the database's now().
func (s *Store) Schedules(ctx context.Context) ([]ScheduleRow, time.Time, error) {
	rows, err := s.pool.Query(ctx, s.sched.list, Mode)
	if err != nil {
		return nil, time.Time{}, err
	}
	var out []ScheduleRow
	var now time.Time
	var r ScheduleRow
	var args, tags, opts []byte
	var job *[16]byte
	_, err = pgx.ForEachRow(rows, []any{&r.Name, &r.Kind, &r.Spec, &r.Type, &args, &tags, &opts, &r.RegisteredBy,
		&r.CreatedAt, &r.UpdatedAt, &r.RegisteredAt, &r.LastPlan, &job, &now}, func() error {
		row := r
		// The buffers are reused by the next row.
		row.Args = append(json.RawMessage(nil), args...)
		row.Tags = append(json.RawMessage(nil), tags...)
		row.Options = append(json.RawMessage(nil), opts...)
		if job != nil {
			row.LastJobID = *job
		}
		out = append(out, row)
		r.LastPlan, job = nil, nil // else the next row's scan may write into them
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("reading schedules: %w", err)
	}
	if len(out) == 0 {
		// No row carried the clock; the caller needs none.
		return nil, time.Time{}, nil
	}
	return out, now, nil
}
