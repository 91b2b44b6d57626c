package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gomigrate "github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // golang-migrate's pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/migrations"
)

// Helpers for the tests that run backlog's exported migrations with goose
// and golang-migrate themselves (pinned in go.mod), as libraries.

// embedded returns backlog's migrations, oldest first.
func embedded(t *testing.T) []migrate.Migration {
	t.Helper()
	ms, err := migrate.Load(migrations.FS)
	if err != nil || len(ms) < 2 {
		t.Fatalf("migrations: %d %v", len(ms), err)
	}
	return ms
}

// toolRun names a tool and how it is set up.
type toolRun struct {
	name       string // goose or golang-migrate
	format     string // the --format to export with
	table      string // golang-migrate: its x-migrations-table ("" shares schema_migrations)
	searchPath string // the tool's connection's; "" for the queue's schema
}

var toolRuns = []toolRun{
	{name: "goose", format: "goose"},
	{name: "golang-migrate", format: "golang-migrate"},                            // shares schema_migrations
	{name: "golang-migrate-own-table", format: "golang-migrate", table: "gm_ver"}, // its own table
}

// versionTable is the tool's own version table, as MigrationStatus names it.
func (r toolRun) versionTable() string {
	switch {
	case r.format == "goose":
		return "goose_db_version"
	case r.table != "":
		return r.table
	}
	return "schema_migrations"
}

