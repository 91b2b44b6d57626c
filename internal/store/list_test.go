package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// seedHistory inserts n finished jobs into job_history (UUIDv7 IDs a
// millisecond apart, ending now; every 50th failed with an error, every
// 7th of type b, every 11th tagged) and a few live ones into jobs.
func seedHistory(t *testing.T, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.history+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
		timeout_ms, errors, last_error, unique_key, created_at, started_at, finished_at, expires_at)
	SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid,
	       CASE WHEN g % 7 = 0 THEN 'b' ELSE 'a' END, '{}', CASE WHEN g % 11 = 0 THEN '{"region":"eu"}' ELSE '{}' END::jsonb,
	       CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'completed' END, 0, now(), 1, 25, 0, '[]',
	       CASE WHEN g % 50 = 0 THEN 'boom 100% _x_ ' || g END, 'u' || g, now(), now(), now() - (($1 - g) || ' milliseconds')::interval,
	       now() + interval '1 day'
	FROM generate_series(1, $1) g,
	LATERAL (SELECT lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - $1 + g), 12, '0') AS h, md5(g::text) AS r) x`, n)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `INSERT INTO `+s.jobs+` (id, type, args, state, run_at, unique_key, ordering_key)
	SELECT gen_random_uuid(), 'a', '{}', 'scheduled', now() + interval '1 hour', 'live' || g, 'k' || (g % 3) FROM generate_series(1, 20) g`)
	require.NoError(t, err)
	// The counters finish() and retire() write with every row.
	_, err = s.pool.Exec(ctx, `INSERT INTO "`+s.schema+`".job_counts (bucket, type, state, shard, n, wait_ms, run_ms)
	SELECT date_trunc('minute', finished_at), type, state, 0, count(*), 0, 0 FROM `+s.history+` GROUP BY 1, 2, 3`)
	require.NoError(t, err)
	_, err = s.SummarizeHistory(ctx) // as the maintenance loop does
	require.NoError(t, err)
	for _, tbl := range []string{s.history, s.jobs} {
		_, err = s.pool.Exec(ctx, `ANALYZE `+tbl)
		require.NoError(t, err)
	}
}

// TestListIsBoundedOnAMillionJobs: with 1,000,000 finished jobs, every
// listing statement a filter makes reads a bounded number of buffers (a
// few thousand, against about 18,700 pages for the table), whatever it
// matches.
func TestListIsBoundedOnAMillionJobs(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	seedHistory(t, s, n)
	var pages int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(relpages) FROM pg_class WHERE relname LIKE 'job_history_p%' AND relnamespace = $1::regnamespace`, s.schema).Scan(&pages))
	tags, _ := json.Marshal(map[string]string{"region": "eu"})
	now := time.Now()
	filters := map[string]ListQuery{
		"everything":             {},
		"failed":                 {States: []string{"failed"}},
		"failed of type b":       {States: []string{"failed"}, Types: []string{"b"}},
		"completed":              {States: []string{"completed"}},
		"type b":                 {Types: []string{"b"}},
		"tags":                   {Tags: tags},
		"error text":             {ErrorContains: "100%"},
		"failed, error text":     {States: []string{"failed"}, ErrorContains: "boom"},
		"unique key (finished)":  {UniqueKey: "u12345"},
		"unique key (live)":      {UniqueKey: "live3"},
		"ordering key":           {OrderingKey: "k1"},
		"created in a minute":    {CreatedFrom: now.Add(-10 * time.Minute), CreatedTo: now.Add(-9 * time.Minute)},
		"finished in a minute":   {FinishedFrom: now.Add(-10 * time.Minute), FinishedTo: now.Add(-9 * time.Minute)},
		"nothing matches":        {Types: []string{"nope"}},
		"live only":              {States: []string{"scheduled", "available"}},
		"by IDs":                 {IDs: []uuid.UUID{uuid.New(), uuid.New()}},
		"type, tags, error, key": {Types: []string{"a"}, Tags: tags, ErrorContains: "boom", UniqueKey: "u550"},
	}
	for name, f := range filters {
		for _, oldest := range []bool{false, true} {
			f.Limit, f.Scan, f.Oldest = 50, DefaultScan, oldest
			// The statements of one page, each explained as it runs.
			var worst int
			s.explain = func(sql string, args []any) {
				b := explainBuffers(t, s, sql, args)
				worst = max(worst, b)
			}
			res, err := s.List(ctx, f)
			s.explain = nil
			require.NoError(t, err, name)
			require.LessOrEqual(t, len(res.Rows), 50, name)
			// At worst every row read is on a page of its own, plus index
			// pages: bounded by the scan, not by the table.
			require.Less(t, worst, DefaultScan*3/2, "%s (oldest %v): a statement read %d buffers; the table has %d pages", name, oldest, worst, pages)
			t.Logf("%-24s oldest=%-5v rows %2d, read %5d rows, worst statement %4d buffers", name, oldest, len(res.Rows), res.Scanned, worst)
		}
	}
}

