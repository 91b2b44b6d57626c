package backlog

import (
	"context"
	"fmt"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/migrations"
)

// MigrationStatus is where the queue's schema stands among backlog's
// migrations (see Queue.MigrationStatus).
type MigrationStatus struct {
	// Schema is the queue's schema.
	Schema string
	// Version is the schema's version as its schema_migrations table
	// holds it (the golang-migrate layout): the newest applied migration,
	// 0 when none is (or the schema does not exist). A schema migrated by
	// goose or golang-migrate with files exported before they wrote that
	// table (see `backlog migrate sql`) has no row there: its version is
	// then the one its tool's table holds (see Tools), and Migrate writes
	// it down.
	Version int64
	// Dirty reports that a migration failed half-way under another tool
	// (golang-migrate marks the version dirty); the schema must be fixed
	// by hand.
	Dirty bool
	// MigratedBy names what applied or reverted the schema's newest
	// migration: "backlog" (Migrate, MigrateDown, `backlog migrate`),
	// "goose" or "golang-migrate" (running the files `backlog migrate sql`
	// exports), or "" when the schema does not say (nothing applied yet,
	// or applied by a release of backlog or exported files that did not
	// record it).
	MigratedBy string
	// Tools are the version tables of other migration tools found in the
	// schema, with the version each holds. A tool's version can be behind
	// Version (backlog applied the newer migrations itself): the tool's
	// next run of the exported files records them without running them
	// again.
	Tools []MigrationTool
	// Migrations are every migration this version of backlog carries,
	// oldest first.
	Migrations []MigrationInfo
}

// MigrationTool is another migration tool's version table in the queue's
// schema.
type MigrationTool struct {
	// Tool is "goose" or "golang-migrate".
	Tool string
	// Table is the version table's name: goose_db_version, or
	// schema_migrations when golang-migrate shares backlog's table (found
	// by its shape: both tools let it be renamed).
	Table string
	// Version is the newest version the table says is applied, 0 when
	// none.
	Version int64
	// Dirty is golang-migrate's dirty flag.
	Dirty bool
}

// MigrationInfo is one of backlog's migrations.
type MigrationInfo struct {
	// Version and Name come from the file name (NNNN_name.up.sql).
	Version int64
	Name    string
	// Applied reports that the schema has it: its version is at most the
	// schema's.
	Applied bool
}

// Pending returns the migrations not yet applied, oldest first.
func (s *MigrationStatus) Pending() []MigrationInfo {
	var out []MigrationInfo
	for _, m := range s.Migrations {
		if !m.Applied {
			out = append(out, m)
		}
	}
	return out
}

// MigrationStatus reports the queue's schema version and which of the
// embedded migrations it has. It never changes the database, and works on
// a schema that does not exist yet (version 0, every migration pending).
func (q *Queue) MigrationStatus(ctx context.Context) (*MigrationStatus, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	ms, err := migrate.Load(migrations.FS)
	if err != nil {
		return nil, err
	}
	s, err := migrate.ReadState(ctx, q.pool, q.cfg.schema, true)
	if err != nil {
		return nil, classify(fmt.Errorf("reading the migration status of schema %s: %w", q.cfg.schema, err))
	}
	st := &MigrationStatus{Schema: q.cfg.schema, Version: s.Version, Dirty: s.Dirty, MigratedBy: s.MigratedBy,
		Migrations: make([]MigrationInfo, len(ms))}
	for _, t := range s.Tools {
		st.Tools = append(st.Tools, MigrationTool(t))
	}
	for i, m := range ms {
		st.Migrations[i] = MigrationInfo{Version: m.Version, Name: m.Name, Applied: m.Version <= s.Version}
	}
	return st, nil
}

// MigrateDown reverts the n newest migrations of the queue's schema,
// newest first, with their .down.sql files (migrations.FS), and returns
// the versions it reverted. Each step runs in its own transaction, under
// the advisory lock and with the timeouts and retries Migrate uses, and
// updates schema_migrations as golang-migrate would (the previous version; no row once every migration
// is reverted). An n larger than the number of applied migrations reverts
// them all; n must be at least 1. Reverting drops what the migrations
// made: jobs, history and schedules included. Stop every process using
// the schema first: a Queue that found the schema migrated does not look
// again. On error, the versions reverted before it are returned with it.
func (q *Queue) MigrateDown(ctx context.Context, n int) ([]int64, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	if n < 1 {
		return nil, invalid("n", "must be at least 1, got %d", n)
	}
	ms, err := migrate.Load(migrations.FS)
	if err != nil {
		return nil, err
	}
	done, err := migrate.Down(ctx, q.pool, q.cfg.schema, ms, n)
	if len(done) > 0 {
		q.migrated.Store(false)
		q.cfg.logger.Info("backlog: reverted migrations", "schema", q.cfg.schema, "versions", done)
	}
	if err != nil {
		return done, classify(err)
	}
	return done, nil
}
