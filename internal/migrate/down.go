package migrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Down reverts up to n of the schema's applied migrations, newest first,
// each in its own transaction (under the advisory lock Up takes) that runs
// the migration's down SQL and sets schema_migrations to the previous
// known version, as golang-migrate does: the table is left empty once
// every migration is reverted. It returns the versions it reverted, in the
// order it reverted them; on error, those reverted before it.
func Down(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration, n int) ([]int64, error) {
	var done []int64
	for len(done) < n {
		v, ok, err := downOne(ctx, pool, schema, ms)
		if err != nil {
			return done, err
		}
		if !ok {
			break
		}
		done = append(done, v)
	}
	return done, nil
}

// downOne reverts the newest applied migration; false when none is.
func downOne(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration) (int64, bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('backlog.migrate'), hashtext($1))`, schema); err != nil {
		return 0, false, fmt.Errorf("migrate: advisory lock: %w", err)
	}
	current, dirty, err := state(ctx, tx, schema)
	switch {
	case err != nil:
		return 0, false, err
	case dirty:
		return 0, false, fmt.Errorf("migrate: schema %s is marked dirty at version %d (a migration failed half-way under another tool); fix it by hand", schema, current)
	case current == 0:
		return 0, false, nil
	}
	i := -1
	for j, m := range ms {
		if m.Version == current {
			i = j
		}
	}
	if i < 0 {
		return 0, false, fmt.Errorf("migrate: schema %s is at version %d, which this version of backlog does not know (a newer release migrated it?)", schema, current)
	}
	m := ms[i]
	if !m.HasDown {
		return 0, false, fmt.Errorf("migrate: migration %d_%s has no down migration", m.Version, m.Name)
	}
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, q); err != nil {
		return 0, false, fmt.Errorf("migrate: search_path: %w", err)
	}
	if _, err := tx.Exec(ctx, m.Down); err != nil {
		return 0, false, fmt.Errorf("migrate: reverting %d_%s: %w", m.Version, m.Name, err)
	}
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	if _, err := tx.Exec(ctx, `DELETE FROM `+table); err != nil {
		return 0, false, fmt.Errorf("migrate: writing version: %w", err)
	}
	if i > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (version, dirty) VALUES ($1, false)`, ms[i-1].Version); err != nil {
			return 0, false, fmt.Errorf("migrate: writing version: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("migrate: commit: %w", err)
	}
	return m.Version, true, nil
}

// State returns the schema's version and dirty flag as schema_migrations
// holds them: version 0 when the schema, the table or its row is missing.
func State(ctx context.Context, pool *pgxpool.Pool, schema string) (version int64, dirty bool, err error) {
	return state(ctx, pool, schema)
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func state(ctx context.Context, db querier, schema string) (int64, bool, error) {
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return 0, false, fmt.Errorf("migrate: reading version: %w", err)
	}
	if !exists {
		return 0, false, nil
	}
	var v int64
	var dirty bool
	err := db.QueryRow(ctx, `SELECT version, dirty FROM `+table+` LIMIT 1`).Scan(&v, &dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("migrate: reading version: %w", err)
	}
	return v, dirty, nil
}