// explainBuffers runs sql under EXPLAIN (ANALYZE, BUFFERS) and returns the
// shared buffers it touched.
func explainBuffers(t *testing.T, s *Store, sql string, args []any) int {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true),
		set_config('max_parallel_workers_per_gather', '0', true)`) // as List runs them
	require.NoError(t, err)
	var plan []map[string]any
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql, args...).Scan(&plan))
	p := plan[0]["Plan"].(map[string]any)
	return int(p["Shared Hit Blocks"].(float64) + p["Shared Read Blocks"].(float64))
}

// TestListPagesSeeEveryJobOnce: walking a listing page by page, newest or
// oldest first, with a filter or none, returns each matching job once,
// across live and finished jobs, in order.
func TestListPagesSeeEveryJobOnce(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	seedHistory(t, s, 5000)
	count := func(where string) int {
		var c int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT id, type, state, last_error FROM `+s.jobs+`
			UNION ALL SELECT id, type, state, last_error FROM `+s.history+`) j WHERE `+where).Scan(&c))
		return c
	}
	for _, c := range []struct {
		f     ListQuery
		where string
	}{
		{ListQuery{}, "true"},
		{ListQuery{States: []string{"failed"}}, "state = 'failed'"},
		{ListQuery{Types: []string{"b"}}, "type = 'b'"},
		{ListQuery{ErrorContains: "_x_"}, "last_error LIKE '%\\_x\\_%'"},
	} {
		for _, oldest := range []bool{false, true} {
			f := c.f
			f.Limit, f.Scan, f.Oldest = 37, 400, oldest // small pages and budgets: many pages
			seen := listAll(ctx, t, s, f, 10_000)
			require.Equal(t, count(c.where), len(seen), fmt.Sprintf("%+v oldest %v", c.f, oldest))
		}
	}
}

// listAll reads the listing f page by page (at most maxPages) and returns
// the jobs it listed, checking that none is listed twice and that each
// comes after the one before (requireInOrder).
func listAll(ctx context.Context, t *testing.T, s *Store, f ListQuery, maxPages int) map[uuid.UUID]bool {
	t.Helper()
	seen := map[uuid.UUID]bool{}
	var prev *Row
	for pages := 0; ; pages++ {
		require.Less(t, pages, maxPages, "the listing does not end")
		res, err := s.List(ctx, f)
		require.NoError(t, err)
		for _, r := range res.Rows {
			require.False(t, seen[r.ID], "job %s listed twice", r.ID)
			seen[r.ID] = true
			if prev != nil {
				requireInOrder(t, *prev, r, f.Oldest)
			}
			prev = &r
		}
		if res.Next == nil {
			return seen
		}
		f.After = res.Next
	}
}

// requireInOrder checks that b comes after a in a listing: newest first,
// live jobs (by ID) before finished ones (by finish time and ID); oldest
// first, the other way round.
func requireInOrder(t *testing.T, a, b Row, oldest bool) {
	t.Helper()
	fa, fb := a.FinishedAt != nil, b.FinishedAt != nil
	if fa != fb {
		require.Equal(t, oldest, fa, "live and finished jobs interleave")
		return
	}
	c := 0
	if fa {
		c = a.FinishedAt.Compare(*b.FinishedAt)
	}
	if c == 0 {
		c = bytes.Compare(a.ID[:], b.ID[:])
	}
	if oldest {
		require.Negative(t, c, "out of order: %s then %s", a.ID, b.ID)
	} else {
		require.Positive(t, c, "out of order: %s then %s", a.ID, b.ID)
	}
}

