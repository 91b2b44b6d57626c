package store

import (
	"context"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

// TestStatementsPrepare parses and plans every statement against a real
// schema, so a typo in a rarely used path fails here rather than in
// production.
func TestStatementsPrepare(t *testing.T) {
	pool := testdb.Pool(t)
	defer testdb.Close()
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
	check := func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f := v.Field(i)
			if f.Kind() != reflect.String || f.String() == "" || v.Type().Field(i).Name == "Schema" ||
				v.Type().Field(i).Name == "Channel" || v.Type().Field(i).Name == "jobs" {
				continue
			}
			name := path + v.Type().Field(i).Name
			_, err := conn.Conn().Prepare(context.Background(), "", f.String())
			require.NoError(t, err, "statement %s:\n%s", name, f.String())
			n++
		}
	}
	check(reflect.ValueOf(*s), "")
	check(reflect.ValueOf(s.graph), "graph.")
	jobs, runs := s.cleanSQL()
	for name, q := range map[string]string{"clean jobs": jobs, "clean runs": runs} {
		_, err := conn.Conn().Prepare(context.Background(), "", q)
		require.NoError(t, err, "statement %s:\n%s", name, q)
	}
	require.Greater(t, n, 20)
}
