package store

import (
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// newTestStore migrates a fresh schema and returns a store on it.
func newTestStore(t *testing.T) (*Store, *pgxpool.Pool, string) {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	_, err = migrate.Up(context.Background(), pool, schema, ms)
	require.NoError(t, err)
	return New(pool, schema), pool, schema
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
	stmts := statements(s)
	for _, name := range slices.Sorted(maps.Keys(stmts)) {
		_, err := conn.Conn().Prepare(context.Background(), "", stmts[name])
		require.NoError(t, err, "statement %s:\n%s", name, stmts[name])
	}
	require.Greater(t, len(stmts), 40)
}

// TestSchemaNamesTheStatementsUse: a schema whose name holds words of the
// statements (meta, progress) builds every statement and each prepares.
// New panicked for such names while two statements were derived from
// others by replacing and counting those words.
func TestSchemaNamesTheStatementsUse(t *testing.T) {
	pool := testdb.Pool(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	ctx := context.Background()
	for _, word := range []string{"meta", "progress"} {
		schema := word + "_" + testdb.Schema(t)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			require.NoError(t, err)
		})
		_, err = migrate.Up(ctx, pool, schema, ms)
		require.NoError(t, err)
		var s *Store
		require.NotPanics(t, func() { s = New(pool, schema) }, schema)
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		for name, sql := range statements(s) {
			_, err := conn.Conn().Prepare(ctx, "", sql)
			require.NoError(t, err, "schema %s, statement %s", schema, name)
		}
		conn.Release()
	}
}

// statements are every statement of s, by the path of its field (every
// string field of the statement structs is a statement).
func statements(s *Store) map[string]string {
	out := map[string]string{}
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f, name := v.Field(i), path+v.Type().Field(i).Name
			switch f.Kind() {
			case reflect.Struct:
				walk(f, name+".")
			case reflect.String:
				out[name] = f.String()
			}
		}
	}
	walk(reflect.ValueOf(s.sql), "sql.")
	walk(reflect.ValueOf(s.fin), "fin.")
	walk(reflect.ValueOf(s.graph), "graph.")
	walk(reflect.ValueOf(s.maint), "maint.")
	walk(reflect.ValueOf(s.hist), "hist.")
	walk(reflect.ValueOf(s.counts), "counts.")
	walk(reflect.ValueOf(s.control), "control.")
	walk(reflect.ValueOf(s.retry), "retry.")
	walk(reflect.ValueOf(s.in), "in.")
	walk(reflect.ValueOf(s.procs), "procs.")
	walk(reflect.ValueOf(s.sched), "sched.")
	walk(reflect.ValueOf(s.okeys), "okeys.")
	walk(reflect.ValueOf(s.nb), "nb.")
	return out
}

