package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// The SQL function enqueue() of migration 0010, called the way a service
// not written in Go calls it: SQL text on a connection of its own, values
// sent as literals (pgx's simple protocol quotes them as psql users do).

// sqlInvalid is the SQLSTATE of enqueue()'s input errors.
const sqlInvalid = "BLINV"

// sqlConn opens a plain connection (no pool, no Queue) that sends
// statements as text.
func sqlConn(t *testing.T) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// sqlEnqueue runs SELECT "<schema>".enqueue(<call>) on db.
func (e *env) sqlEnqueue(db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, call string, params ...any) (uuid.UUID, error) {
	var id uuid.UUID
	err := db.QueryRow(context.Background(), `SELECT "`+e.schema+`".enqueue(`+call+`)`, params...).Scan(&id)
	return id, err
}

// sqlField is the name enqueue() gives a field of the Go API's InputError:
// its parameter's.
func sqlField(goField string) string { return strings.ReplaceAll(goField, " ", "_") }

// requireSQLInvalid checks that err is enqueue()'s input error naming
// field.
func requireSQLInvalid(t *testing.T, err error, field, msg string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want a PostgreSQL error, got %v", msg, err)
	require.Equal(t, sqlInvalid, pgErr.Code, "%s: %s", msg, pgErr.Message)
	require.Equal(t, field, pgErr.ColumnName, "%s: %s", msg, pgErr.Message)
	require.Contains(t, pgErr.Message, "backlog: invalid "+field+": ", msg)
}

// goTagsBytes is the size validate.go counts for tags.
func goTagsBytes(tags map[string]string) int {
	n := 2
	for k, v := range tags {
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(v)
		n += len(kb) + len(vb) + 2
	}
	return n
}

// tagsOfBytes returns tags whose size as validate.go counts it is exactly
// n, full of characters that Go's JSON escapes (HTML characters, quotes,
// control characters, line separators) and one multi-byte one.
func tagsOfBytes(t *testing.T, n int) map[string]string {
	t.Helper()
	unit := "<>&\"\\\n\t\b\f\r\x01\x1f\u2028\u2029é"
	tags := map[string]string{}
	full := strings.Repeat(unit, backlog.MaxTagBytes/len(unit))
	for i := 0; n-goTagsBytes(tags) > 1000; i++ {
		tags[fmt.Sprintf("k%02d", i)] = full
	}
	for i := 0; n-goTagsBytes(tags) > 220; i++ { // 159 bytes each
		tags[fmt.Sprintf("f%02d", i)] = strings.Repeat("b", 150)
	}
	pad := n - goTagsBytes(tags) - len(`"last"`) - len(`""`) - 2
	require.True(t, pad > 0 && pad <= backlog.MaxTagBytes, "pad %d", pad)
	tags["last"] = strings.Repeat("a", pad)
	require.Equal(t, n, goTagsBytes(tags))
	return tags
}

