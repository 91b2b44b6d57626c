package migrate

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Down reverts up to n of the schema's applied migrations, newest first,
// each in its own transaction (under the migration lock and timeouts Up
// takes, retried the same way) that runs the migration's down SQL and
// sets schema_migrations to the previous known version, as golang-migrate
// does: the table is left empty once every migration is reverted. It
// returns the versions it reverted, in the order it reverted them; on
// error, those reverted before it.
func Down(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration, n int) ([]int64, error) {
	var done []int64
	for len(done) < n {
		var v int64
		var ok bool
		err := retryLocks(ctx, schema, func() error {
			var err error
			v, ok, err = downOne(ctx, pool, schema, ms)
			return err
		})
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
	tx, err := begin(ctx, pool, schema)
	if err != nil {
		return 0, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	st, err := ReadState(ctx, tx, schema, false)
	switch {
	case err != nil:
		return 0, false, err
	case st.Dirty:
		return 0, false, fmt.Errorf("migrate: schema %s is marked dirty at version %d (a migration failed half-way under another tool); fix it by hand", schema, st.Version)
	case st.Version == 0:
		return 0, false, nil
	}
	i := -1
	for j, m := range ms {
		if m.Version == st.Version {
			i = j
		}
	}
	if i < 0 {
		return 0, false, fmt.Errorf("migrate: schema %s is at version %d, which this version of backlog does not know (a newer release migrated it?)", schema, st.Version)
	}
	m := ms[i]
	if !m.HasDown {
		return 0, false, fmt.Errorf("migrate: migration %d_%s has no down migration", m.Version, m.Name)
	}
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, q); err != nil {
		return 0, false, fmt.Errorf("migrate: search_path: %w", err)
	}
	if err := cancelVacuum(ctx, tx, schema); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, m.Down); err != nil {
		return 0, false, fmt.Errorf("migrate: reverting %d_%s: %w", m.Version, m.Name, err)
	}
	if !st.Recorded {
		// The version was another tool's record only.
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)`); err != nil {
			return 0, false, fmt.Errorf("migrate: version table: %w", err)
		}
	}
	var prev int64
	if i > 0 {
		prev = ms[i-1].Version
	}
	if err := record(ctx, tx, prev, ToolBacklog); err != nil {
		return 0, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("migrate: commit: %w", err)
	}
	return m.Version, true, nil
}
