package backlog_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

type ctxKey struct{}

// TestMetadataRoundTrip: metadata from Metadata options and from the
// Enqueuing hook reaches the handler's Job and stays with the job once it
// has finished (Job, List), on the plain and the graph insert paths and
// through a Retry of a finished job; the Enqueued hook gets the context
// Enqueuing returned.
func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	enqueuedCtx := make(chan any, 10)
	e := newEnv(t, backlog.WithHooks(backlog.Hooks{
		Enqueuing: func(ctx context.Context, ev backlog.EnqueueEvent) (context.Context, map[string]string) {
			require.Zero(t, ev.Duration)
			return context.WithValue(ctx, ctxKey{}, ev.Jobs), map[string]string{"hook": "h", "k": "from hook"}
		},
		Enqueued: func(ctx context.Context, ev backlog.EnqueueEvent) { enqueuedCtx <- ctx.Value(ctxKey{}) },
	}))
	got := make(chan map[string]string, 10)
	stop := work(t, e.q, backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
		got <- j.Metadata
		return nil
	}), backlog.Types("meta"))
	defer func() { require.NoError(t, stop()) }()

	want := map[string]string{"hook": "h", "k": "explicit", "a": "1", "unicode": "é ✓"}
	id, err := e.q.Enqueue(ctx, "meta", nil, backlog.Metadata(map[string]string{"k": "explicit", "a": "0"}),
		backlog.Metadata(map[string]string{"a": "1", "unicode": "é ✓"}))
	require.NoError(t, err)
	require.Equal(t, 1, <-enqueuedCtx)
	require.Equal(t, want, <-got)
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, want, info.Metadata)

	// The graph path (a unique key), two jobs in one call.
	ids, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		{Type: "meta", Options: []backlog.EnqueueOption{backlog.UniqueKey("u1")}},
		{Type: "meta", Options: []backlog.EnqueueOption{backlog.OrderingKey("o"), backlog.Metadata(map[string]string{"hook": "mine"})}},
	})
	require.NoError(t, err)
	require.Equal(t, 2, <-enqueuedCtx)
	two := []map[string]string{<-got, <-got}
	require.ElementsMatch(t, []map[string]string{{"hook": "h", "k": "from hook"}, {"hook": "mine", "k": "from hook"}}, two)
	e.waitState(ids[1], 10*time.Second, backlog.StateCompleted)
	page, err := e.q.List(ctx, backlog.Filter{IDs: ids}, backlog.ListOptions{})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 2)
	for _, j := range page.Jobs {
		require.Equal(t, "from hook", j.Metadata["k"])
	}

	// A finished job run again keeps its metadata.
	_, err = e.q.Retry(ctx, id)
	require.NoError(t, err)
	require.Equal(t, want, <-got)
	e.waitJob(id, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State == backlog.StateCompleted && i.Attempt == 2 })
}

// TestMetadataNoneIsNull: a job without metadata (none given, or an empty
// map from the hook) has a NULL column, live and finished, and nil
// Metadata; retire() keeps what a job has.
func TestMetadataNoneIsNull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, backlog.WithHooks(backlog.Hooks{
		Enqueuing: func(ctx context.Context, ev backlog.EnqueueEvent) (context.Context, map[string]string) {
			return nil, map[string]string{}
		},
	}))
	plain, err := e.q.Enqueue(ctx, "none", nil, backlog.Metadata(nil))
	require.NoError(t, err)
	keyed, err := e.q.Enqueue(ctx, "none", nil, backlog.ConcurrencyKey("c"))
	require.NoError(t, err)
	graph, err := e.q.Enqueue(ctx, "none", nil, backlog.UniqueKey("g"))
	require.NoError(t, err)
	// A scheduled job with metadata, cancelled in place and retired.
	later, err := e.q.Enqueue(ctx, "none", nil, backlog.Delay(time.Hour), backlog.UniqueKey("l"),
		backlog.Metadata(map[string]string{"x": "y"}))
	require.NoError(t, err)
	require.Equal(t, 3, e.countLive("meta IS NULL"))
	require.Equal(t, 1, e.countLive("meta = '{\"x\": \"y\"}'::jsonb"))

	done := make(chan map[string]string, 3)
	stop := work(t, e.q, backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
		done <- j.Metadata
		return nil
	}), backlog.Types("none"))
	for range 3 {
		require.Nil(t, <-done)
	}
	require.NoError(t, stop())
	for _, id := range []uuid.UUID{plain, keyed, graph} {
		info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
		require.Nil(t, info.Metadata)
	}
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".job_history WHERE meta IS NULL`).Scan(&n))
	require.Equal(t, 3, n)

	_, err = e.q.Cancel(ctx, later)
	require.NoError(t, err)
	// retire() moves it (the queue's own retirer may be moving it at
	// that moment: its row is then skipped, and moved by the retirer).
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err = e.pool.Exec(ctx, `SELECT "`+e.schema+`".retire(1000, 3600000, 3600000)`)
		require.NoError(t, err)
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".job_history WHERE id = $1 AND meta->>'x' = 'y'`,
			later).Scan(&n))
		if n == 1 || time.Now().After(deadline) {
			break
		}
		<-time.After(10 * time.Millisecond)
	}
	require.Equal(t, 1, n)
	info, err := e.q.Job(ctx, later)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State)
	require.Equal(t, map[string]string{"x": "y"}, info.Metadata)
}