func jsonText(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// enqueueCase is one input fed to both Queue.Enqueue and enqueue(): Go's
// type, args and options, and the same as enqueue()'s arguments after the
// type ($1).
type enqueueCase struct {
	name   string
	field  string // Go's InputError field; "" when the input is valid
	typ    string
	args   any
	opts   []backlog.EnqueueOption
	call   string // enqueue()'s arguments after the type
	params []any  // $2, … of call
}

func (c enqueueCase) sqlCall() (string, []any) {
	call := "$1"
	if c.call != "" {
		call += ", " + c.call
	}
	return call, append([]any{c.typ}, c.params...)
}

// enqueueCases are the inputs both enqueues must judge alike. Inputs that
// SQL cannot carry (a NUL byte, invalid UTF-8: PostgreSQL refuses them in
// text and jsonb before any function runs) are Go's alone, in
// validate.go's tests and TestGraphBadInput.
func enqueueCases(t *testing.T) []enqueueCase {
	ids := func(n int) ([]uuid.UUID, string) {
		var out []uuid.UUID
		var s []string
		for range n {
			id := backlog.NewID()
			out = append(out, id)
			s = append(s, id.String())
		}
		return out, "{" + strings.Join(s, ",") + "}"
	}
	many, manySQL := ids(backlog.MaxDependsOn + 1)
	unknown, unknownSQL := ids(1)
	tooMany := map[string]string{}
	for i := range backlog.MaxTags + 1 {
		tooMany[fmt.Sprint("t", i)] = "v"
	}
	full := map[string]string{}
	for i := range backlog.MaxTags {
		full[fmt.Sprint("t", i)] = "v"
	}
	bigArgs := `"` + strings.Repeat("a", backlog.MaxArgsBytes-1) + `"`  // one byte over the limit
	fullArgs := `"` + strings.Repeat("a", backlog.MaxArgsBytes-2) + `"` // at the limit
	long := func(n int) string { return strings.Repeat("k", n) }
	tags, tagsSQL := func(m map[string]string) backlog.Tags { return m }, func(m map[string]string) any { return jsonText(t, m) }
	year := func(y, mo, d, h, mi, s, ns int) time.Time {
		return time.Date(y, time.Month(mo), d, h, mi, s, ns, time.UTC)
	}
	at := func(tm time.Time) any { return tm.Format("2006-01-02 15:04:05.999999Z07:00") }
	o := func(opts ...backlog.EnqueueOption) []backlog.EnqueueOption { return opts }
	return []enqueueCase{
		// Rejected by both.
		{name: "empty type", field: "type", typ: ""},
		{name: "type over the limit", field: "type", typ: long(backlog.MaxTypeBytes + 1)},
		{name: "args over the limit", field: "args", typ: "t", args: json.RawMessage(bigArgs), call: "$2::jsonb", params: []any{bigArgs}},
		{name: "too many tags", field: "tags", typ: "t", opts: o(tags(tooMany)), call: "tags => $2::jsonb", params: []any{tagsSQL(tooMany)}},
		{name: "empty tag key", field: "tags", typ: "t", opts: o(backlog.Tags{"": "v"}), call: `tags => '{"": "v"}'`},
		{name: "tag key over the limit", field: "tags", typ: "t", opts: o(backlog.Tags{long(201): "v"}), call: "tags => $2::jsonb", params: []any{tagsSQL(map[string]string{long(201): "v"})}},
		{name: "tag value over the limit", field: "tags", typ: "t", opts: o(backlog.Tags{"k": long(201)}), call: "tags => $2::jsonb", params: []any{tagsSQL(map[string]string{"k": long(201)})}},
		{name: "tags' JSON one byte over the limit", field: "tags", typ: "t", opts: o(tags(tagsOfBytes(t, backlog.MaxTagsBytes+1))), call: "tags => $2::jsonb", params: []any{tagsSQL(tagsOfBytes(t, backlog.MaxTagsBytes+1))}},
		{name: "priority below", field: "priority", typ: "t", opts: o(backlog.Priority(-1)), call: "priority => -1"},
		{name: "priority above", field: "priority", typ: "t", opts: o(backlog.Priority(101)), call: "priority => 101"},
		{name: "no attempts", field: "max attempts", typ: "t", opts: o(backlog.MaxAttempts(0)), call: "max_attempts => 0"},
		{name: "too many attempts", field: "max attempts", typ: "t", opts: o(backlog.MaxAttempts(backlog.MaxAttemptsLimit + 1)), call: "max_attempts => 1000001"},
		{name: "run at year 1's first instant (Go's zero time)", field: "run at", typ: "t", opts: o(backlog.RunAt(time.Time{})), call: "run_at => $2::timestamptz", params: []any{"0001-01-01 00:00:00Z"}},
		{name: "run at 1 BC", field: "run at", typ: "t", opts: o(backlog.RunAt(year(0, 12, 31, 0, 0, 0, 0))), call: "run_at => '0001-12-31 00:00:00+00 BC'"},
		{name: "run at past year 9999", field: "run at", typ: "t", opts: o(backlog.RunAt(year(9999, 12, 31, 23, 59, 59, 1000))), call: "run_at => $2::timestamptz", params: []any{at(year(9999, 12, 31, 23, 59, 59, 1000))}},
		{name: "too many prerequisites", field: "depends on", typ: "t", opts: o(backlog.DependsOn(many...)), call: "depends_on => $2::uuid[]", params: []any{manySQL}},
		{name: "negative timeout", field: "timeout", typ: "t", opts: o(backlog.Timeout(-time.Millisecond)), call: "timeout => '-1 millisecond'"},
		{name: "timeout under a millisecond", field: "timeout", typ: "t", opts: o(backlog.Timeout(500 * time.Microsecond)), call: "timeout => '500 microseconds'"},
		{name: "ordering key over the limit", field: "ordering key", typ: "t", opts: o(backlog.OrderingKey(long(backlog.MaxKeyBytes + 1))), call: "ordering_key => $2", params: []any{long(backlog.MaxKeyBytes + 1)}},
		{name: "concurrency key over the limit", field: "concurrency key", typ: "t", opts: o(backlog.ConcurrencyKey(long(backlog.MaxKeyBytes + 1))), call: "concurrency_key => $2", params: []any{long(backlog.MaxKeyBytes + 1)}},
		{name: "unique key over the limit", field: "unique key", typ: "t", opts: o(backlog.UniqueKey(long(backlog.MaxKeyBytes + 1))), call: "unique_key => $2", params: []any{long(backlog.MaxKeyBytes + 1)}},
		{name: "nil prerequisite", field: "depends on", typ: "t", opts: o(backlog.DependsOn(uuid.Nil)), call: "depends_on => ARRAY['00000000-0000-0000-0000-000000000000']::uuid[]"},
		{name: "unknown prerequisite", field: "depends on", typ: "t", opts: o(backlog.DependsOn(unknown...)), call: "depends_on => $2::uuid[]", params: []any{unknownSQL}},
		{name: "unknown prerequisite with an ordering key", field: "depends on", typ: "t", opts: o(backlog.DependsOn(unknown...), backlog.OrderingKey("k")), call: "depends_on => $2::uuid[], ordering_key => 'k'", params: []any{unknownSQL}},

		// Accepted by both: the limits themselves.
		{name: "type at the limit", typ: long(backlog.MaxTypeBytes)},
		{name: "args at the limit", typ: "t", args: json.RawMessage(fullArgs), call: "$2::jsonb", params: []any{fullArgs}},
		{name: "tags at the limit", typ: "t", opts: o(tags(full)), call: "tags => $2::jsonb", params: []any{tagsSQL(full)}},
		{name: "tags' JSON at the limit", typ: "t", opts: o(tags(tagsOfBytes(t, backlog.MaxTagsBytes))), call: "tags => $2::jsonb", params: []any{tagsSQL(tagsOfBytes(t, backlog.MaxTagsBytes))}},
		{name: "tag key and value at the limit", typ: "t", opts: o(backlog.Tags{long(200): long(200)}), call: "tags => $2::jsonb", params: []any{tagsSQL(map[string]string{long(200): long(200)})}},
		{name: "priorities at the limits", typ: "t", opts: o(backlog.Priority(backlog.MaxPriority)), call: "priority => 100"},
		{name: "attempts at the limits", typ: "t", opts: o(backlog.MaxAttempts(backlog.MaxAttemptsLimit)), call: "max_attempts => 1000000"},
		{name: "one attempt", typ: "t", opts: o(backlog.MaxAttempts(1)), call: "max_attempts => 1"},
		{name: "run at the last second of 9999", typ: "t", opts: o(backlog.RunAt(year(9999, 12, 31, 23, 59, 59, 0))), call: "run_at => '9999-12-31 23:59:59+00'"},
		{name: "run at just after year 1 began", typ: "t", opts: o(backlog.RunAt(year(1, 1, 1, 0, 0, 0, 1000))), call: "run_at => '0001-01-01 00:00:00.000001+00'"},
		{name: "timeout of a millisecond", typ: "t", opts: o(backlog.Timeout(time.Millisecond)), call: "timeout => '1 millisecond'"},
		{name: "keys at the limit", typ: "t", opts: o(backlog.OrderingKey(long(backlog.MaxKeyBytes)), backlog.UniqueKey(long(backlog.MaxKeyBytes))),
			call: "ordering_key => $2, unique_key => $3", params: []any{long(backlog.MaxKeyBytes), strings.Repeat("u", backlog.MaxKeyBytes)}}, // not Go's duplicate
	}
}

// TestSQLEnqueueValidatesLikeGo feeds the same inputs to Queue.Enqueue and
// enqueue(): both reject the same ones, naming the same field (SQLSTATE
// BLINV, the parameter in the message and in COLUMN), and write nothing;
// both accept the limits themselves.
func TestSQLEnqueueValidatesLikeGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	conn := sqlConn(t)
	for _, c := range enqueueCases(t) {
		_, goErr := e.q.Enqueue(ctx, c.typ, c.args, c.opts...)
		call, params := c.sqlCall()
		_, sqlErr := e.sqlEnqueue(conn, call, params...)
		if c.field == "" {
			require.NoError(t, goErr, c.name)
			require.NoError(t, sqlErr, c.name)
			continue
		}
		var ie *backlog.InputError
		require.True(t, errors.As(goErr, &ie), "%s: Go: %v", c.name, goErr)
		require.Equal(t, c.field, ie.Field, c.name)
		requireSQLInvalid(t, sqlErr, sqlField(c.field), c.name)

		// Inside a transaction too, and the transaction goes on.
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SAVEPOINT s")
		require.NoError(t, err)
		_, sqlErr = e.sqlEnqueue(tx, call, params...)
		requireSQLInvalid(t, sqlErr, sqlField(c.field), c.name+" (in a transaction)")
		_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s")
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	valid := 0
	for _, c := range enqueueCases(t) {
		if c.field == "" {
			valid++
		}
	}
	require.Equal(t, 2*valid, e.count("true"), "only the valid inputs were written, once by each")
	require.Zero(t, e.count("state NOT IN ('available', 'scheduled', 'blocked')"))
}

// TestSQLEnqueueRejectsWhatOnlySQLCanSay: inputs Go's types cannot hold.
func TestSQLEnqueueRejectsWhatOnlySQLCanSay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	conn := sqlConn(t)
	for _, c := range []struct{ call, field string }{
		{`NULL`, "type"},
		{`'t', tags => '["a"]'`, "tags"},
		{`'t', tags => 'null'`, "tags"},
		{`'t', tags => '{"a": 1}'`, "tags"},
		{`'t', tags => '{"a": null}'`, "tags"},
		{`'t', tags => '{"a": {"b": "c"}}'`, "tags"},
		{`'t', run_at => 'infinity'`, "run_at"},
		{`'t', run_at => '-infinity'`, "run_at"},
		{`'t', timeout => '300 years'`, "timeout"}, // past time.Duration
		{`'t', depends_on => ARRAY[NULL]::uuid[]`, "depends_on"},
	} {
		_, err := e.sqlEnqueue(conn, c.call)
		requireSQLInvalid(t, err, c.field, c.call)
	}
	require.Zero(t, e.count("true"))
}