// TestClaimPlanStaysOnTheIndexes guards against the cached-plan trap: plans
// the claim function caches while the table is empty must not scan the
// table sequentially once it has grown.
func TestClaimPlanStaysOnTheIndexes(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// An analysed empty table is what makes a cached plan a sequential
	// scan (reproduced: 27 ms per claim at 100,000 rows without the guard).
	_, err = pool.Exec(ctx, `ANALYZE "`+schema+`".jobs`)
	require.NoError(t, err)
	claim := func(types []string, k int) {
		rows, err := conn.Query(ctx, s.sql.claim, Mode, types, `{}`, k, k, 30000, "w", nil, 0)
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
		rows, err := tx.Query(ctx, s.sql.claim, Mode, types, `{}`, 3, 3, 30000, "w", nil, 0)
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

// TestScheduledJobsStayOutOfTheClaimPath: with a million jobs scheduled
// next week, a claim that comes back short, the check for skipped jobs and
// the promoter read a handful of index entries, not the scheduled ones.
func TestScheduledJobsStayOutOfTheClaimPath(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	jobs := `"` + schema + `".jobs`
	// IDs in order (like UUIDv7s), so the seeding appends to the index.
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, state, priority, run_at)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, '{}', 'scheduled', g % 3,
		       now() + interval '7 days' + g * interval '1 millisecond'
		FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, priority) SELECT gen_random_uuid(), 'a', '{}', g % 3 FROM generate_series(1, 5) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+jobs)
	require.NoError(t, err)

	// blocks runs sql under EXPLAIN (ANALYZE, BUFFERS), rolled back, and
	// returns the shared buffers it touched, the function's own statements
	// included.
	// The second run on one connection: the first also reads the catalogs
	// while it plans.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	blocks := func(sql string, args ...any) int {
		n := 0
		for range 2 {
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			var plan []map[string]any
			require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql, args...).Scan(&plan))
			require.NoError(t, tx.Rollback(ctx))
			p := plan[0]["Plan"].(map[string]any)
			n = int(p["Shared Hit Blocks"].(float64) + p["Shared Read Blocks"].(float64))
		}
		return n
	}
	// A process of an older version inserts jobs due later as available:
	// claims still leave them until they are due.
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, run_at) VALUES (gen_random_uuid(), 'a', '{}', now() + interval '1 hour')`)
	require.NoError(t, err)
	for _, types := range [][]string{{"a"}, {"a", "b"}} {
		b := blocks(s.sql.claim, types, `{}`, 100, 100, 30000, "w", nil, 0)
		require.Less(t, b, 200, "a short claim of %v read the scheduled jobs (%d buffers)", types, b)
	}
	b := blocks(s.hist.promote, 1000)
	require.Less(t, b, 200, "the promoter read the scheduled jobs (%d buffers)", b)
}

// TestFinishStatuses: the one-statement finish writes what it may and says
// why it left the rest: a job with a dependent goes to the transactional
// path untouched, a stale token is refused, a row another transaction
// holds is busy.
func TestFinishStatuses(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	jobs := `"` + schema + `".jobs`
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args) SELECT gen_random_uuid(), 'a', '{}' FROM generate_series(1, 6)`)
	require.NoError(t, err)
	res, err := s.Claim(ctx, []string{"a"}, []byte(`{}`), 6, 6, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, res.Jobs, 6)
	done, retry, withDep, stale, busy, cancelled := res.Jobs[0], res.Jobs[1], res.Jobs[2], res.Jobs[3], res.Jobs[4], res.Jobs[5]
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".job_edges (prereq, job, kind) VALUES ($1, gen_random_uuid(), 'depends')`, withDep.ID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET cancel_requested = true WHERE id = $1`, cancelled.ID)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+jobs+` WHERE id = $1 FOR KEY SHARE`, busy.ID)
	require.NoError(t, err)

	msg := "boom"
	out, err := s.Finish(ctx, []Finish{
		{ID: done.ID, Token: done.Token, State: "completed", Result: []byte(`{"ok":1}`)},
		{ID: retry.ID, Token: retry.Token, State: "available", Delay: time.Hour, Err: &msg},
		{ID: withDep.ID, Token: withDep.Token, State: "completed"},
		{ID: stale.ID, Token: done.Token, State: "completed"},
		{ID: busy.ID, Token: busy.Token, State: "completed"},
		{ID: cancelled.ID, Token: cancelled.Token, State: "available", Err: &msg},
	})
	require.NoError(t, err)
	require.Equal(t, map[uuid.UUID]FinishStatus{done.ID: Written, retry.ID: Written, withDep.ID: Graph, stale.ID: Refused,
		busy.ID: Busy, cancelled.ID: Written}, out.Status)
	require.Equal(t, map[uuid.UUID]string{done.ID: "completed", retry.ID: "scheduled", cancelled.ID: "cancelled"}, out.State)

	where := func(id uuid.UUID) (table, state string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT 'jobs', state FROM `+jobs+` WHERE id = $1
			UNION ALL SELECT 'job_history', state FROM "`+schema+`".job_history WHERE id = $1`, id).Scan(&table, &state))
		return table, state
	}
	for _, c := range []struct {
		id           uuid.UUID
		table, state string
	}{{done.ID, "job_history", "completed"}, {retry.ID, "jobs", "scheduled"}, {withDep.ID, "jobs", "running"},
		{stale.ID, "jobs", "running"}, {busy.ID, "jobs", "running"}, {cancelled.ID, "job_history", "cancelled"}} {
		table, state := where(c.id)
		require.Equal(t, c.table+" "+c.state, table+" "+state, c.id)
	}
	var lastErr string
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_error FROM "`+schema+`".job_history WHERE id = $1`, cancelled.ID).Scan(&lastErr))
	require.Equal(t, "cancelled by request; its last attempt ended with: boom", lastErr)
}

