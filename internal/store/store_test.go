package store

import (
	"context"
	"os"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// After every test's cleanup (which drops its schema on this pool).
	testdb.Close()
	os.Exit(code)
}

// TestStatementsPrepare parses and plans every statement against a real
// schema, so a typo in a rarely used path fails here rather than in
// production.
func TestStatementsPrepare(t *testing.T) {
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	_, err = migrate.Up(context.Background(), pool, schema, ms)
	require.NoError(t, err)
	s := New(pool, schema)

	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	n := 0
	// Every string field of the statement structs is a statement.
	var check func(v reflect.Value, path string)
	check = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f, name := v.Field(i), path+v.Type().Field(i).Name
			switch f.Kind() {
			case reflect.Struct:
				check(f, name+".")
			case reflect.String:
				_, err := conn.Conn().Prepare(context.Background(), "", f.String())
				require.NoError(t, err, "statement %s:\n%s", name, f.String())
				n++
			}
		}
	}
	check(reflect.ValueOf(s.sql), "sql.")
	check(reflect.ValueOf(s.fin), "fin.")
	check(reflect.ValueOf(s.graph), "graph.")
	check(reflect.ValueOf(s.maint), "maint.")
	require.Greater(t, n, 40)
}

// TestClaimPlanStaysOnTheIndexes guards against the cached-plan trap: plans
// the claim function caches while the table is empty must not scan the
// table sequentially once it has grown.
func TestClaimPlanStaysOnTheIndexes(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema, ms)
	require.NoError(t, err)
	s := New(pool, schema)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// An analysed empty table is what makes a cached plan a sequential
	// scan (reproduced: 27 ms per claim at 100,000 rows without the guard).
	_, err = pool.Exec(ctx, `ANALYZE "`+schema+`".jobs`)
	require.NoError(t, err)
	claim := func(types []string, k int) {
		rows, err := conn.Query(ctx, s.sql.claim, Mode, types, `{}`, k, 30000, "w")
		require.NoError(t, err)
		rows.Close()
		require.NoError(t, rows.Err())
	}
	for range 12 { // past PL/pgSQL's switch to a generic plan
		claim([]string{"a"}, 1)
		claim([]string{"a", "b"}, 5)
	}
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, state, finished_at)
		SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, '{}',
		       CASE WHEN g % 10 = 0 THEN 'available' ELSE 'completed' END, now()
		FROM generate_series(1, 100000) g`)
	require.NoError(t, err)
	for _, types := range [][]string{{"a"}, {"a", "b"}} {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, s.sql.claim, Mode, types, `{}`, 3, 30000, "w")
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			n++
		}
		require.NoError(t, rows.Err())
		// Tuples read by sequential scans (the seq_scan counter also counts
		// bitmap heap scans, which the claim's final UPDATE by ID may use).
		var seqRead int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT seq_tup_read FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`,
			`"`+schema+`".jobs`).Scan(&seqRead))
		require.Less(t, seqRead, int64(100), "claim of %v scanned the jobs table sequentially", types)
		require.Equal(t, 3, n)
		require.NoError(t, tx.Rollback(ctx))
	}
}
