package backlog_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/internal/worktest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if err := testdb.Ping(); err != nil {
		// Every test and example here needs PostgreSQL; `make test`
		// provides one (scripts/with-db.sh). Under CI a missing database
		// is a failure, not a skip.
		msg := "backlog tests: no PostgreSQL at $DATABASE_URL (" + err.Error() + "); skipping every test and example. `make test` finds or starts one.\n"
		os.Stderr.WriteString(msg)
		if os.Getenv("BACKLOG_CI") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// logger returns a logger that writes through t.Log when -v, else nowhere.
func logger(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// env is one test's queue in a fresh schema.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	q      *backlog.Queue
}

func newEnv(t *testing.T, opts ...backlog.Option) *env {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	e := &env{t: t, pool: pool, schema: schema}
	e.q = e.queue(pool, opts...)
	require.NoError(t, e.q.Migrate(context.Background()))
	return e
}

// queue opens another Queue on the same schema (e.g. a second process).
func (e *env) queue(pool *pgxpool.Pool, opts ...backlog.Option) *backlog.Queue {
	e.t.Helper()
	all := append([]backlog.Option{backlog.WithSchema(e.schema), backlog.WithLogger(logger(e.t))}, opts...)
	q, err := backlog.New(context.Background(), pool, all...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { require.NoError(e.t, q.Close()) })
	return q
}

// work runs q.Work in the background until the returned stop (or cleanup).
func work(t testing.TB, q *backlog.Queue, h backlog.Handler, opts ...backlog.WorkOption) (stop func() error) {
	t.Helper()
	return worktest.Run(t, func(ctx context.Context) error { return q.Work(ctx, h, opts...) })
}

// waitJob polls the job until cond holds or the deadline passes.
func (e *env) waitJob(id uuid.UUID, within time.Duration, cond func(*backlog.JobInfo) bool) *backlog.JobInfo {
	e.t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := e.q.Job(context.Background(), id)
		require.NoError(e.t, err)
		if cond(info) {
			return info
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("job %s: condition not met within %s; last: %+v", id, within, info)
		}
		<-tick.C
	}
}

func (e *env) waitState(id uuid.UUID, within time.Duration, s backlog.State) *backlog.JobInfo {
	e.t.Helper()
	return e.waitJob(id, within, func(i *backlog.JobInfo) bool { return i.State == s })
}

// count runs a count query on the test's schema.
func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM "`+e.schema+`".all_jobs WHERE `+where, args...).Scan(&n))
	return n
}

// countLive counts the rows of the hot table (live jobs, and finished ones
// not yet moved to job_history) matching where.
func (e *env) countLive(where string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM "`+e.schema+`".jobs WHERE `+where, args...).Scan(&n))
	return n
}

// waitCount polls until count(where) reaches want or the deadline passes.
func (e *env) waitCount(where string, want int, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		got := e.count(where)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %d of %d within %s", where, got, want, within)
		}
		<-tick.C
	}
}

// logUnfinished logs the jobs not yet terminal, with their prerequisites,
// for a liveness test that failed.
func (e *env) logUnfinished() {
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT j.id, j.type, j.state, coalesce(j.ordering_key, ''), j.run_at, j.attempt,
	        coalesce((SELECT string_agg(format('%s %s %s', ed.kind, ed.prereq, coalesce(p.state::text, 'gone')), ', ')
	                    FROM "`+e.schema+`".job_edges ed LEFT JOIN "`+e.schema+`".all_jobs p ON p.id = ed.prereq
	                   WHERE ed.job = j.id), '')
	   FROM "`+e.schema+`".all_jobs j
	  WHERE j.state NOT IN ('completed', 'failed', 'cancelled')
	  ORDER BY j.ordering_key, j.id LIMIT 200`)
	if err != nil {
		e.t.Logf("unfinished jobs: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var typ, state, key, edges string
		var runAt time.Time
		var attempt int
		if err := rows.Scan(&id, &typ, &state, &key, &runAt, &attempt, &edges); err != nil {
			e.t.Logf("unfinished jobs: %v", err)
			return
		}
		e.t.Logf("unfinished: %s %s %s key %q run_at %s attempt %d edges [%s]", id, typ, state, key, runAt.Format(time.StampMilli), attempt, edges)
	}
	if err := rows.Err(); err != nil {
		e.t.Logf("unfinished jobs: %v", err)
	}
}

// stmtTracer records the SQL of every statement a pool runs.
type stmtTracer struct {
	mu   sync.Mutex
	sqls []string
}

func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.mu.Lock()
	t.sqls = append(t.sqls, d.SQL)
	t.mu.Unlock()
	return ctx
}

func (t *stmtTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// mark returns how many statements ran so far.
func (t *stmtTracer) mark() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sqls)
}

// since returns the statements run after mark m that contain sub.
func (t *stmtTracer) since(m int, sub string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, s := range t.sqls[m:] {
		if strings.Contains(s, sub) {
			out = append(out, s)
		}
	}
	return out
}

// tracedEnv is newEnv on a pool of its own whose statements are recorded.
func tracedEnv(t *testing.T, opts ...backlog.Option) (*env, *stmtTracer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.MaxConns = 8
	tr := &stmtTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := &env{t: t, pool: pool, schema: testdb.Schema(t)}
	e.q = e.queue(pool, opts...)
	require.NoError(t, e.q.Migrate(context.Background()))
	return e, tr
}

// raisePeak raises *peak to n if n is higher (the most of something seen
// running at once).
func raisePeak(peak *atomic.Int32, n int32) {
	for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
	}
}