// export writes backlog's export for c's schema (as `migrate sql --dir`
// does: TestMigrateSQL checks they agree) into a new directory, keeping
// the files of versions up to upTo only (an export by an older release).
func (r toolRun) export(c *cli, upTo int64) string {
	c.t.Helper()
	dir := filepath.Join(c.t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	files, err := sqlFiles(r.format, c.schema)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, f := range files {
		var v int64
		if _, err := fmt.Sscanf(f.Name, "%d_", &v); err != nil {
			c.t.Fatalf("exported file %s: %v", f.Name, err)
		}
		if v > upTo {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name), []byte(f.Text), 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	return dir
}

// toolURL is the test database's URL with search_path set to schema and
// the given scheme.
func toolURL(t *testing.T, scheme, schema string, extra url.Values) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = scheme
	q := u.Query()
	q.Set("search_path", schema)
	for k, v := range extra {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// createSchema creates c's schema: the tools keep their version tables in
// the connection's search_path, which must exist.
func createSchema(c *cli) {
	c.t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{c.schema}.Sanitize()); err != nil {
		c.t.Fatal(err)
	}
}

// up runs the tool's up over dir on c's schema.
func (r toolRun) up(c *cli, dir string) error {
	c.t.Helper()
	switch r.format {
	case "goose":
		p := r.goose(c, dir)
		_, err := p.Up(context.Background())
		return err
	default:
		m := r.golangMigrate(c, dir)
		if err := m.Up(); err != nil && !errors.Is(err, gomigrate.ErrNoChange) {
			return err
		}
		return nil
	}
}

// downAll reverts every migration with the tool.
func (r toolRun) downAll(c *cli, dir string) error {
	c.t.Helper()
	switch r.format {
	case "goose":
		_, err := r.goose(c, dir).DownTo(context.Background(), 0)
		return err
	default:
		m := r.golangMigrate(c, dir)
		if err := m.Down(); err != nil && !errors.Is(err, gomigrate.ErrNoChange) {
			return err
		}
		return nil
	}
}

// downOne reverts the tool's newest migration.
func (r toolRun) downOne(c *cli, dir string) error {
	c.t.Helper()
	switch r.format {
	case "goose":
		_, err := r.goose(c, dir).Down(context.Background())
		return err
	default:
		return r.golangMigrate(c, dir).Steps(-1)
	}
}

// version is the tool's own idea of the schema's version.
func (r toolRun) version(c *cli, dir string) int64 {
	c.t.Helper()
	switch r.format {
	case "goose":
		v, err := r.goose(c, dir).GetDBVersion(context.Background())
		if err != nil {
			c.t.Fatal(err)
		}
		return v
	default:
		v, dirty, err := r.golangMigrate(c, dir).Version()
		if errors.Is(err, gomigrate.ErrNilVersion) {
			return 0
		}
		if err != nil || dirty {
			c.t.Fatalf("golang-migrate version: %d dirty %v: %v", v, dirty, err)
		}
		return int64(v)
	}
}

func (r toolRun) goose(c *cli, dir string) *goose.Provider {
	c.t.Helper()
	path := r.searchPath
	if path == "" {
		path = c.schema
	}
	db, err := sql.Open("pgx", toolURL(c.t, "postgres", path, nil))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(dir), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (r toolRun) golangMigrate(c *cli, dir string) *gomigrate.Migrate {
	c.t.Helper()
	src, err := iofs.New(os.DirFS(dir), ".")
	if err != nil {
		c.t.Fatal(err)
	}
	extra := url.Values{}
	if r.table != "" {
		extra.Set("x-migrations-table", r.table)
	}
	m, err := gomigrate.NewWithSourceInstance("iofs", src, toolURL(c.t, "pgx5", c.schema, extra))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _, _ = m.Close() })
	return m
}

// statusJSON is `migrate status --json`.
type statusJSON struct {
	Version    int64  `json:"version"`
	Dirty      bool   `json:"dirty"`
	MigratedBy string `json:"migrated_by"`
	Pending    int    `json:"pending"`
	Tools      []struct {
		Tool    string `json:"tool"`
		Table   string `json:"table"`
		Version int64  `json:"version"`
		Dirty   bool   `json:"dirty"`
	} `json:"tools"`
}

// status returns the library's status of c's schema, after checking that
// it says version, migrated by by, with pending migrations, and reports
// the tool's table at toolVersion.
func (r toolRun) status(c *cli, version int64, by string, pending int, toolVersion int64) *backlog.MigrationStatus {
	c.t.Helper()
	st, err := c.lib().MigrationStatus(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	if st.Version != version || st.MigratedBy != by || len(st.Pending()) != pending || st.Dirty {
		c.t.Fatalf("status: version %d, migrated by %q, %d pending, dirty %v; want %d, %q, %d",
			st.Version, st.MigratedBy, len(st.Pending()), st.Dirty, version, by, pending)
	}
	for _, tt := range st.Tools {
		if tt.Table == r.versionTable() {
			if tt.Tool != r.format || tt.Version != toolVersion || tt.Dirty {
				c.t.Fatalf("status: the tool's table: %+v, want %s at %d", tt, r.format, toolVersion)
			}
			return st
		}
	}
	if r.table == "" && r.format == "golang-migrate" && by != "golang-migrate" && toolVersion == version {
		// Shared with backlog: the same row; listed as golang-migrate's
		// only while golang-migrate was the last to write it.
		return st
	}
	c.t.Fatalf("status does not report %s's table %s: %+v", r.format, r.versionTable(), st.Tools)
	return st
}

// lib is a Queue on c's schema, opened once.
func (c *cli) lib() *backlog.Queue {
	c.t.Helper()
	if c.q == nil {
		c.q = c.queue()
	}
	return c.q
}

// reference is the schema backlog's own migrate up makes, dumped.
var reference struct {
	once sync.Once
	dump string
	err  error
}

func referenceDump(t *testing.T) string {
	t.Helper()
	reference.once.Do(func() {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		schema := "cli_ref_" + hex.EncodeToString(b) // dropped below, not when t ends
		defer func() {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}()
		q, err := backlog.New(context.Background(), pool, backlog.WithSchema(schema))
		if err != nil {
			reference.err = err
			return
		}
		defer q.Close()
		if reference.err = q.Migrate(context.Background()); reference.err != nil {
			return
		}
		reference.dump, reference.err = dumpSchema(schema)
	})
	if reference.err != nil {
		t.Fatal(reference.err)
	}
	return reference.dump
}

// dumpSchema describes everything backlog's migrations make in schema
// (the version tables of backlog and the tools left out, and the
// history's daily partitions, whose names are dates), with the schema's
// name replaced by "S", so that two schemas can be compared.
func dumpSchema(schema string) (string, error) {
	// Objects are found through their dependency on the schema
	// (pg_depend's index): the catalogs of a test database that creates
	// and drops schemas all day are too large to scan.
	const q = `
WITH obj AS (
    SELECT classid, objid FROM pg_depend
    WHERE refclassid = 'pg_namespace'::regclass AND refobjid = to_regnamespace($1)::oid AND refobjsubid = 0
),
rel AS (
    SELECT c.oid, c.relname, c.relkind FROM obj JOIN pg_class c ON obj.classid = 'pg_class'::regclass AND c.oid = obj.objid
    WHERE NOT c.relispartition
      AND c.relname NOT IN ('schema_migrations', 'goose_db_version', 'goose_db_version_id_seq', 'gm_ver')
      AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
)
SELECT 'rel ' || relname || ' ' || relkind::text || coalesce(' ' || pg_get_partkeydef(oid), '') || coalesce(' ' || obj_description(oid, 'pg_class'), '') FROM rel
UNION ALL
SELECT 'col ' || r.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '') || ' ' || a.attidentity::text || a.attgenerated::text
FROM rel r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
UNION ALL
SELECT 'con ' || r.relname || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid) FROM rel r JOIN pg_constraint c ON c.conrelid = r.oid
UNION ALL
SELECT 'idx ' || pg_get_indexdef(i.indexrelid) FROM rel r JOIN pg_index i ON i.indrelid = r.oid
UNION ALL
SELECT 'trg ' || pg_get_triggerdef(t.oid) FROM rel r JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal
UNION ALL
SELECT 'view ' || r.relname || ' ' || pg_get_viewdef(r.oid) FROM rel r WHERE r.relkind IN ('v', 'm')
UNION ALL
SELECT 'fn ' || pg_get_functiondef(p.oid) FROM obj JOIN pg_proc p ON obj.classid = 'pg_proc'::regclass AND p.oid = obj.objid
WHERE p.prokind IN ('f', 'p')
UNION ALL
SELECT 'type ' || t.typname || ' ' || t.typtype::text
       || coalesce(' ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid), '')
FROM obj JOIN pg_type t ON obj.classid = 'pg_type'::regclass AND t.oid = obj.objid
WHERE t.typtype IN ('e', 'd')
ORDER BY 1`
	rows, err := pool.Query(context.Background(), q, schema)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	if len(lines) == 0 {
		return "", nil
	}
	return strings.ReplaceAll(strings.Join(lines, "\n"), schema, "S") + "\n", nil
}

// sameSchema fails unless c's schema is what backlog's own migrate makes.
func sameSchema(c *cli) {
	c.t.Helper()
	want := referenceDump(c.t)
	got, err := dumpSchema(c.schema)
	if err != nil {
		c.t.Fatal(err)
	}
	if got != want {
		c.t.Fatalf("schema %s differs from backlog's own migrate:\n%s", c.schema, lineDiff(want, got))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var b strings.Builder
	for l, n := range count {
		for ; n > 0; n-- {
			fmt.Fprintf(&b, "- %.300s\n", l)
		}
		for ; n < 0; n++ {
			fmt.Fprintf(&b, "+ %.300s\n", l)
		}
	}
	return b.String()
}

// runsJobs checks that New, Migrate (a no-op) and Work run a job on c's
// schema.
func runsJobs(c *cli) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := c.lib()
	before, err := q.MigrationStatus(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := q.Migrate(ctx); err != nil {
		c.t.Fatalf("Migrate on a migrated schema: %v", err)
	}
	after, err := q.MigrationStatus(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	if after.Version != before.Version || after.MigratedBy != before.MigratedBy || len(after.Pending()) != 0 {
		c.t.Fatalf("Migrate on a migrated schema changed it: %+v -> %+v", before, after)
	}
	id, err := q.Enqueue(ctx, "t", map[string]int{"n": 1})
	if err != nil {
		c.t.Fatalf("enqueue: %v", err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("t"))
	}()
	info, err := q.Wait(ctx, id)
	stop()
	if werr := <-done; werr != nil && !errors.Is(werr, context.Canceled) {
		c.t.Fatalf("Work: %v", werr)
	}
	if err != nil || info.State != backlog.StateCompleted {
		c.t.Fatalf("job: %+v %v", info, err)
	}
}
