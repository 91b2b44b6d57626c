package backlogtest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogtest"
	"github.com/backlogq/backlog/internal/testdb"
)

type emailArgs struct {
	To      string   `json:"to"`
	Subject string   `json:"subject"`
	Lines   []string `json:"lines,omitempty"`
	N       int64    `json:"n,omitempty"`
}

func quiet() backlog.Option {
	return backlog.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func newQ(tt *testing.T, opts ...backlog.Option) *backlog.Queue {
	tt.Helper()
	return backlogtest.NewQueue(tt, testdb.Pool(tt), append([]backlog.Option{quiet()}, opts...)...)
}

func TestNewQueueSchemaPerTestDroppedAtCleanup(tt *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(tt)
	var mu sync.Mutex
	var schemas []string
	tt.Run("group", func(tt *testing.T) {
		for range 3 {
			tt.Run("parallel", func(tt *testing.T) {
				tt.Parallel()
				q := newQ(tt)
				_, err := q.Enqueue(ctx, "a", emailArgs{To: "x"})
				require.NoError(tt, err)
				backlogtest.RequireManyEnqueued(ctx, tt, q, []backlogtest.Expect{{Type: "a"}}) // its own schema: one job
				mu.Lock()
				defer mu.Unlock()
				schemas = append(schemas, q.Schema())
			})
		}
	})
	require.Len(tt, schemas, 3)
	for _, s := range schemas {
		require.Regexp(tt, "^"+backlogtest.SchemaPrefix+"[0-9a-f]{12}$", s)
		var n int
		require.NoError(tt, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, s).Scan(&n))
		require.Zero(tt, n, "schema %s must be dropped at cleanup", s)
	}
}

func TestNewQueueOverridesWithSchema(tt *testing.T) {
	q := newQ(tt, backlog.WithSchema("public"))
	require.NotEqual(tt, "public", q.Schema())
	msg := fails(tt, func(tb backlogtest.TB) { backlogtest.NewQueue(tb, nil) })
	require.Contains(tt, msg, "pool must not be nil")
}

func TestRequireEnqueuedMatches(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	before := time.Now().Add(-time.Second)
	id, err := q.Enqueue(ctx, "email.send", emailArgs{To: "ada@example.com", Subject: "hi", Lines: []string{"a", "b"}, N: 1 << 60},
		backlog.Tags{"region": "eu", "tier": "gold"}, backlog.Priority(7), backlog.MaxAttempts(3),
		backlog.OrderingKey("ok"), backlog.UniqueKey("uk"), backlog.ConcurrencyKey("ck"), backlog.Delay(time.Hour))
	require.NoError(tt, err)
	_, err = q.Enqueue(ctx, "other", map[string]int{"x": 1})
	require.NoError(tt, err)

	job := backlogtest.RequireEnqueued(ctx, tt, q, "email.send", nil)
	require.Equal(tt, id, job.ID)
	job = backlogtest.RequireEnqueued(ctx, tt, q, "email.send", &backlogtest.Want{
		Args:        map[string]any{"to": "ada@example.com", "lines": []string{"a", "b"}, "n": int64(1 << 60)},
		Tags:        map[string]string{"region": "eu"},
		OrderingKey: "ok", UniqueKey: "uk", ConcurrencyKey: "ck",
		Priority: new(7), MaxAttempts: 3, State: backlog.StateScheduled,
		RunAfter: before.Add(time.Hour), RunBefore: time.Now().Add(time.Hour + time.Second),
	})
	require.Equal(tt, id, job.ID)
	require.Equal(tt, "ck", job.ConcurrencyKey)
	// The args struct: every field it encodes.
	backlogtest.RequireEnqueued(ctx, tt, q, "email.send", &backlogtest.Want{
		Args: emailArgs{To: "ada@example.com", Subject: "hi", Lines: []string{"a", "b"}, N: 1 << 60}})
	// JSON text, and numbers compared by value.
	backlogtest.RequireEnqueued(ctx, tt, q, "email.send", &backlogtest.Want{Args: json.RawMessage(`{"n": 1152921504606846976.0}`)})
	a := backlogtest.Args[emailArgs](tt, job)
	require.Equal(tt, emailArgs{To: "ada@example.com", Subject: "hi", Lines: []string{"a", "b"}, N: 1 << 60}, a)
	backlogtest.RequireNotEnqueued(ctx, tt, q, "email.send", &backlogtest.Want{Args: map[string]any{"to": "bob@example.com"}})
	backlogtest.RequireNotEnqueued(ctx, tt, q, "email.sned", nil)
}

