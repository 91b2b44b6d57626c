package backlog

import (
	"context"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// TestMeasureEnqueueNotify measures single-row enqueue throughput from 16
// goroutines: backlog's Enqueue with notifications (the default notifier)
// and without (WithPollOnly), against raw SQL inserts with and without a
// pg_notify in every insert's transaction. Only with BACKLOG_MEASURE=1.
func TestMeasureEnqueueNotify(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	defer testdb.Close()
	raw := func(notify bool) func(q *Queue) error {
		return func(q *Queue) error {
			sql := `INSERT INTO "` + q.cfg.schema + `".jobs (id, type, args) VALUES ($1, 'bench.enqueue', '{"n": 1}')`
			if notify {
				sql = `WITH ins AS (` + sql + ` RETURNING 1) SELECT pg_notify('` + q.store.Channel() + `', '{"type":"bench.enqueue"}') FROM ins`
			}
			_, err := pool.Exec(ctx, sql, NewID())
			return err
		}
	}
	viaQueue := func(q *Queue) error {
		_, err := q.Enqueue(ctx, "bench.enqueue", map[string]int{"n": 1})
		return err
	}
	modes := []struct {
		name string
		opt  Option
		do   func(q *Queue) error
	}{
		{"Enqueue, notifier (default)", queueOption(func(*config) {}), viaQueue},
		{"Enqueue, no NOTIFY (poll-only)", WithPollOnly(), viaQueue},
		{"raw INSERT + NOTIFY in each tx", queueOption(func(*config) {}), raw(true)},
		{"raw INSERT, no NOTIFY", queueOption(func(*config) {}), raw(false)},
	}
	const clients, window = 16, 5 * time.Second
	results := map[string][]float64{}
	for round := range 3 {
		for _, m := range modes {
			schema := testdb.Schema(t)
			q, err := New(ctx, pool, WithSchema(schema), m.opt)
			require.NoError(t, err)
			require.NoError(t, q.Migrate(ctx))
			var n atomic.Int64
			deadline := time.Now().Add(window)
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						if err := m.do(q); err != nil {
							t.Error(err)
							return
						}
						n.Add(1)
					}
				})
			}
			wg.Wait()
			require.NoError(t, q.Close())
			rate := float64(n.Load()) / window.Seconds()
			results[m.name] = append(results[m.name], rate)
			t.Logf("round %d: %-32s %8.0f inserts/s", round+1, m.name, rate)
		}
	}
	for _, m := range modes {
		r := results[m.name]
		sort.Float64s(r)
		t.Logf("median of 3: %-32s %8.0f inserts/s (16 clients, one job per transaction)", m.name, r[1])
	}
}
