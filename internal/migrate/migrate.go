// Package migrate applies backlog's embedded SQL migrations to one schema.
//
// It keeps its version in a golang-migrate compatible table
// (schema_migrations: one row, version and dirty), so a schema managed by
// Migrate can later be managed by golang-migrate and the other way round.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migration is one versioned migration: its up SQL and, when a
// NNNN_name.down.sql file exists, its down SQL.
type Migration struct {
	Version int64
	Name    string
	SQL     string
	Down    string
	HasDown bool
}

// Load reads the NNNN_name.up.sql files of fsys and their .down.sql
// counterparts, sorted by version.
func Load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	var out []Migration
	seen := map[int64]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		num, rest, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name must be NNNN_name.up.sql", name)
		}
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: bad version %q", name, num)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %q and %q share version %d", prev, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("reading migration %q: %w", name, err)
		}
		m := Migration{Version: v, Name: strings.TrimSuffix(rest, ".up.sql"), SQL: string(body)}
		down, err := fs.ReadFile(fsys, strings.TrimSuffix(name, ".up.sql")+".down.sql")
		switch {
		case err == nil:
			m.Down, m.HasDown = string(down), true
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("reading the down migration of %q: %w", name, err)
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Up applies every migration newer than the schema's current version, all in
// one transaction under a transaction-scoped advisory lock keyed by the
// schema name, so concurrent callers (many processes starting at once)
// serialise and all but the first find nothing to do. It returns the
// versions it applied.
func Up(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration) ([]int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	q := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('backlog.migrate'), hashtext($1))`, schema); err != nil {
		return nil, fmt.Errorf("migrate: advisory lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+q); err != nil {
		return nil, fmt.Errorf("migrate: creating schema %s: %w", schema, err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, q); err != nil {
		return nil, fmt.Errorf("migrate: search_path: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)`); err != nil {
		return nil, fmt.Errorf("migrate: version table: %w", err)
	}
	var current int64
	var dirty bool
	err = tx.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations LIMIT 1`).Scan(&current, &dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		current = 0
	case err != nil:
		return nil, fmt.Errorf("migrate: reading version: %w", err)
	case dirty:
		return nil, fmt.Errorf("migrate: schema %s is marked dirty at version %d (a migration failed half-way under another tool); fix it by hand", schema, current)
	}
	var applied []int64
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("migrate: applying %d_%s: %w", m.Version, m.Name, err)
		}
		applied = append(applied, m.Version)
		current = m.Version
	}
	if len(applied) == 0 {
		return nil, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM schema_migrations`); err != nil {
		return nil, fmt.Errorf("migrate: writing version: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, dirty) VALUES ($1, false)`, current); err != nil {
		return nil, fmt.Errorf("migrate: writing version: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return applied, nil
}

// Version returns the schema's migration version: 0 when the schema or its
// version table does not exist. A dirty version is an error.
func Version(ctx context.Context, pool *pgxpool.Pool, schema string) (int64, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int64
	var dirty bool
	err := pool.QueryRow(ctx, `SELECT version, dirty FROM `+pgx.Identifier{schema, "schema_migrations"}.Sanitize()+` LIMIT 1`).Scan(&v, &dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, err
	case dirty:
		return 0, fmt.Errorf("schema %s is marked dirty at version %d (a migration failed half-way under another tool)", schema, v)
	}
	return v, nil
}