// The job returned carries its metadata (and progress, nil here).
func TestRequireEnqueuedReturnsMetadata(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	_, err := q.Enqueue(ctx, "traced", nil, backlog.Metadata(map[string]string{"traceparent": "00-abc-def-01"}))
	require.NoError(tt, err)
	job := backlogtest.RequireEnqueued(ctx, tt, q, "traced", nil)
	require.Equal(tt, map[string]string{"traceparent": "00-abc-def-01"}, job.Metadata)
	require.Nil(tt, job.Progress)
}

func TestRequireEnqueuedFailureListsWhatWasEnqueued(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	_, err := q.Enqueue(ctx, "email.send", emailArgs{To: "bob@example.com", Subject: "hi", Lines: []string{"a"}},
		backlog.Tags{"region": "us"}, backlog.OrderingKey("acct:1"))
	require.NoError(tt, err)
	_, err = q.Enqueue(ctx, "sms.send", map[string]string{"to": "+1"})
	require.NoError(tt, err)
	_, err = q.Enqueue(ctx, "sms.send", map[string]string{"to": "+2"})
	require.NoError(tt, err)

	msg := fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireEnqueued(ctx, tb, q, "email.send", &backlogtest.Want{
			Args: map[string]any{"to": "ada@example.com"}, Tags: map[string]string{"region": "eu", "tier": "x"},
			OrderingKey: "acct:2", Priority: new(3), State: backlog.StateCompleted})
	})
	for _, s := range []string{
		`backlogtest: no job of type "email.send" matching {args ⊇ {"to":"ada@example.com"}, tags ⊇ {"region":"eu","tier":"x"}, ordering_key="acct:2", priority=3, state=completed} was enqueued.`,
		`Jobs of type "email.send" enqueued: 1:`,
		`(email.send, available) args={"to":"bob@example.com","lines":["a"],"subject":"hi"} tags={"region":"us"} priority=0 max_attempts=25`,
		`ordering_key="acct:1"`,
		`args at .to: want "ada@example.com", have "bob@example.com"`,
		`tag "region" is "us", want "eu"; tag "tier" missing`,
		`ordering_key is "acct:1", want "acct:2"`,
		`priority is 0, want 3`,
		`state is available, want completed`,
		`Jobs of other types: "sms.send" (2).`,
	} {
		require.Contains(tt, msg, s)
	}

	// A typo in the type: the other types are listed.
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueued(ctx, tb, q, "email.sned", nil) })
	require.Contains(tt, msg, `No job of type "email.sned" was enqueued.`)
	require.Contains(tt, msg, `Jobs of other types: "email.send" (1), "sms.send" (2).`)

	// Nested paths, arrays, missing keys, run_at windows, max attempts.
	for want, sub := range map[*backlogtest.Want]string{
		{Args: map[string]any{"lines": []string{"a", "b"}}}:  `args at .lines: want 2 elements, have 1: ["a"]`,
		{Args: map[string]any{"lines": []string{"z"}}}:       `args at .lines[0]: want "z", have "a"`,
		{Args: map[string]any{"cc": "x"}}:                    `args at .: key "cc" missing (want "x")`,
		{Args: map[string]any{"to": map[string]any{"a": 1}}}: `args at .to: want an object, have "bob@example.com"`,
		{Args: []int{1}}:                                           `args at .: want an array, have {`,
		{RunAfter: time.Now().Add(time.Hour)}:                      `is before`,
		{RunBefore: time.Now().Add(-time.Hour)}:                    `is after`,
		{MaxAttempts: 2}:                                           `max_attempts is 25, want 2`,
		{UniqueKey: "u", ConcurrencyKey: "c"}:                      `unique_key is "", want "u"; concurrency_key is "", want "c"`,
		{Args: emailArgs{To: "bob@example.com", Subject: "hello"}}: `args at .subject: want "hello", have "hi"`,
	} {
		msg := fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueued(ctx, tb, q, "email.send", want) })
		require.Contains(tt, msg, sub)
	}

	// Bad wants are reported as such.
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireEnqueued(ctx, tb, q, "email.send", &backlogtest.Want{Args: func() {}})
	})
	require.Contains(tt, msg, "Want.Args")
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireEnqueued(ctx, tb, q, "email.send", &backlogtest.Want{Priority: new(101)})
	})
	require.Contains(tt, msg, "Want.Priority: 101 is outside [0, 100]")
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireEnqueued(ctx, tb, q, "email.send", &backlogtest.Want{RunAfter: time.Now(), RunBefore: time.Now().Add(-time.Hour)})
	})
	require.Contains(tt, msg, "Want.RunBefore")

	// RequireNotEnqueued lists the jobs that match.
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireNotEnqueued(ctx, tb, q, "sms.send", &backlogtest.Want{Args: map[string]any{"to": "+2"}})
	})
	require.Contains(tt, msg, `1 job(s) of type "sms.send" matching {args ⊇ {"to":"+2"}} were enqueued, want none:`)
	require.Contains(tt, msg, `args={"to":"+2"}`)
	require.NotContains(tt, msg, `"+1"`)

	// Args: a decode failure.
	job := backlogtest.RequireEnqueued(ctx, tt, q, "email.send", nil)
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.Args[[]int](tb, job) })
	require.Contains(tt, msg, "decoding the args of job")
}