// TestSQLEnqueueWritesTheJobGoWrites: the same options give the same job,
// read back with Queue.Job; defaults are Go's; text is stored verbatim.
func TestSQLEnqueueWritesTheJobGoWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	conn := sqlConn(t)
	same := func(goID, sqlID uuid.UUID) {
		t.Helper()
		g, err := e.q.Job(ctx, goID)
		require.NoError(t, err)
		s, err := e.q.Job(ctx, sqlID)
		require.NoError(t, err)
		require.Equal(t, byte(7), sqlID[6]>>4, "a UUIDv7")
		require.Equal(t, byte(2), sqlID[8]>>6, "RFC 9562 variant")
		require.JSONEq(t, string(g.Args), string(s.Args))
		// now() is the transaction's start, the ID's time a little later.
		require.WithinDuration(t, s.CreatedAt, time.UnixMilli(int64(uuidMillis(sqlID))), time.Second, "the ID's time is the creation time")
		g.ID, s.ID, g.Args, s.Args, g.CreatedAt, s.CreatedAt = uuid.Nil, uuid.Nil, nil, nil, time.Time{}, time.Time{}
		if g.State == backlog.StateAvailable { // run_at is now(): each insert's own
			require.WithinDuration(t, g.RunAt, s.RunAt, 10*time.Second)
			g.RunAt, s.RunAt = time.Time{}, time.Time{}
		}
		require.Equal(t, *g, *s)
	}

	// Every option.
	runAt := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	tags := backlog.Tags{"region": "eu", `k'"\`: `v'"`}
	goID, err := e.q.Enqueue(ctx, "cmp", json.RawMessage(`{"b": [true, null], "a": "x"}`), tags,
		backlog.Priority(7), backlog.MaxAttempts(3), backlog.Timeout(1500*time.Microsecond), backlog.RunAt(runAt))
	require.NoError(t, err)
	sqlID, err := e.sqlEnqueue(conn, `'cmp', '{"a": "x", "b": [true, null]}', tags => $1::jsonb, priority => 7,
		max_attempts => 3, timeout => '1.5 milliseconds', run_at => $2::timestamptz`, jsonText(t, tags), runAt.Format(time.RFC3339Nano))
	require.NoError(t, err)
	same(goID, sqlID)
	info, err := e.q.Job(ctx, sqlID)
	require.NoError(t, err)
	require.Equal(t, backlog.StateScheduled, info.State)
	require.Equal(t, 2*time.Millisecond, info.Timeout, "rounded up to whole milliseconds, as Go does")

	// Defaults (Go's args are whatever it is given; SQL's default to {}).
	goID, err = e.q.Enqueue(ctx, "defaults", map[string]any{})
	require.NoError(t, err)
	sqlID, err = e.sqlEnqueue(conn, `'defaults'`)
	require.NoError(t, err)
	same(goID, sqlID)
	// NULL means the default.
	sqlID, err = e.sqlEnqueue(conn, `'defaults', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL`)
	require.NoError(t, err)
	same(goID, sqlID)

	// Text is data, never SQL: stored verbatim.
	evil := `'; DROP TABLE x; --`
	evilTags := backlog.Tags{`"quoted" key`: `it's`, `'; DROP TABLE jobs; --`: `\"`}
	evilArgs := `{"q": "'\"; --", "$$": "$1"}`
	goID, err = e.q.Enqueue(ctx, evil, json.RawMessage(evilArgs), evilTags, backlog.UniqueKey(evil+"go"), backlog.OrderingKey(evil))
	require.NoError(t, err)
	sqlID, err = e.sqlEnqueue(conn, `$1, $2::jsonb, $3::jsonb, unique_key => $4, ordering_key => $1`, evil, evilArgs, jsonText(t, evilTags), evil+"sql")
	require.NoError(t, err)
	info, err = e.q.Job(ctx, sqlID)
	require.NoError(t, err)
	require.Equal(t, evil, info.Type)
	require.Equal(t, map[string]string(evilTags), info.Tags)
	require.JSONEq(t, evilArgs, string(info.Args))
	require.Equal(t, 1, e.countLive("unique_key = $1", evil+"sql"))
	require.Equal(t, 2, e.countLive("ordering_key = $1", evil))
	require.Equal(t, backlog.StateBlocked, info.State, "behind the Go job of the same ordering key")
	require.Equal(t, 1, e.countLive("id = $1 AND blocked_by = 1", sqlID))
	require.Equal(t, 1, e.countLive("id = $1 AND type = $2", goID, evil), "Go's is the chain's head")

	// A concurrency key (flow control), with and without a graph.
	sqlID, err = e.sqlEnqueue(conn, `'keyed', concurrency_key => $1`, evil)
	require.NoError(t, err)
	require.Equal(t, 1, e.countLive("id = $1 AND concurrency_key = $2", sqlID, evil))
	sqlID, err = e.sqlEnqueue(conn, `'keyed', concurrency_key => 'tenant:1', unique_key => 'u1'`)
	require.NoError(t, err)
	require.Equal(t, 1, e.countLive("id = $1 AND concurrency_key = 'tenant:1'", sqlID))
}

