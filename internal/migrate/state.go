package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Names of the migration tools a schema can say migrated it.
const (
	ToolBacklog       = "backlog"
	ToolGoose         = "goose"
	ToolGolangMigrate = "golang-migrate"
)

// markerPrefix starts the comment on schema_migrations that names what
// applied or reverted the schema's newest migration: backlog itself, or the
// files `backlog migrate sql` exported for a tool. A comment rather than a
// column: golang-migrate, sharing the table, truncates it and inserts
// (version, dirty) after every migration, which would reset a column but
// leaves the comment alone.
const markerPrefix = "backlog: migrated by "

// versionTableDDL creates backlog's version table, in golang-migrate's
// shape, so that golang-migrate can share it.
const versionTableDDL = `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)`

// State is where a schema stands.
type State struct {
	// Version is the schema's version: schema_migrations' row, else (a
	// schema migrated by files exported before they recorded it there) the
	// version of the one other tool's table found beside the tables, else 0.
	Version int64
	// Dirty is set when the version's migration failed half-way under
	// golang-migrate.
	Dirty bool
	// Recorded reports that schema_migrations holds Version.
	Recorded bool
	// MigratedBy names what applied (or reverted) the newest migration:
	// ToolBacklog, ToolGoose, ToolGolangMigrate, or "" when the schema does
	// not say (nothing applied, or applied before this was recorded).
	MigratedBy string
	// Tools are the other tools' version tables found in the schema.
	Tools []ToolTable
}

// ToolTable is another migration tool's version table in the schema.
type ToolTable struct {
	Tool    string // ToolGoose or ToolGolangMigrate
	Table   string
	Version int64 // the newest applied version; 0 when none
	Dirty   bool  // golang-migrate only
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadState reads the schema's state. It never writes, and works on a
// schema that does not exist (version 0). It looks for the other tools'
// tables (State.Tools) when withTools is set or schema_migrations has no
// row: that looks through the catalog (pg_class has no index by schema).
func ReadState(ctx context.Context, db querier, schema string, withTools bool) (State, error) {
	var st State
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	var exists bool
	var comment *string
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, obj_description(to_regclass($1), 'pg_class')`, table).
		Scan(&exists, &comment); err != nil {
		return st, fmt.Errorf("migrate: reading version: %w", err)
	}
	if comment != nil {
		if tool, ok := strings.CutPrefix(*comment, markerPrefix); ok {
			st.MigratedBy = tool
		}
	}
	if exists {
		err := db.QueryRow(ctx, `SELECT version, dirty FROM `+table+` LIMIT 1`).Scan(&st.Version, &st.Dirty)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return st, fmt.Errorf("migrate: reading version: %w", err)
		default:
			st.Recorded = true
		}
	}
	if !withTools && st.Recorded {
		return st, nil
	}
	tools, err := toolTables(ctx, db, schema)
	if err != nil {
		return st, err
	}
	st.Tools = tools
	if !st.Recorded && len(tools) == 1 && tools[0].Version > 0 {
		// Files exported before they wrote schema_migrations: the tool's
		// table is the only record. Trusted only beside a jobs table, so a
		// tool's table that merely sits in the schema is not taken for
		// backlog's migrations.
		var jobs bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "jobs"}.Sanitize()).Scan(&jobs); err != nil {
			return st, fmt.Errorf("migrate: reading version: %w", err)
		}
		if jobs {
			st.Version, st.Dirty, st.MigratedBy = tools[0].Version, tools[0].Dirty, tools[0].Tool
		}
	}
	if st.MigratedBy == ToolGolangMigrate && !slices.ContainsFunc(st.Tools, func(t ToolTable) bool { return t.Tool == ToolGolangMigrate }) {
		// golang-migrate shares backlog's table.
		st.Tools = append(st.Tools, ToolTable{Tool: ToolGolangMigrate, Table: "schema_migrations", Version: st.Version, Dirty: st.Dirty})
	}
	return st, nil
}

// toolTables finds goose's and golang-migrate's version tables in the
// schema by their columns (both tools let the table be renamed):
// golang-migrate's (version, dirty) under another name than
// schema_migrations, goose's (id, version_id, is_applied, tstamp).
//
// The schema's tables are found through their dependencies on it
// (pg_depend's index), not by scanning pg_class, which has no index by
// schema and can be large (a partition per day, or many schemas).
func toolTables(ctx context.Context, db querier, schema string) ([]ToolTable, error) {
	rows, err := db.Query(ctx, `
SELECT c.relname::text, array_agg(a.attname::text ORDER BY a.attname)
FROM pg_depend d
JOIN pg_class c ON c.oid = d.objid
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = to_regnamespace($1)::oid AND d.refobjsubid = 0
  AND d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p') AND c.relname <> 'schema_migrations'
GROUP BY c.relname
HAVING array_agg(a.attname::text ORDER BY a.attname) IN ('{dirty,version}', '{id,is_applied,tstamp,version_id}')
ORDER BY 1`, pgx.Identifier{schema}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("migrate: looking for other tools' version tables: %w", err)
	}
	type found struct {
		name string
		cols []string
	}
	var fs []found
	for rows.Next() {
		var f found
		if err := rows.Scan(&f.name, &f.cols); err != nil {
			rows.Close()
			return nil, fmt.Errorf("migrate: looking for other tools' version tables: %w", err)
		}
		fs = append(fs, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrate: looking for other tools' version tables: %w", err)
	}
	var out []ToolTable
	for _, f := range fs {
		t := ToolTable{Table: f.name}
		table := pgx.Identifier{schema, f.name}.Sanitize()
		var err error
		if len(f.cols) == 2 {
			t.Tool = ToolGolangMigrate
			err = db.QueryRow(ctx, `SELECT version, dirty FROM `+table+` LIMIT 1`).Scan(&t.Version, &t.Dirty)
			if errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		} else {
			// goose deletes a reverted version's row (older releases added
			// an is_applied = false row instead): a version counts when its
			// newest row says applied. Version 0 is goose's own first row.
			t.Tool = ToolGoose
			err = db.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM (
    SELECT DISTINCT ON (version_id) version_id, is_applied FROM `+table+` ORDER BY version_id, id DESC) v
WHERE is_applied`).Scan(&t.Version)
		}
		if err != nil {
			return nil, fmt.Errorf("migrate: reading %s's version table %s: %w", t.Tool, f.name, err)
		}
		out = append(out, t)
	}
	return out, nil
}