func TestRequireEnqueuedTxSeesUncommittedJobs(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	tx, err := testdb.Pool(tt).Begin(ctx)
	require.NoError(tt, err)
	defer func() { _ = tx.Rollback(ctx) }()
	id, err := q.EnqueueTx(ctx, tx, "email.send", emailArgs{To: "ada@example.com"})
	require.NoError(tt, err)

	job := backlogtest.RequireEnqueuedTx(ctx, tt, q, tx, "email.send", &backlogtest.Want{Args: map[string]any{"to": "ada@example.com"}})
	require.Equal(tt, id, job.ID)
	require.Equal(tt, backlog.StateAvailable, job.State)
	backlogtest.RequireNotEnqueued(ctx, tt, q, "email.send", nil) // not committed: the pool does not see it
	backlogtest.RequireManyEnqueuedTx(ctx, tt, q, tx, []backlogtest.Expect{{Type: "email.send"}})
	msg := fails(tt, func(tb backlogtest.TB) { backlogtest.RequireNotEnqueuedTx(ctx, tb, q, tx, "email.send", nil) })
	require.Contains(tt, msg, "were enqueued, want none")
	require.NoError(tt, tx.Rollback(ctx))
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueued(ctx, tb, q, "email.send", nil) })
	require.Contains(tt, msg, `No job of type "email.send" was enqueued.`)
	// A query error (the transaction is over) fails t too.
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedTx(ctx, tb, q, tx, "email.send", nil) })
	require.Contains(tt, msg, "reading the jobs of schema")
}

// TestRequireEnqueuedTxDatabaseSQL: the Tx forms take whatever EnqueueTx
// takes, a database/sql transaction included, and see what it has not
// committed; anything else fails t naming what it got.
func TestRequireEnqueuedTxDatabaseSQL(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	db := stdlib.OpenDBFromPool(testdb.Pool(tt))
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(tt, err)
	defer func() { _ = tx.Rollback() }()
	id, err := q.EnqueueTx(ctx, tx, "email.send", emailArgs{To: "ada@example.com"}, backlog.Tags{"tenant": "acme"},
		backlog.OrderingKey("acct-1"))
	require.NoError(tt, err)

	job := backlogtest.RequireEnqueuedTx(ctx, tt, q, tx, "email.send", &backlogtest.Want{Args: map[string]any{"to": "ada@example.com"},
		Tags: map[string]string{"tenant": "acme"}, OrderingKey: "acct-1", State: backlog.StateAvailable})
	require.Equal(tt, id, job.ID)
	require.Nil(tt, job.Result)
	require.Nil(tt, job.StartedAt)
	require.JSONEq(tt, `{"to": "ada@example.com", "subject": ""}`, string(job.Args))
	backlogtest.RequireNotEnqueued(ctx, tt, q, "email.send", nil) // not committed
	backlogtest.RequireManyEnqueuedTx(ctx, tt, q, tx, []backlogtest.Expect{{Type: "email.send"}})
	msg := fails(tt, func(tb backlogtest.TB) { backlogtest.RequireNotEnqueuedTx(ctx, tb, q, tx, "email.send", nil) })
	require.Contains(tt, msg, "were enqueued, want none")

	for _, bad := range []backlog.Tx{nil, db, "a string", (*sql.Tx)(nil)} {
		msg := fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedTx(ctx, tb, q, bad, "email.send", nil) })
		require.Contains(tt, msg, "neither a pgx.Tx nor a database/sql transaction", "%T", bad)
	}
}