// TestSQLEnqueueAnySchemaName: in a schema whose name needs quoting,
// enqueue() takes the same ordering-key lock as Go and posts on the
// channel the Go listener listens on.
func TestSQLEnqueueAnySchemaName(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	e := &env{t: t, pool: pool, schema: "Mixed_" + testdb.Schema(t)}
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE")
		require.NoError(t, err)
	})
	e.q = e.queue(pool, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	require.NoError(t, e.q.Migrate(ctx))
	conn := sqlConn(t)

	// Go's key lock: pg_advisory_xact_lock(hashtext(schema), hashtext(key)).
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = e.sqlEnqueue(tx, `'locked', ordering_key => 'k'`)
	require.NoError(t, err)
	var held int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
		AND classid = hashtext($1)::oid AND objid = hashtext('k')::oid AND objsubid = 2`, e.schema).Scan(&held))
	require.Equal(t, 1, held)
	require.NoError(t, tx.Commit(ctx))

	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("t"))
	waitIdle(t, e, "t", starts)
	_, err = e.sqlEnqueue(conn, `'t'`)
	require.NoError(t, err)
	committed := time.Now()
	require.Less(t, awaitStart(t, starts, "no posting on the schema's channel").Sub(committed), 2*time.Second)
}

// uuidMillis is a UUIDv7's Unix milliseconds.
func uuidMillis(id uuid.UUID) uint64 {
	var ms uint64
	for _, b := range id[:6] {
		ms = ms<<8 | uint64(b)
	}
	return ms
}

// TestSQLNewJobID: enqueue()'s IDs are UUIDv7s from the database clock, in
// the order they were made.
func TestSQLNewJobID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	var before, after time.Time
	var ids []uuid.UUID
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT statement_timestamp(), array_agg(id ORDER BY n), clock_timestamp()
		FROM (SELECT n, "`+e.schema+`".new_job_id() AS id FROM generate_series(1, 2000) n) s`).Scan(&before, &ids, &after))
	prefix := func(id uuid.UUID) uint64 { // 48 bits of milliseconds, 12 of the microsecond within
		return uuidMillis(id)<<12 | uint64(id[6]&0x0f)<<8 | uint64(id[7])
	}
	seen := map[uuid.UUID]bool{}
	for i, id := range ids {
		require.Equal(t, uuid.Version(7), id.Version())
		require.Equal(t, uuid.RFC4122, id.Variant())
		ms := int64(uuidMillis(id))
		require.True(t, ms >= before.UnixMilli() && ms <= after.UnixMilli(), "time of %s within the statement", id)
		if i > 0 {
			require.GreaterOrEqual(t, prefix(id), prefix(ids[i-1]), "in one statement: time never goes back")
		}
		require.False(t, seen[id])
		seen[id] = true
	}
	// One call per statement, like enqueue() calls: strictly increasing
	// (statements are microseconds apart).
	var prev uuid.UUID
	for range 50 {
		var id uuid.UUID
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT "`+e.schema+`".new_job_id()`).Scan(&id))
		require.Positive(t, strings.Compare(id.String(), prev.String()))
		prev = id
	}
}

// TestSQLEnqueueWakesIdleWorkers: a job enqueued from SQL starts on an idle
// Go worker within milliseconds of the commit, through the same posting a
// Go enqueue sends (the backup poll is an hour away); a scheduled one on
// time; one in a transaction only once it commits.
func TestSQLEnqueueWakesIdleWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	conn := sqlConn(t)
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("sql.ping"), backlog.WorkerTags{"region": "eu"}, backlog.Concurrency(4))
	waitIdle(t, e, "sql.ping", starts)

	var lat []time.Duration
	for i := range 10 {
		call := `'sql.ping'`
		if i%2 == 1 {
			call += `, tags => '{"region": "eu"}'` // the posting carries the tags
		}
		_, err := e.sqlEnqueue(conn, call)
		require.NoError(t, err)
		committed := time.Now()
		lat = append(lat, awaitStart(t, starts, "an idle worker was not woken by enqueue()'s posting").Sub(committed))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("enqueue() commit → handler start, 10 jobs one at a time: p50 %s, max %s", lat[5], lat[9])
	require.Less(t, lat[9], 2*time.Second, "well under the backup poll (1h): woken by the posting")

	// Scheduled: the scheduled posting arms the promoter's timer.
	_, err := e.sqlEnqueue(conn, `'sql.ping', run_at => now() + interval '400 milliseconds'`)
	require.NoError(t, err)
	enq := time.Now()
	s := awaitStart(t, starts, "a job scheduled from SQL did not start (no scheduled posting?)")
	require.GreaterOrEqual(t, s.Sub(enq), 350*time.Millisecond, "not before run_at")
	require.Less(t, s.Sub(enq), 3*time.Second)

	// In a transaction: nothing before the commit (the rolled-back job
	// never exists), the committed one starts.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rolledBack, err := e.sqlEnqueue(tx, `'sql.ping'`)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	id, err := e.sqlEnqueue(tx, `'sql.ping'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	awaitStart(t, starts, "a job enqueued in a committed transaction did not start")
	e.waitState(id, 10*time.Second, backlog.StateCompleted)
	_, err = e.q.Job(ctx, rolledBack)
	require.ErrorIs(t, err, backlog.ErrNotFound)
}

