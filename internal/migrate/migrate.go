// Package migrate applies backlog's embedded SQL migrations to one schema,
// and exports them for other migration tools.
//
// The schema's version lives in a golang-migrate compatible table
// (schema_migrations: one row, version and dirty). The files Export
// writes for goose and golang-migrate keep that row too, and skip a
// migration the row says is applied, so backlog, goose and golang-migrate
// can take turns on one schema and none runs a migration twice (see
// Export). A comment on the table names who changed it last.
//
// Every change runs under a transaction-scoped advisory lock keyed by the
// schema name (the exported files take it too), with its own timeouts: see
// Up.
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

// Up applies every migration newer than the schema's version, all in one
// transaction, under backlog's migration lock for the schema, so that
// concurrent callers (many processes starting at once, or a tool running
// exported files) serialise and all but the first find nothing to do. It
// returns the versions it applied. It records the version in
// schema_migrations (also when it applied nothing but found the version
// only in another tool's table), and itself as what migrated the schema
// when it applied something.
//
// Timeouts: see begin. An attempt that cannot take a lock within
// LockTimeout is rolled back and made again (see retryLocks).
func Up(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration) ([]int64, error) {
	var applied []int64
	err := retryLocks(ctx, schema, func() error {
		var err error
		applied, err = up(ctx, pool, schema, ms)
		return err
	})
	return applied, err
}

func up(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration) ([]int64, error) {
	tx, err := begin(ctx, pool, schema)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	q := pgx.Identifier{schema}.Sanitize()
	var schemaExists, tableExists bool
	if err := tx.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		q, pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&schemaExists, &tableExists); err != nil {
		return nil, fmt.Errorf("migrate: reading schema %s: %w", schema, err)
	}
	st, err := ReadState(ctx, tx, schema, false)
	if err != nil {
		return nil, err
	}
	if st.Dirty {
		return nil, fmt.Errorf("migrate: schema %s is marked dirty at version %d (a migration failed half-way under another tool); fix it by hand", schema, st.Version)
	}
	var pending []Migration
	for _, m := range ms {
		if m.Version > st.Version {
			pending = append(pending, m)
		}
	}
	if len(pending) == 0 && st.Recorded {
		// Nothing to write: no DDL, so an up-to-date schema never waits for
		// a lock.
		return nil, tx.Commit(ctx)
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+q); err != nil {
			return nil, fmt.Errorf("migrate: creating schema %s: %w", schema, err)
		}
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, q); err != nil {
		return nil, fmt.Errorf("migrate: search_path: %w", err)
	}
	if !tableExists {
		if _, err := tx.Exec(ctx, versionTableDDL); err != nil {
			return nil, fmt.Errorf("migrate: version table: %w", err)
		}
	}
	if err := cancelVacuum(ctx, tx, schema); err != nil {
		return nil, err
	}
	var applied []int64
	current, by := st.Version, st.MigratedBy
	for _, m := range pending {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("migrate: applying %d_%s: %w", m.Version, m.Name, err)
		}
		applied = append(applied, m.Version)
		current, by = m.Version, ToolBacklog
	}
	if err := record(ctx, tx, current, by); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return applied, nil
}

// record writes the schema's version (none when 0) and what migrated it
// into schema_migrations, with search_path set to the schema.
func record(ctx context.Context, tx pgx.Tx, version int64, by string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM schema_migrations`); err != nil {
		return fmt.Errorf("migrate: writing version: %w", err)
	}
	if version > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, dirty) VALUES ($1, false)`, version); err != nil {
			return fmt.Errorf("migrate: writing version: %w", err)
		}
	}
	if by != "" {
		// COMMENT takes no parameters.
		if _, err := tx.Exec(ctx, `COMMENT ON TABLE schema_migrations IS `+literal(markerPrefix+by)); err != nil {
			return fmt.Errorf("migrate: writing version: %w", err)
		}
	}
	return nil
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Version returns the schema's migration version (see State.Version): 0
// when the schema or its version table does not exist. A dirty version is
// an error.
func Version(ctx context.Context, pool *pgxpool.Pool, schema string) (int64, error) {
	st, err := ReadState(ctx, pool, schema, false)
	if err != nil {
		return 0, err
	}
	if st.Dirty {
		return 0, fmt.Errorf("schema %s is marked dirty at version %d (a migration failed half-way under another tool)", schema, st.Version)
	}
	return st.Version, nil
}
