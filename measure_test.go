package backlog

import (
	"context"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// TestMeasureMaintenanceCost measures one periodic tick, one cleaner pass
// and one Stats call with 1M finished jobs in the table. It only runs with
// BACKLOG_MEASURE=1 (make measure): it is a measurement, not a test.
func TestMeasureMaintenanceCost(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	jobs := `"` + schema + `".jobs`
	start := time.Now()
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, state, attempt, finished_at, created_at, started_at)
		SELECT gen_random_uuid(), 'report.' || (g % 10), '{"n": 1}', 'completed', 1,
		       now() - interval '1 hour' * (g::float / 1000000), now() - interval '2 hours', now() - interval '2 hours'
		FROM generate_series(1, 1000000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+jobs)
	require.NoError(t, err)
	t.Logf("seeded 1,000,000 completed jobs in %s", time.Since(start).Round(time.Millisecond))

	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 7 {
			s := time.Now()
			f()
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}

	// A periodic tick with one due plan: Now, then BEGIN, claim the plan,
	// insert the job (with its NOTIFY), COMMIT.
	require.NoError(t, q.Every("measure", time.Second, "tick", nil))
	q.mu.Lock()
	s := q.sched
	q.mu.Unlock()
	s.tick(ctx) // loads the last plan
	tick := median(func() {
		s.mu.Lock()
		s.schedules["measure"].last = time.Now().Add(-2 * time.Second).Truncate(time.Second)
		s.mu.Unlock()
		s.tick(ctx)
	})
	t.Logf("periodic tick (1 due plan, 5 statements incl. BEGIN/COMMIT): median %s", tick)

	// A cleaner pass that finds nothing expired (retention 24h): one
	// statement for jobs, one for periodic_runs.
	clean := median(func() {
		_, err := q.Clean(ctx)
		require.NoError(t, err)
	})
	t.Logf("cleaner pass, nothing expired (2 statements): median %s", clean)

	// A pass that deletes 1,000 expired jobs.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET finished_at = now() - interval '2 days'
		WHERE id IN (SELECT id FROM `+jobs+` ORDER BY finished_at LIMIT 7000)`)
	require.NoError(t, err)
	del := median(func() {
		_, err := q.store.Clean(ctx, q.cfg.keepCompleted, q.cfg.keepFailed, cleanBatch)
		require.NoError(t, err)
	})
	t.Logf("cleaner batch deleting 1,000 expired jobs (2 statements): median %s", del)

	stats := median(func() {
		_, err := q.Stats(ctx)
		require.NoError(t, err)
	})
	t.Logf("Stats (1 statement, whole table): median %s", stats)
}
