package backlog

import (
	"context"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// TestMeasureGraph measures Graph around finished jobs with 1,000,000 of
// them in job_history (every one in one of 1,000 ordering keys, a third
// dependents of one job, one in 100 cancelled by another), and what
// migration 0016's indexes cost to build on that history. Only with
// BACKLOG_MEASURE=1 (make measure).
func TestMeasureGraph(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	const rows = 1_000_000
	ctx := context.Background()
	pool := testdb.Pool(t)
	defer testdb.Close()
	schema := testdb.Schema(t)
	q, err := New(ctx, pool, WithSchema(schema))
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Migrate(ctx))
	hist, jobs := `"`+schema+`".job_history`, `"`+schema+`".jobs`
	fanOut, canceller := NewID(), NewID()
	start := time.Now()
	_, err = pool.Exec(ctx, `INSERT INTO `+hist+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
		timeout_ms, errors, last_error, ordering_key, prereqs, created_at, started_at, finished_at, expires_at)
	SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid,
	       'type.' || (g % 10), '{"n":1}', '{}', CASE WHEN g % 100 = 0 THEN 'cancelled' ELSE 'completed' END, 0, f, 1, 25, 0, '[]',
	       CASE WHEN g % 100 = 0 THEN 'cancelled: prerequisite ' || $3::text || ' failed' END, 'k' || (g % 1000),
	       CASE g % 3 WHEN 0 THEN ARRAY[$2::uuid] WHEN 1 THEN ARRAY[md5(g::text)::uuid] END,
	       f, f, f, now() + interval '1 day'
	FROM generate_series(1, $1::bigint) g,
	LATERAL (SELECT now() - (($1::bigint - g) || ' milliseconds')::interval AS f) t,
	LATERAL (SELECT lpad(to_hex((extract(epoch FROM f) * 1000)::bigint), 12, '0') AS h, md5(g::text) AS r) x`,
		rows, fanOut, canceller.String())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+hist+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
		timeout_ms, errors, created_at, finished_at, expires_at)
	SELECT id, 'root', '{}', '{}', st, 0, now(), 1, 25, 0, '[]', now(), now(), now() + interval '1 day'
	FROM unnest($1::uuid[], $2::text[]) AS u(id, st)`, []uuid.UUID{fanOut, canceller}, []string{"completed", "failed"})
	require.NoError(t, err)
	// A live job that waited for 100 of them, and 10,000 live jobs.
	wide := NewID()
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, state, prereqs)
	SELECT $1, 'wide', '{}', 'available', ARRAY(SELECT id FROM `+hist+` TABLESAMPLE SYSTEM (1) LIMIT 100)`, wide)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, state, ordering_key)
	SELECT gen_random_uuid(), 'type.' || (g % 10), '{}', 'available', CASE WHEN g % 2 = 0 THEN 'k' || (g % 1000) END
	FROM generate_series(1, 10000) g`)
	require.NoError(t, err)
	// A live chain: prerequisite, job, dependent.
	up, err := q.Enqueue(ctx, "up", nil, Delay(time.Hour))
	require.NoError(t, err)
	mid, err := q.Enqueue(ctx, "mid", nil, DependsOn(up))
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "down", nil, DependsOn(mid))
	require.NoError(t, err)
	_, err = q.store.SummarizeHistory(ctx)
	require.NoError(t, err)
	for _, tbl := range []string{hist, jobs} {
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+tbl)
		require.NoError(t, err)
	}
	t.Logf("seeded %d finished jobs and 10,004 live ones in %s", rows, time.Since(start).Round(time.Second))

	// Migration 0016 on this history: its indexes built again.
	_, err = q.MigrateDown(ctx, 1)
	require.NoError(t, err)
	s0 := time.Now()
	require.NoError(t, q.Migrate(ctx))
	t.Logf("migration 0016 (3 indexes of job_history built, one dropped) on %d finished jobs: %s", rows,
		time.Since(s0).Round(time.Millisecond))
	_, err = pool.Exec(ctx, `ANALYZE `+hist)
	require.NoError(t, err)

	var sample []uuid.UUID
	// Finished jobs from anywhere in the history, each with a finished
	// prerequisite and its key's neighbours.
	r, err := pool.Query(ctx, `SELECT id FROM `+hist+` WHERE prereqs = ARRAY[$1::uuid] ORDER BY random() LIMIT 11`, fanOut)
	require.NoError(t, err)
	sample, err = pgx.CollectRows(r, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.NotEmpty(t, sample)
	median := func(f func(i int)) time.Duration {
		var ds []time.Duration
		for i := range 11 {
			s := time.Now()
			f(i)
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	var g *JobGraph
	d := median(func(i int) {
		g, err = q.Graph(ctx, sample[i%len(sample)])
		require.NoError(t, err)
	})
	t.Logf("Graph of a finished job (a finished prerequisite, its key's neighbours): %d prerequisites, %d dependents; median %s",
		len(g.Prerequisites), len(g.Dependents), d)
	for _, c := range []struct {
		what string
		id   uuid.UUID
	}{{"a live job between two live ones", mid}, {"a prerequisite of 333,333 finished jobs", fanOut},
		{"a job that cancelled 10,000", canceller},
		{"a live job whose 100 prerequisites finished", wide}} {
		d := median(func(int) {
			g, err = q.Graph(ctx, c.id)
			require.NoError(t, err)
		})
		t.Logf("Graph of %s: %d (+%d) prerequisites, %d (+%d, at least: %v) dependents; median %s", c.what,
			len(g.Prerequisites), g.MorePrerequisites, len(g.Dependents), g.MoreDependents, g.DependentsAtLeast, d)
	}
}