// TestListSkipsTheCountsOfDeletedJobs: the counters also count the jobs
// deleted at completion (WithDiscardCompleted, state 'discarded'), which
// job_history does not hold. List sizes its windows of job_history by the
// counters of the jobs it holds: before, ten million deleted jobs over a
// day cut a page into windows of a few hundred microseconds each, nearly
// all empty, thousands of statements a page.
func TestListSkipsTheCountsOfDeletedJobs(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newTestStore(t)
	seedHistory(t, s, 1000)
	_, err := s.pool.Exec(ctx, `INSERT INTO "`+s.schema+`".job_counts (bucket, type, state, shard, n, wait_ms, run_ms)
	SELECT date_trunc('minute', now()) - g * interval '1 minute', 'a', 'discarded', 0, 7000, 0, 0 FROM generate_series(0, 1439) g`)
	require.NoError(t, err)
	for _, oldest := range []bool{false, true} {
		statements := 0
		s.explain = func(string, []any) { statements++ }
		res, err := s.List(ctx, ListQuery{States: []string{"completed"}, Limit: 50, Scan: DefaultScan, Oldest: oldest})
		s.explain = nil
		require.NoError(t, err)
		require.Len(t, res.Rows, 50)
		require.Less(t, statements, 20, "oldest %v: one page took %d statements", oldest, statements)
	}
	rows, err := s.FinishedCounts(ctx, time.Now().Add(-48*time.Hour))
	require.NoError(t, err)
	var completed int64
	for _, r := range rows {
		require.NotEqual(t, "discarded", r.State, "readers count deleted jobs as completed")
		if r.State == "completed" && r.Type == "a" {
			completed = r.Count
		}
	}
	require.Greater(t, completed, int64(1440*7000), "deleted jobs are counted as completed")
}

// TestListFindsTheJobsOfABurst: the counters say how many jobs finished
// in a minute, not when in it. With a minute's 50,000 jobs finished within
// one second of it, the windows cut in proportion (2.4 s for a budget of
// 2,000) came back empty for the rest of the minute, one statement each:
// about 25 statements for a page, each one a scan of the BRIN indexes,
// whose cost grows with job_history (a day of 10,000,000 jobs: 1.5 ms a
// statement). The first page, newest or oldest first, now takes a few,
// and holds the right jobs.
func TestListFindsTheJobsOfABurst(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	// Newest: a burst at second 1 of the minute two minutes ago. Oldest:
	// one at second 58 of the minute twelve minutes ago.
	for _, at := range []string{"interval '-2 minutes 1 second'", "interval '-12 minutes 58 seconds'"} {
		_, err := pool.Exec(ctx, `INSERT INTO `+s.history+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
			timeout_ms, errors, created_at, started_at, finished_at, expires_at)
		SELECT gen_random_uuid(), 'a', '{}', '{}', 'completed', 0, f, 1, 25, 0, '[]', f, f, f, f + interval '1 day'
		FROM generate_series(1, 50000) g,
		LATERAL (SELECT date_trunc('minute', now()) + `+at+` + g * interval '20 microseconds' AS f) x`)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO "`+s.schema+`".job_counts (bucket, type, state, shard, n, wait_ms, run_ms)
	SELECT date_trunc('minute', finished_at), type, state, 0, count(*), 0, 0 FROM `+s.history+` GROUP BY 1, 2, 3`)
	require.NoError(t, err)
	_, err = s.SummarizeHistory(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+s.history)
	require.NoError(t, err)
	for _, oldest := range []bool{false, true} {
		order := "DESC"
		if oldest {
			order = "ASC"
		}
		rows, err := pool.Query(ctx, `SELECT id FROM `+s.history+` ORDER BY finished_at `+order+`, id `+order+` LIMIT 50`)
		require.NoError(t, err)
		want, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		require.NoError(t, err)
		statements := 0
		s.explain = func(string, []any) { statements++ }
		res, err := s.List(ctx, ListQuery{States: []string{"completed"}, Limit: 50, Scan: DefaultScan, Oldest: oldest})
		s.explain = nil
		require.NoError(t, err)
		got := make([]uuid.UUID, len(res.Rows))
		for i, r := range res.Rows {
			got[i] = r.ID
		}
		require.Equal(t, want, got, "oldest %v", oldest)
		t.Logf("oldest %v: %d statements, %d rows read", oldest, statements, res.Scanned)
		require.LessOrEqual(t, statements, 12, "oldest %v: one page took %d statements", oldest, statements)

		// Page by page, every job once, in order (windows over the cap
		// are left unread, not skipped).
		f := ListQuery{Limit: 2000, Scan: DefaultScan, Oldest: oldest}
		seen := listAll(ctx, t, s, f, 1000)
		require.Len(t, seen, 100_000, "oldest %v", oldest)
	}
}
