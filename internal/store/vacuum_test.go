package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// deadRows makes n dead rows in the jobs table of schema (n/2 jobs
// inserted, claimed-like updated and deleted) and waits until the
// statistics count them.
func deadRows(t *testing.T, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err = conn.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args) SELECT gen_random_uuid(), 'v', '{}' FROM generate_series(1, $1::int)`, n/2)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE `+jobs+` SET state = 'running', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DELETE FROM `+jobs)
	require.NoError(t, err)
	var v int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v))
	if v >= 150000 {
		// Otherwise an idle session reports its statistics within 10 s.
		_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		var dead int
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)`, jobs).Scan(&dead))
		return dead >= n
	}, 20*time.Second, 20*time.Millisecond, "the statistics never counted the dead rows")
}

// TestVacuumJobs: the jobs table is vacuumed once its statistics count
// the given dead rows and no vacuum ended within the gap; not below the
// threshold, nor again within the gap.
func TestVacuumJobs(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	deadRows(t, pool, schema, 400)

	r, err := s.VacuumJobs(ctx, 1_000_000, 0, 0)
	require.NoError(t, err)
	require.False(t, r.Vacuumed, "below the threshold")
	require.GreaterOrEqual(t, r.Dead, int64(400))

	vacuums := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			pgx.Identifier{schema, "jobs"}.Sanitize()).Scan(&n))
		return n
	}
	require.Zero(t, vacuums())
	r, err = s.VacuumJobs(ctx, 300, 1_000_000, 0)
	require.NoError(t, err)
	require.False(t, r.Vacuumed, "the table holds too few live rows")
	r, err = s.VacuumJobs(ctx, 300, 0, 0)
	require.NoError(t, err)
	require.True(t, r.Vacuumed)
	require.False(t, r.NotOwner)
	require.Equal(t, 1, vacuums())

	deadRows(t, pool, schema, 400)
	r, err = s.VacuumJobs(ctx, 300, 0, time.Hour)
	require.NoError(t, err)
	require.False(t, r.Vacuumed, "a vacuum ended within the gap")
	require.Equal(t, 1, vacuums())
}

// TestVacuumJobsNotOwner: a role that does not own the jobs table is told
// so, and runs nothing.
func TestVacuumJobsNotOwner(t *testing.T) {
	ctx := context.Background()
	_, pool, schema := newTestStore(t)
	role := "backlog_vac_" + uuid.NewString()[:8]
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN; GRANT USAGE ON SCHEMA %s TO %s`,
		role, pgx.Identifier{schema}.Sanitize(), role))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, role, role))
		require.NoError(t, err)
	})
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer other.Close()
	deadRows(t, pool, schema, 200)

	r, err := New(other, schema).VacuumJobs(ctx, 100, 0, 0)
	require.NoError(t, err)
	require.True(t, r.NotOwner)
	require.False(t, r.Vacuumed)
}

// TestVacuumJobsReportsWhatItLeft: dead rows an older snapshot still sees
// are left by the vacuum and reported (the maintenance loop then waits
// for vacuumDead more before it vacuums again).
func TestVacuumJobsReportsWhatItLeft(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	// A snapshot taken before the rows die.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "jobs"}.Sanitize())
	require.NoError(t, err)
	deadRows(t, pool, schema, 400)

	r, err := s.VacuumJobs(ctx, 300, 0, 0)
	require.NoError(t, err)
	require.True(t, r.Vacuumed)
	require.GreaterOrEqual(t, r.Left, int64(400), "the open snapshot keeps the dead rows")
	// (Once it is gone a vacuum removes them, unless another session of
	// the shared test database holds an older snapshot: not asserted.)
}