// TestMetadataInvalid: bad metadata, given or from the hook, is an
// *InputError naming the field, and nothing is written.
func TestMetadataInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var fromHook map[string]string
	e := newEnv(t, backlog.WithHooks(backlog.Hooks{
		Enqueuing: func(ctx context.Context, ev backlog.EnqueueEvent) (context.Context, map[string]string) {
			return ctx, fromHook
		},
	}))
	big := strings.Repeat("v", backlog.MaxMetadataBytes)
	cases := map[string]map[string]string{
		"empty key":       {"": "v"},
		"NUL in key":      {"a\x00b": "v"},
		"NUL in value":    {"k": "a\x00b"},
		"invalid UTF-8":   {"k": "\xff"},
		"one value large": {"k": big},
		"too large":       {"a": big[:2100], "b": big[:2100]},
	}
	for name, m := range cases {
		_, err := e.q.Enqueue(ctx, "bad", nil, backlog.Metadata(m))
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie, name)
		require.Equal(t, "metadata", ie.Field, name)
		_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "bad"}, {Type: "bad", Options: []backlog.EnqueueOption{backlog.Metadata(m)}}})
		require.ErrorAs(t, err, &ie, name)
		require.ErrorContains(t, err, "job 1: backlog: invalid metadata", name)
	}
	fromHook = map[string]string{"k": big}
	_, err := e.q.Enqueue(ctx, "bad", nil)
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "metadata", ie.Field)
	require.Zero(t, e.count("true"))

	// Just under the limit is fine.
	fromHook = map[string]string{"k": big[:backlog.MaxMetadataBytes-len(`{"k":""}`)]}
	_, err = e.q.Enqueue(ctx, "bad", nil)
	require.NoError(t, err)
}

// TestMetadataExecModes: the claim's text columns (a pool whose statements
// are not described, as behind PgBouncer) carry metadata too.
func TestMetadataExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testdb.URL())
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.MaxConns = 4
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close) // after the queue's Close, registered below
			e := &env{t: t, pool: pool, schema: testdb.Schema(t)}
			e.q = e.queue(pool)
			require.NoError(t, e.q.Migrate(ctx))
			want := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
			with, err := e.q.Enqueue(ctx, "mode", nil, backlog.Metadata(want))
			require.NoError(t, err)
			without, err := e.q.Enqueue(ctx, "mode", nil)
			require.NoError(t, err)
			got := make(chan *backlog.Job, 2)
			stop := work(t, e.q, backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
				got <- j
				return nil
			}), backlog.Types("mode"))
			for range 2 {
				j := <-got
				switch j.ID {
				case with:
					require.Equal(t, want, j.Metadata)
				case without:
					require.Nil(t, j.Metadata)
				}
			}
			require.NoError(t, stop())
			require.Equal(t, want, e.waitState(with, 10*time.Second, backlog.StateCompleted).Metadata)
		})
	}
}

// TestMetadataOldClaims: processes of versions 9 and 10 claim through
// claim() with 6 and 5 arguments during a rolling upgrade: same columns
// as before, jobs with metadata included.
func TestMetadataOldClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	for range 2 {
		_, err := e.q.Enqueue(ctx, "old", nil, backlog.Metadata(map[string]string{"a": "b"}))
		require.NoError(t, err)
	}
	fn := pgx.Identifier{e.schema, "claim"}.Sanitize()
	rows, err := e.pool.Query(ctx, `SELECT * FROM `+fn+`('{old}', '{}', 1, 1, 60000, 'w')`)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		require.Len(t, rows.FieldDescriptions(), 16)
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, n)
	rows, err = e.pool.Query(ctx, `SELECT * FROM `+fn+`('{old}', '{}', 1, 60000, 'w')`)
	require.NoError(t, err)
	n = 0
	for rows.Next() {
		require.Len(t, rows.FieldDescriptions(), 14)
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, n)
}

// TestMigration11DownRestoresVersion10: the functions, columns and
// indexes of a schema migrated up and one step down from 0011 are those
// of a schema migrated to 0010.
func TestMigration11DownRestoresVersion10(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 11)
}