// TestFinishSendsDoneNotices: a job someone waits for (Queue.Wait marks
// it) announces its end from the one-statement finish.
func TestFinishSendsDoneNotices(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args) VALUES (gen_random_uuid(), 'a', '{}')`)
	require.NoError(t, err)
	res, err := s.Claim(ctx, []string{"a"}, []byte(`{}`), 1, 1, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, res.Jobs, 1)
	j := res.Jobs[0]
	conn, err := pgx.Connect(ctx, testdb.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `LISTEN `+pgx.Identifier{s.Channel()}.Sanitize())
	require.NoError(t, err)
	w, err := s.MarkWaiting(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, "running", w.State)

	out, err := s.Finish(ctx, []Finish{{ID: j.ID, Token: j.Token, State: "completed"}})
	require.NoError(t, err)
	require.Equal(t, Written, out.Status[j.ID])
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	require.NoError(t, err, "no completion notice")
	require.JSONEq(t, `{"done":"`+j.ID.String()+`"}`, n.Payload)
}

// TestFinishRefusesTwoOutcomesOfOneJob: a batch with two outcomes of one
// job (a stale attempt's and the current one) is refused before anything
// is written: each job's status is reported once.
func TestFinishRefusesTwoOutcomesOfOneJob(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args) VALUES (gen_random_uuid(), 'a', '{}')`)
	require.NoError(t, err)
	res, err := s.Claim(ctx, []string{"a"}, []byte(`{}`), 1, 1, time.Minute, "w", nil)
	require.NoError(t, err)
	j := res.Jobs[0]
	_, err = s.Finish(ctx, []Finish{{ID: j.ID, Token: uuid.New(), State: "completed"}, {ID: j.ID, Token: j.Token, State: "completed"}})
	require.ErrorContains(t, err, "appears twice")
	r, err := s.Get(ctx, pool, j.ID)
	require.NoError(t, err)
	require.Equal(t, "running", r.State, "nothing was written")
}

// TestHistoryPartitionTakesItsDayFromTheDefault: jobs that finished into
// a day without its partition (it could not be made in time) land in the
// default partition, and move into the day's partition once it is made.
func TestHistoryPartitionTakesItsDayFromTheDefault(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	s.SetRetention(3*24*time.Hour, 3*24*time.Hour)
	hist := `"` + schema + `".job_history`
	var day string
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_char((now() + interval '3 days') AT TIME ZONE 'UTC', 'YYYYMMDD')`).Scan(&day))
	_, err := pool.Exec(ctx, `DROP TABLE `+hist+`_p`+day)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args) SELECT gen_random_uuid(), 'a', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	res, err := s.Claim(ctx, []string{"a"}, []byte(`{}`), 3, 3, time.Minute, "w", nil)
	require.NoError(t, err)
	var fs []Finish
	for _, j := range res.Jobs {
		fs = append(fs, Finish{ID: j.ID, Token: j.Token, State: "completed"})
	}
	_, err = s.Finish(ctx, fs)
	require.NoError(t, err)
	count := func(table string) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}
	require.Equal(t, 3, count(hist+`_default`))
	made, err := s.EnsurePartitions(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, made)
	require.Equal(t, 0, count(hist+`_default`))
	require.Equal(t, 3, count(hist+`_p`+day))
	for _, j := range res.Jobs {
		r, err := s.Get(ctx, pool, j.ID)
		require.NoError(t, err)
		require.Equal(t, "completed", r.State)
	}
}

// TestIDRanges: IDs made within the gap of each other share a range;
// ranges come out in order whatever order the IDs came in.
func TestIDRanges(t *testing.T) {
	at := func(ms int64, last byte) uuid.UUID {
		var id uuid.UUID
		binary.BigEndian.PutUint64(id[:8], uint64(ms)<<16)
		id[6], id[15] = 0x70, last
		return id
	}
	a, b, c, d := at(1_000, 1), at(1_500, 2), at(2_600, 3), at(2_600, 4)
	lo, hi := idRanges([]uuid.UUID{d, a, c, b}, 1000)
	require.Equal(t, []uuid.UUID{a, c}, lo)
	require.Equal(t, []uuid.UUID{b, d}, hi)
	require.Equal(t, int64(2_600), v7ms(c))
	lo, hi = idRanges(nil, 1000)
	require.Empty(t, lo)
	require.Empty(t, hi)
}

func TestDropRepeats(t *testing.T) {
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	for _, tc := range []struct{ in, want []uuid.UUID }{
		{nil, nil},
		{[]uuid.UUID{a}, []uuid.UUID{a}},
		{[]uuid.UUID{a, b, c}, []uuid.UUID{a, b, c}},
		// A job listing its prerequisites from its enqueue, released by a
		// process of version 13 (which appends the completed ones).
		{[]uuid.UUID{a, b, a, b}, []uuid.UUID{a, b}},
		{[]uuid.UUID{c, a, b, a, c}, []uuid.UUID{c, a, b}},
	} {
		in := slices.Clone(tc.in)
		require.Equal(t, tc.want, dropRepeats(in))
		require.Equal(t, tc.in, in, "the input is left alone")
	}
}

// TestClaimReturnsJobsInTheOrderItChoseThem: a claim's rows come back in
// the order the claim chose them (most urgent first; round-robin across
// concurrency keys), which is the order the acquirer hands them out. The
// final UPDATE meets the rows in heap order, so before the claim sorted
// its RETURNING rows, a claim of 310 returned the ten urgent jobs last
// (they were inserted last) and a claim of the big key's 300 jobs and 20
// small keys' 3 each returned the small keys' jobs after every big one:
// a large prefetched claim then started them behind the big key's.
func TestClaimReturnsJobsInTheOrderItChoseThem(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	jobs := `"` + schema + `".jobs`
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, priority, concurrency_key)
		SELECT gen_random_uuid(), 'prio', '{}', 5, NULL FROM generate_series(1, 300)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, priority, concurrency_key)
		SELECT gen_random_uuid(), 'prio', '{}', 1, NULL FROM generate_series(1, 10)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, concurrency_key)
		SELECT gen_random_uuid(), 'keys', '{}', 'big' FROM generate_series(1, 300)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args, concurrency_key)
		SELECT gen_random_uuid(), 'keys', '{}', 'small-' || (g % 20) FROM generate_series(1, 60) g`)
	require.NoError(t, err)

	claim := func(typ string, k int) (prios []int, keys []string) {
		fn := strings.TrimPrefix(s.sql.claim, "SELECT * FROM ")
		rows, err := pool.Query(ctx, `SELECT c.priority, j.concurrency_key FROM `+fn+` WITH ORDINALITY AS c
			JOIN `+jobs+` j ON j.id = c.id ORDER BY c.ordinality`,
			Mode, []string{typ}, `{}`, k, k, 30000, "w", nil, 0)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var p int
			var key *string
			require.NoError(t, rows.Scan(&p, &key))
			prios = append(prios, p)
			if key != nil {
				keys = append(keys, *key)
			}
		}
		require.NoError(t, rows.Err())
		return prios, keys
	}
	prios, _ := claim("prio", 310)
	require.Len(t, prios, 310)
	require.True(t, slices.IsSorted(prios), "the claim's jobs are not most urgent first: %v", prios[:20])

	_, keys := claim("keys", 360)
	require.Len(t, keys, 360)
	last := slices.IndexFunc(keys[63:], func(k string) bool { return k != "big" })
	require.Equal(t, -1, last, "a small key's job came after the first 63 (three rounds of 21 keys): %v", keys[:80])
}