// TestSQLEnqueueUniqueKeyLikeGo: a unique key a live job holds returns
// that job's ID, whichever side enqueued it; a finished job frees the key.
func TestSQLEnqueueUniqueKeyLikeGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	conn := sqlConn(t)

	goID, err := e.q.Enqueue(ctx, "u", nil, backlog.UniqueKey("k1"))
	require.NoError(t, err)
	dup, err := e.sqlEnqueue(conn, `'u', unique_key => 'k1'`)
	require.NoError(t, err)
	require.Equal(t, goID, dup, "Go's job holds the key")

	sqlID, err := e.sqlEnqueue(conn, `'u', unique_key => 'k2', ordering_key => 'o'`)
	require.NoError(t, err)
	res, err := e.q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "u", Options: []backlog.EnqueueOption{backlog.UniqueKey("k2")}}})
	require.NoError(t, err)
	require.Equal(t, backlog.Inserted{ID: sqlID, Duplicate: true}, res[0], "SQL's job holds the key")
	dup, err = e.sqlEnqueue(conn, `'u', unique_key => 'k2'`)
	require.NoError(t, err)
	require.Equal(t, sqlID, dup)
	require.Equal(t, 1, e.count("unique_key = 'k1'"))
	require.Equal(t, 1, e.count("unique_key = 'k2'"))

	// A duplicate whose prerequisite failed is still the duplicate (it
	// would arrive cancelled, beside the live holder).
	pre, err := e.q.Enqueue(ctx, "pre", nil)
	require.NoError(t, err)
	_, err = e.q.Cancel(ctx, pre)
	require.NoError(t, err)
	dup, err = e.sqlEnqueue(conn, `'u', unique_key => 'k1', depends_on => ARRAY[$1::uuid]`, pre.String())
	require.NoError(t, err)
	require.Equal(t, goID, dup)

	// A finished job frees the key.
	_, err = e.q.Cancel(ctx, goID)
	require.NoError(t, err)
	again, err := e.sqlEnqueue(conn, `'u', unique_key => 'k1'`)
	require.NoError(t, err)
	require.NotEqual(t, goID, again)

	// Under concurrency, Go and SQL callers all get the one job.
	const n = 20
	ids := make(chan uuid.UUID, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var id uuid.UUID
			var err error
			if i%2 == 0 {
				id, err = e.q.Enqueue(ctx, "u", nil, backlog.UniqueKey("k3"))
			} else {
				id, err = e.sqlEnqueue(e.pool, `'u', unique_key => 'k3'`)
			}
			ids <- id
			errs <- err
		})
	}
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	distinct := map[uuid.UUID]bool{}
	for id := range ids {
		distinct[id] = true
	}
	require.Len(t, distinct, 1)
	require.Equal(t, 1, e.count("unique_key = 'k3'"))
}