// TestMigration12DownRestoresVersion11: the same for 0012 (results down a
// DAG and progress) over 0011 (metadata): claim_jobs, finish(), retire()
// and all_jobs return to their version 11 definitions.
func TestMigration12DownRestoresVersion11(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 12)
}

// TestMigration19DownRestoresVersion18: the same for 0019 (one posting
// format): enqueue_posting(), enqueue() and finish() return to the
// definitions that built their payloads themselves, and posting() is gone.
func TestMigration19DownRestoresVersion18(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 19)
}

// migrationDownRestores checks that a schema migrated up to version and
// one step down has the catalog of a schema migrated to version-1.
func migrationDownRestores(t *testing.T, version int64) {
	ctx := context.Background()
	pool := testdb.Pool(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	upTo := 0
	for i, m := range ms {
		if m.Version < version {
			upTo = i + 1
		}
	}
	require.Equal(t, version, ms[upTo].Version)

	prev := testdb.Schema(t)
	_, err = migrate.Up(ctx, pool, prev, ms[:upTo])
	require.NoError(t, err)
	down := testdb.Schema(t)
	_, err = migrate.Up(ctx, pool, down, ms[:upTo+1])
	require.NoError(t, err)
	done, err := migrate.Down(ctx, pool, down, ms[:upTo+1], 1)
	require.NoError(t, err)
	require.Equal(t, []int64{version}, done)
	require.Equal(t, catalog(t, prev), catalog(t, down))
}

// catalog describes a schema: its functions (definitions), its aggregates
// (pg_get_functiondef refuses them: their functions and state), the columns of
// its tables and views, and its indexes, with the schema's name blanked.
// The day partitions of job_history are left out: how many exist depends
// on the day and on whether their attach got its locks at once (the
// migration leaves a busy day to the maintenance loop), not on the
// schema's version.
func catalog(t *testing.T, schema string) []string {
	t.Helper()
	rows, err := testdb.Pool(t).Query(context.Background(), `
SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND p.prokind <> 'a'
UNION ALL
SELECT 'aggregate ' || p.oid::regprocedure::text || ' ' || a.aggtransfn::regprocedure::text || ' ' || a.aggfinalfn::text || ' '
       || format_type(a.aggtranstype, NULL) || ' ' || coalesce(a.agginitval, '')
FROM pg_proc p JOIN pg_aggregate a ON a.aggfnoid = p.oid WHERE p.pronamespace = $1::regnamespace
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = $1::regnamespace AND a.attnum > 0 AND NOT a.attisdropped AND c.relname <> 'schema_migrations'
  AND c.relname !~ '^job_history_p[0-9]{8}'
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace = $1::regnamespace AND c.relname !~ '^job_history_p[0-9]{8}'`, schema)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for i := range out {
		out[i] = strings.ReplaceAll(out[i], schema, "<schema>")
	}
	sort.Strings(out)
	require.NotEmpty(t, out, fmt.Sprintf("schema %s", schema))
	return out
}

// TestMigration20DownRestoresVersion19: the same for 0020 (the claim
// returns its jobs in the order it chose them): claim_jobs returns to its
// version 12 body with the settings of versions 13 and 17.
func TestMigration20DownRestoresVersion19(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 20)
}

// TestMigration21DownRestoresVersion20: the same for 0021 (completed jobs
// deleted at completion): finish() returns to its version 19 definition.
func TestMigration21DownRestoresVersion20(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 21)
}

// TestMigration22DownRestoresVersion21: the same for 0022 (the keyed claim
// in a few statements): claim_type returns to its version 9 definition.
func TestMigration22DownRestoresVersion21(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 22)
}

// TestMigration24DownRestoresVersion23: the same for 0024 (claims of a
// type take turns): claim_jobs returns to its version 20 definition.
func TestMigration24DownRestoresVersion23(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 24)
}

// TestMigration26DownRestoresVersion25: the same for 0026 (a stale running
// bound no longer caps a claim): claim_type returns to its version 22
// definition.
func TestMigration26DownRestoresVersion25(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 26)
}

// TestMigration27DownRestoresVersion26: the same for 0027 (a keyed claim
// walks as many keys as the room it needs): claim_type returns to its
// version 26 definition.
func TestMigration27DownRestoresVersion26(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 27)
}

// TestMigration28DownRestoresVersion27: the same for 0028 (claims that
// do not count a process's ended jobs against the limits): the overloads
// of claim_jobs and claim_type it added are gone, and the ones of version
// 27 are as they were.
func TestMigration28DownRestoresVersion27(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 28)
}

// TestMigration29DownRestoresVersion28: the same for 0029 (standby jobs):
// the overloads of claim_jobs and claim_type it added are gone, and the
// ones of version 28 are as they were.
func TestMigration29DownRestoresVersion28(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 29)
}
