package backlogui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/backlogui/internal/seed"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestMeasurePages measures each page's server time (the handler alone,
// median of 11) with 1,000,000 finished jobs in the history (10 types,
// one in 100 failed, over a week; their counters with wait and run time
// histograms, the minutes over 4 shards) and 10,000 live ones, plus the
// seed's jobs. Only with BACKLOG_MEASURE=1 (make measure); BACKLOG_MEASURE_ROWS
// changes the 1,000,000.
func TestMeasurePages(t *testing.T) {
	if os.Getenv("BACKLOG_MEASURE") == "" {
		t.Skip("set BACKLOG_MEASURE=1 to run (make measure)")
	}
	rows := 1_000_000
	if r := os.Getenv("BACKLOG_MEASURE_ROWS"); r != "" {
		_, err := fmt.Sscan(r, &rows)
		require.NoError(t, err)
	}
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	q, err := backlog.New(ctx, pool, backlog.WithSchema(schema), backlog.WithLogger(quiet()))
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	require.NoError(t, q.Migrate(ctx))
	jobs, err := seed.Enqueue(ctx, q, 3)
	require.NoError(t, err)
	s := `"` + schema + `"`
	start := time.Now()
	span := int64(7 * 24 * time.Hour / time.Millisecond)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.job_history (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
			timeout_ms, errors, last_error, created_at, started_at, finished_at, expires_at)
		SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid,
		       'type.' || (g % 10), '{"n":1}', '{}', CASE WHEN g % 100 = 0 THEN 'failed' ELSE 'completed' END, 0, f, 1, 1, 0, '[]',
		       CASE WHEN g % 100 = 0 THEN 'upstream timeout ' || g END, f, f, f, now() + interval '1 day'
		FROM generate_series(1, $1::bigint) g,
		LATERAL (SELECT now() - (($2::bigint - g * $2::bigint / $1::bigint) || ' milliseconds')::interval AS f) t,
		LATERAL (SELECT lpad(to_hex((extract(epoch FROM f) * 1000)::bigint), 12, '0') AS h, md5(g::text) AS r) x`, rows, span)
	require.NoError(t, err)
	// The counters, with wait and run time histograms of made-up
	// latencies (0 to 65 s, spread by the job's ID; up to 64 slots), and
	// the minutes spread over 4 shards, as 4 finishing processes write
	// them.
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.job_counts_hourly (bucket, type, state, n, wait_ms, run_ms, wait_hist, run_hist)
		SELECT date_trunc('hour', finished_at), type, state, count(*), 0, 0,
		       `+s+`.latency_hist(array_agg((hashtext(id::text) & 65535)::float8)),
		       `+s+`.latency_hist(array_agg((hashtext(id::text) >> 16 & 4095)::float8))
		FROM `+s+`.job_history
		WHERE finished_at < date_trunc('hour', now()) - interval '1 hour' GROUP BY 1, 2, 3`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.job_counts (bucket, type, state, shard, n, wait_ms, run_ms, wait_hist, run_hist)
		SELECT date_trunc('minute', finished_at), type, state, hashtext(id::text) & 3, count(*), 0, 0,
		       `+s+`.latency_hist(array_agg((hashtext(id::text) & 65535)::float8)),
		       `+s+`.latency_hist(array_agg((hashtext(id::text) >> 16 & 4095)::float8))
		FROM `+s+`.job_history
		WHERE finished_at >= date_trunc('hour', now()) - interval '1 hour' GROUP BY 1, 2, 3, 4`)
	require.NoError(t, err)
	// 10,000 live jobs: available, of the same 10 types.
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.jobs (id, type, args, state, run_at)
		SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
		       'type.' || (g % 10), '{"n":2}', 'available', now() - interval '1 minute'
		FROM generate_series(1, 10000) g`)
	require.NoError(t, err)
	// What the cleaner does within a minute: the shards of closed minutes
	// folded into one row.
	_, err = q.Clean(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT `+s+`.summarize_history()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.job_history`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+s+`.jobs`)
	require.NoError(t, err)
	var old string
	require.NoError(t, pool.QueryRow(ctx, `SELECT id::text FROM `+s+`.job_history WHERE state = 'failed' ORDER BY finished_at LIMIT 1`).Scan(&old))
	t.Logf("seeded %d finished and 10,000 live jobs in %s", rows, time.Since(start).Round(time.Second))

	// httptest.NewRequest's Host is example.com.
	h := backlogui.NewHandler(q, backlogui.WithLogger(quiet()), backlogui.WithAllowedHosts("example.com"))
	pages := []string{"/", "/?range=day", "/jobs", "/jobs?state=failed", "/jobs?state=failed&error=timeout+77",
		"/jobs?type=type.3", "/jobs?state=available&type=type.3", "/jobs?okey=" + seed.ChainKey,
		"/jobs/" + old, "/jobs/" + jobs.DAGMid.String(), "/jobs/" + jobs.Chain[1].String(),
		"/jobs/confirm?action=retry&state=failed&error=timeout+77", "/jobs/confirm?action=retry&state=failed",
		"/types", "/schedules", "/processes"}
	for _, p := range pages {
		var ds []time.Duration
		var size int
		for range 11 {
			req := httptest.NewRequest(http.MethodGet, p, nil)
			rec := httptest.NewRecorder()
			s := time.Now()
			h.ServeHTTP(rec, req)
			ds = append(ds, time.Since(s))
			require.Equal(t, http.StatusOK, rec.Code, "%s: %s", p, rec.Body.String())
			size = rec.Body.Len()
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("page %-60s median %7s  max %7s  (%d bytes)", p, ds[len(ds)/2].Round(100*time.Microsecond),
			ds[len(ds)-1].Round(100*time.Microsecond), size)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-Backlog-Live", "1")
	var ds []time.Duration
	for range 11 {
		rec := httptest.NewRecorder()
		s := time.Now()
		h.ServeHTTP(rec, req)
		ds = append(ds, time.Since(s))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	t.Logf("overview live refresh: median %s (Stats: 5 statements, Throughput: 1)", ds[len(ds)/2].Round(100*time.Microsecond))
	// The types page reuses its percentiles for 10 s: what reading them
	// costs when it does.
	for _, w := range []time.Duration{time.Hour, 24 * time.Hour} {
		ds = ds[:0]
		for range 11 {
			s := time.Now()
			_, err := q.Latency(ctx, time.Now().Add(-w))
			require.NoError(t, err)
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("Latency over the last %s (the types page's percentiles, read at most every 10 s): median %s  max %s", w,
			ds[len(ds)/2].Round(100*time.Microsecond), ds[len(ds)-1].Round(100*time.Microsecond))
	}
}