func TestRequireManyEnqueuedInOrder(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	_, err := q.EnqueueMany(ctx, []backlog.JobSpec{
		{Type: "a", Args: map[string]int{"n": 1}},
		{Type: "b", Args: map[string]int{"n": 2}},
		{Type: "c", Args: map[string]int{"n": 9}}, // not asked about
		{Type: "a", Args: map[string]int{"n": 3}},
	})
	require.NoError(tt, err)
	jobs := backlogtest.RequireManyEnqueued(ctx, tt, q, []backlogtest.Expect{
		{Type: "a", Want: &backlogtest.Want{Args: map[string]int{"n": 1}}},
		{Type: "b"},
		{Type: "a", Want: &backlogtest.Want{Args: map[string]int{"n": 3}}},
	})
	require.Len(tt, jobs, 3)
	require.Equal(tt, map[string]int{"n": 3}, backlogtest.Args[map[string]int](tt, jobs[2]))

	msg := fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireManyEnqueued(ctx, tb, q, []backlogtest.Expect{
			{Type: "a", Want: &backlogtest.Want{Args: map[string]int{"n": 1}}},
			{Type: "a", Want: &backlogtest.Want{Args: map[string]int{"n": 3}}},
			{Type: "b"},
		})
	})
	require.Contains(tt, msg, `RequireManyEnqueued: want 3 job(s) of types ["a" "b"] in this order, 3 were enqueued:`)
	require.Contains(tt, msg, `1. job `)
	require.Contains(tt, msg, `: ok`)
	require.Contains(tt, msg, `2. job`)
	require.Contains(tt, msg, `(b, available) args={"n":2} priority=0 max_attempts=25`)
	require.Contains(tt, msg, `want type "a" matching {args ⊇ {"n":3}}`)
	require.Contains(tt, msg, `(a, available) args={"n":3} priority=0 max_attempts=25`)
	require.Contains(tt, msg, `: want type "b"`)
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireManyEnqueued(ctx, tb, q, []backlogtest.Expect{
			{Type: "a", Want: &backlogtest.Want{Args: map[string]int{"n": 1}}}, {Type: "b"},
			{Type: "a", Want: &backlogtest.Want{Args: map[string]int{"n": 4}}}})
	})
	require.Contains(tt, msg, `args at .n: want 4, have 3`)

	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireManyEnqueued(ctx, tb, q, []backlogtest.Expect{{Type: "a"}, {Type: "a"}, {Type: "a"}})
	})
	require.Contains(tt, msg, `3. missing: want "a"`)
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireManyEnqueued(ctx, tb, q, []backlogtest.Expect{{Type: "c"}, {Type: "b"}})
	})
	require.Contains(tt, msg, `want 2 job(s) of types ["c" "b"] in this order, 2 were enqueued`)
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireManyEnqueued(ctx, tb, q, []backlogtest.Expect{{Type: "a"}})
	})
	require.Contains(tt, msg, `2. job`)
	require.Contains(tt, msg, `: not expected`)
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireManyEnqueued(ctx, tb, q, nil) })
	require.Contains(tt, msg, "no job expected")
}

var _ pgx.Tx // the Tx variants take a pgx.Tx