// TestClaimOfARepeatedTypeTakesEachJobOnce: a type named twice in the
// claim's types is read once; version 12's claim returned each job twice
// (SKIP LOCKED does not skip a row the claim itself locked).
func TestClaimOfARepeatedTypeTakesEachJobOnce(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args) SELECT gen_random_uuid(), 'a', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	rows, err := pool.Query(ctx, s.sql.claim, Mode, []string{"a", "a", "a"}, `{}`, 10, 10, 30000, "w", nil, 0)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (uuid.UUID, error) {
		var id uuid.UUID
		err := r.Scan(&id, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil)
		return id, err
	})
	require.NoError(t, err)
	require.Len(t, ids, 3)
	seen := map[uuid.UUID]bool{}
	for _, id := range ids {
		require.False(t, seen[id], "job %s returned twice", id)
		seen[id] = true
	}
}

// TestCommitAnswerFromAnotherTimelineIsUnknown: a lost commit is resolved
// by asking whether its transaction ID committed, but only on the
// timeline it ran on. After a failover the new primary hands the old
// primary's unreplicated IDs out again (the HA failover test saw
// "committed" for a write that was lost): an answer from another timeline
// leaves the commit unknown.
func TestCommitAnswerFromAnotherTimelineIsUnknown(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var xid int64
	var tl string
	require.NoError(t, tx.QueryRow(ctx, `SELECT txid_current(), `+timelineSQL).Scan(&xid, &tl))
	require.Len(t, tl, 8)
	require.NoError(t, tx.Commit(ctx))
	lost := errors.New("conn closed")

	require.NoError(t, s.resolveCommit(ctx, xid, tl, lost), "on its own timeline the commit is known")
	err = s.resolveCommit(ctx, xid, "000000FF", lost)
	var unknown *CommitUnknownError
	require.ErrorAs(t, err, &unknown, "an answer from another timeline was taken")
	require.ErrorIs(t, err, lost)
}
