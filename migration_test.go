package backlog_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestMigrateDownAndUp: status lists applied and pending migrations; down
// one step, then every step, then up again leaves a working queue.
func TestMigrateDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	q, err := backlog.New(ctx, pool, backlog.WithSchema(testdb.Schema(t)), backlog.WithLogger(logger(t)))
	require.NoError(t, err)
	defer q.Close()

	st, err := q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Version)
	require.NotEmpty(t, st.Migrations)
	require.Len(t, st.Pending(), len(st.Migrations))
	all := st.Migrations
	newest := all[len(all)-1].Version

	require.NoError(t, q.Migrate(ctx))
	st, err = q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, newest, st.Version)
	require.False(t, st.Dirty)
	require.Empty(t, st.Pending())

	// One step down: the newest is pending again, the queue says so.
	done, err := q.MigrateDown(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, []int64{newest}, done)
	st, err = q.MigrationStatus(ctx)
	require.NoError(t, err)
	if len(all) > 1 {
		require.Equal(t, all[len(all)-2].Version, st.Version)
	}
	require.Equal(t, []backlog.MigrationInfo{{Version: newest, Name: all[len(all)-1].Name}}, st.Pending())
	_, err = q.Enqueue(ctx, "t", nil)
	require.ErrorIs(t, err, backlog.ErrNotMigrated)

	// Up, with a job in it, then every step down.
	require.NoError(t, q.Migrate(ctx))
	_, err = q.Enqueue(ctx, "t", map[string]int{"n": 1})
	require.NoError(t, err)
	done, err = q.MigrateDown(ctx, math.MaxInt)
	require.NoError(t, err)
	require.Len(t, done, len(all))
	require.Equal(t, newest, done[0])
	require.Equal(t, all[0].Version, done[len(done)-1])
	st, err = q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Version)
	require.Len(t, st.Pending(), len(all))
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_migrations'`,
		q.Schema()).Scan(&tables))
	require.Zero(t, tables, "tables left behind by the down migrations")
	done, err = q.MigrateDown(ctx, 1)
	require.NoError(t, err)
	require.Empty(t, done)

	// Up again: a working queue.
	require.NoError(t, q.Migrate(ctx))
	e := &env{t: t, pool: pool, schema: q.Schema(), q: q}
	id, err := q.Enqueue(ctx, "t", map[string]int{"n": 2})
	require.NoError(t, err)
	stop := work(t, q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("t"))
	e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.NoError(t, stop())
	page, err := q.List(ctx, backlog.Filter{}, backlog.ListOptions{})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1)
	require.Equal(t, id, page.Jobs[0].ID)

	_, err = q.MigrateDown(ctx, 0)
	require.ErrorIs(t, err, backlog.ErrInvalid)

	// A version another tool left dirty is reported, and nothing reverts.
	_, err = pool.Exec(ctx, `UPDATE `+q.Schema()+`.schema_migrations SET dirty = true`)
	require.NoError(t, err)
	st, err = q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.True(t, st.Dirty)
	require.Equal(t, newest, st.Version)
	done, err = q.MigrateDown(ctx, 1)
	require.ErrorContains(t, err, "dirty")
	require.Empty(t, done)
}

// TestMigrateShortStatementTimeout: a pool whose sessions time statements
// out at 100 ms (an application's setting for its own queries) migrates
// from empty to the newest version, from three processes at once (two of
// them wait for the first's migration lock far longer than 100 ms), and
// the queue then runs a job on that pool.
func TestMigrateShortStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.PoolWith(t, 8, map[string]string{"statement_timeout": "100", "lock_timeout": "100"})
	schema := testdb.Schema(t)
	qs := make([]*backlog.Queue, 3)
	var err error
	for i := range qs {
		qs[i], err = backlog.New(ctx, pool, backlog.WithSchema(schema), backlog.WithLogger(logger(t)))
		require.NoError(t, err)
		defer qs[i].Close()
	}
	var wg sync.WaitGroup
	errs := make([]error, len(qs))
	for i, q := range qs {
		wg.Go(func() { errs[i] = q.Migrate(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "Migrate %d", i)
	}
	st, err := qs[0].MigrationStatus(ctx)
	require.NoError(t, err)
	require.Empty(t, st.Pending())
	require.Equal(t, "backlog", st.MigratedBy)

	// The test reads the job through the shared pool: its own reads are
	// not the point, and 100 ms can be too short for them on a loaded
	// machine.
	e := &env{t: t, pool: testdb.Pool(t), schema: schema}
	e.q = e.queue(e.pool)
	// An enqueue on the 100 ms pool: a loaded machine may time one out
	// (ErrRetryable), as it would the application's own statements.
	var id uuid.UUID
	for deadline := time.Now().Add(10 * time.Second); ; {
		id, err = qs[0].Enqueue(ctx, "t", map[string]int{"n": 1})
		if err == nil || !errors.Is(err, backlog.ErrRetryable) || time.Now().After(deadline) {
			break
		}
	}
	require.NoError(t, err)
	stop := work(t, qs[1], backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("t"))
	e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.NoError(t, stop())
}