// TestSQLEnqueueOrderingAndDependencies: enqueue() joins the chains and
// dependency graph Go builds, under the same locks.
func TestSQLEnqueueOrderingAndDependencies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	conn := sqlConn(t)
	state := func(id uuid.UUID) backlog.State {
		t.Helper()
		info, err := e.q.Job(ctx, id)
		require.NoError(t, err)
		return info.State
	}

	// One chain, whichever side enqueues.
	a, err := e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
	require.NoError(t, err)
	b, err := e.sqlEnqueue(conn, `'o', ordering_key => 'k'`)
	require.NoError(t, err)
	c, err := e.q.Enqueue(ctx, "o", nil, backlog.OrderingKey("k"))
	require.NoError(t, err)
	require.Equal(t, []backlog.State{backlog.StateAvailable, backlog.StateBlocked, backlog.StateBlocked}, []backlog.State{state(a), state(b), state(c)})
	_, err = e.q.Cancel(ctx, a)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, state(b), "released when its predecessor ended")
	require.Equal(t, backlog.StateBlocked, state(c))
	_, err = e.q.Cancel(ctx, b)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, state(c))

	// Dependencies: a live prerequisite blocks, a completed one does not, a
	// cancelled one cancels.
	h, starts := startTimes()
	work(t, e.q, h, backlog.Types("done"))
	done, err := e.q.Enqueue(ctx, "done", nil)
	require.NoError(t, err)
	awaitStart(t, starts, "prerequisite did not run")
	e.waitState(done, 10*time.Second, backlog.StateCompleted)
	live, err := e.q.Enqueue(ctx, "live", nil)
	require.NoError(t, err)

	d1, err := e.sqlEnqueue(conn, `'dep', depends_on => ARRAY[$1, $2, $1]::uuid[]`, done.String(), live.String())
	require.NoError(t, err)
	require.Equal(t, backlog.StateBlocked, state(d1))
	require.Equal(t, 1, e.countLive("id = $1 AND blocked_by = 1", d1))
	d2, err := e.sqlEnqueue(conn, `'dep', depends_on => ARRAY[$1::uuid]`, done.String())
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, state(d2))
	_, err = e.q.Cancel(ctx, live)
	require.NoError(t, err)
	info, err := e.q.Job(ctx, d1)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State, "cancelled with its prerequisite")
	d3, err := e.sqlEnqueue(conn, `'dep', depends_on => ARRAY[$1::uuid]`, live.String())
	require.NoError(t, err)
	info, err = e.q.Job(ctx, d3)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State, "arrives cancelled")
	require.Equal(t, fmt.Sprintf("cancelled: prerequisite %s cancelled", live), info.LastError)

	// Go and SQL enqueues racing on one key build one chain: one job
	// available, every other behind exactly one predecessor, no job
	// followed twice.
	const n = 24
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				_, err = e.q.Enqueue(ctx, "race", nil, backlog.OrderingKey("r"))
			} else {
				_, err = e.sqlEnqueue(e.pool, `'race', ordering_key => 'r'`)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1, e.countLive("ordering_key = 'r' AND state = 'available'"))
	require.Equal(t, n-1, e.countLive("ordering_key = 'r' AND state = 'blocked' AND blocked_by = 1"))
	var edges, prereqs int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT prereq) FROM "`+e.schema+`".job_edges WHERE kind = 'order'
		AND job IN (SELECT id FROM "`+e.schema+`".jobs WHERE ordering_key = 'r')`).Scan(&edges, &prereqs))
	require.Equal(t, n-1, edges)
	require.Equal(t, n-1, prereqs, "a chain, not a tree")
}
