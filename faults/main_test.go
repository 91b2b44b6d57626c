package faults_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/internal/worktest"
)

// faultsEnv must be "1" for the suite to run; make test-faults sets it.
const faultsEnv = "BACKLOG_FAULTS"

// ciEnv is "1" in CI (.ci/run sets it): a scenario that cannot run there
// (a tool missing) fails instead of skipping.
const ciEnv = "BACKLOG_CI"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(faultsEnv) != "1" && os.Getenv(haEnv) != "1" {
		// Loud, so that a bare "ok" is never taken for a passing suite.
		fmt.Fprintf(os.Stderr, "\n*** faults: %s is not 1: EVERY fault scenario is SKIPPED, nothing was tested. "+
			"Run them with `make test-faults` (or %s=1 go test -race -v ./faults/). ***\n\n", faultsEnv, faultsEnv)
	}
	code := m.Run()
	printSummary()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// requireFaults skips the test unless the slow fault suite was asked for.
func requireFaults(t *testing.T) {
	t.Helper()
	if os.Getenv(faultsEnv) != "1" {
		t.Skipf("fault-injection scenario (slow): set %s=1 to run it, e.g. `make test-faults`", faultsEnv)
	}
}

// --- the summary table printed after the run ---

type summaryRow struct {
	Scenario   string
	Jobs       int
	Faults     string
	Lost       int
	Duplicates string
	Pickup     string
}

var (
	summaryMu sync.Mutex
	summary   []summaryRow
)

func report(t testing.TB, r summaryRow) {
	t.Helper()
	t.Logf("summary: %s | jobs %d | faults: %s | lost %d | duplicates: %s | pickup: %s",
		r.Scenario, r.Jobs, r.Faults, r.Lost, r.Duplicates, r.Pickup)
	summaryMu.Lock()
	defer summaryMu.Unlock()
	summary = append(summary, r)
}

func printSummary() {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	if len(summary) == 0 {
		return
	}
	var b strings.Builder
	b.WriteString("\n| scenario | jobs | faults injected | jobs lost | duplicate executions (why) | worst pickup delay after recovery |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, r := range summary {
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %s | %s |\n", r.Scenario, r.Jobs, r.Faults, r.Lost, r.Duplicates, r.Pickup)
	}
	fmt.Print(b.String())
}

// --- logging ---

// logger writes the library's warnings and errors through t.Log (when -v),
// tagged with who logs; debug and info are dropped to keep the output
// readable.
func logger(t testing.TB, who string) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})).With("queue", who)
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// --- one scenario's database ---

// fenv is one scenario's schema: the queue tables (migrated), an
// executions table the handlers write to, and a control pool (the shared
// test pool, direct to PostgreSQL, never a target of injected faults).
type fenv struct {
	t      testing.TB
	schema string
	ctl    *pgxpool.Pool
	q      *backlog.Queue // on ctl: enqueues and lookups from the test
}

func newFEnv(t *testing.T) *fenv {
	t.Helper()
	ctl := testdb.Pool(t)
	e := &fenv{t: t, schema: testdb.Schema(t), ctl: ctl}
	e.q = e.queue(ctl, "control")
	require.NoError(t, e.q.Migrate(context.Background()))
	_, err := ctl.Exec(context.Background(), `CREATE TABLE `+e.table("executions")+` (
		job_id     uuid        NOT NULL,
		attempt    integer     NOT NULL,
		worker     text        NOT NULL,
		started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
		stopped_at timestamptz,
		note       text)`)
	require.NoError(t, err)
	return e
}

// table returns a quoted, schema-qualified table name.
func (e *fenv) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

// app is the application_name for the connections of one queue under test:
// faults are injected by terminating backends with that name only.
func (e *fenv) app(who string) string { return "bf_" + e.schema + "_" + who }

// queue opens a Queue on e's schema over pool, closed at cleanup.
func (e *fenv) queue(pool *pgxpool.Pool, who string, opts ...backlog.Option) *backlog.Queue {
	e.t.Helper()
	all := append([]backlog.Option{backlog.WithSchema(e.schema), backlog.WithLogger(logger(e.t, who)),
		backlog.WithWorkerID(who)}, opts...)
	q, err := backlog.New(context.Background(), pool, all...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { require.NoError(e.t, q.Close()) })
	return q
}

// pool opens a pool for a queue under test, closed at cleanup. Its
// connections carry application_name e.app(who); edit may change the
// config further (e.g. point it at a proxy).
func (e *fenv) pool(who string, maxConns int32, edit func(*pgxpool.Config)) *pgxpool.Pool {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(e.t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = e.app(who)
	if edit != nil {
		edit(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(p.Close)
	return p
}

// record inserts an execution row on db (the handler's side effect) and
// returns its start time on the database clock.
func (e *fenv) record(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, job *backlog.Job, worker string) (time.Time, error) {
	var at time.Time
	err := db.QueryRow(ctx, `INSERT INTO `+e.table("executions")+` (job_id, attempt, worker) VALUES ($1, $2, $3) RETURNING started_at`,
		job.ID, job.Attempt, worker).Scan(&at)
	return at, err
}

// dbNow reads the database clock on the control pool.
func (e *fenv) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	require.NoError(e.t, e.ctl.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// work runs q.Work in the background until the returned stop (or cleanup).
func work(t testing.TB, q *backlog.Queue, h backlog.Handler, opts ...backlog.WorkOption) (stop func() error) {
	t.Helper()
	return worktest.Run(t, func(ctx context.Context) error { return q.Work(ctx, h, opts...) })
}

// eventually polls cond every tick until it returns true or within passes.
func eventually(t testing.TB, within, tick time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for {
		if cond() {
			return
		}
		select {
		case <-deadline.C:
			if cond() {
				return
			}
			t.Fatalf("%s: not within %s", what, within)
		case <-tk.C:
		}
	}
}

// count runs a count query on the control pool.
func (e *fenv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.ctl.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// waitSettled waits until no job of the schema is blocked, available or
// running any more.
func (e *fenv) waitSettled(within time.Duration) {
	e.t.Helper()
	eventually(e.t, within, 50*time.Millisecond, "every job reaches a terminal state", func() bool {
		return e.count(`SELECT count(*) FROM `+e.table("jobs")+` WHERE state IN ('blocked', 'scheduled', 'available', 'running')`) == 0
	})
}

// --- exact accounting ---

type execRow struct {
	Job     string
	Attempt int
	Worker  string
	Started time.Time
	Stopped *time.Time
	Note    string
}

type jobRow struct {
	ID        string
	Type      string
	State     string
	Attempt   int
	Worker    string
	LastError string
	Errors    []backlog.AttemptError
	Execs     []execRow // by start time
}

// ledger is every job of a schema with its execution rows.
type ledger struct {
	jobs    map[string]*jobRow
	states  map[string]int
	execs   int
	orphans int // execution rows of unknown jobs
}

func (e *fenv) ledger() *ledger {
	e.t.Helper()
	ctx := context.Background()
	l := &ledger{jobs: map[string]*jobRow{}, states: map[string]int{}}
	rows, err := e.ctl.Query(ctx, `SELECT id::text, type, state, attempt, COALESCE(worker, ''), COALESCE(last_error, ''), errors
		FROM `+e.table("all_jobs"))
	require.NoError(e.t, err)
	for rows.Next() {
		j := &jobRow{}
		require.NoError(e.t, rows.Scan(&j.ID, &j.Type, &j.State, &j.Attempt, &j.Worker, &j.LastError, &j.Errors))
		l.jobs[j.ID] = j
		l.states[j.State]++
	}
	require.NoError(e.t, rows.Err())
	rows, err = e.ctl.Query(ctx, `SELECT job_id::text, attempt, worker, started_at, stopped_at, COALESCE(note, '')
		FROM `+e.table("executions")+` ORDER BY started_at, attempt`)
	require.NoError(e.t, err)
	for rows.Next() {
		var x execRow
		require.NoError(e.t, rows.Scan(&x.Job, &x.Attempt, &x.Worker, &x.Started, &x.Stopped, &x.Note))
		l.execs++
		if j := l.jobs[x.Job]; j != nil {
			j.Execs = append(j.Execs, x)
		} else {
			l.orphans++
		}
	}
	require.NoError(e.t, rows.Err())
	return l
}

// duplicates returns the jobs that were executed more than once.
func (l *ledger) duplicates() []*jobRow {
	var out []*jobRow
	for _, j := range l.jobs {
		if len(j.Execs) > 1 {
			out = append(out, j)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// requireCompletedOnceNoAttemptTwice checks the common ground of every
// scenario: nothing is left blocked, available or running; every job of the
// given types is completed; the completing attempt is the last execution
// (same attempt, same worker) and no attempt ran twice; execution rows name
// only known jobs.
//
// It does NOT rule out re-executions: a job whose attempt 1 ran, was lost
// and ran again as attempt 2 passes. Scenarios that promise no duplicate
// also call requireOneExecutionEach; those with re-runs by design check
// each re-run against its cause.
func (l *ledger) requireCompletedOnceNoAttemptTwice(t *testing.T, types ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, typ := range types {
		want[typ] = true
	}
	require.Zero(t, l.orphans, "execution rows of unknown jobs")
	for _, s := range []string{"blocked", "available", "running"} {
		require.Zero(t, l.states[s], "jobs left %s", s)
	}
	for _, j := range l.jobs {
		if !want[j.Type] {
			continue
		}
		require.Equal(t, "completed", j.State, "job %s (%s): %+v", j.ID, j.Type, j)
		require.NotEmpty(t, j.Execs, "completed job %s has no execution row", j.ID)
		last := j.Execs[len(j.Execs)-1]
		require.Equal(t, j.Attempt, last.Attempt, "job %s: the completing attempt is its last execution: %+v", j.ID, j)
		require.Equal(t, j.Worker, last.Worker, "job %s: completed by the worker of its last execution: %+v", j.ID, j)
		seen := map[int]bool{}
		for _, x := range j.Execs {
			require.False(t, seen[x.Attempt], "job %s: attempt %d executed twice: %+v", j.ID, x.Attempt, j.Execs)
			seen[x.Attempt] = true
		}
	}
}

// requireOneExecutionEach checks that every job of the given types (at
// least one) ran its handler exactly once: no re-execution of any kind,
// whatever its attempt number.
func (l *ledger) requireOneExecutionEach(t *testing.T, types ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, typ := range types {
		want[typ] = true
	}
	n := 0
	for _, j := range l.jobs {
		if !want[j.Type] {
			continue
		}
		n++
		require.Len(t, j.Execs, 1, "job %s (%s) must have exactly one execution: %+v", j.ID, j.Type, j.Execs)
	}
	require.Positive(t, n, "no job of types %v", types)
}

// errorOf returns the recorded error of one attempt, or "".
func (j *jobRow) errorOf(attempt int) string {
	for _, e := range j.Errors {
		if e.Attempt == attempt {
			return e.Error
		}
	}
	return ""
}

// errorAtOf returns when the error of an attempt was recorded.
func (j *jobRow) errorAtOf(attempt int) time.Time {
	for _, e := range j.Errors {
		if e.Attempt == attempt {
			return e.At
		}
	}
	return time.Time{}
}

// durations summarises pickup delays.
type durations []time.Duration

func (d durations) String() string {
	if len(d) == 0 {
		return "n/a"
	}
	s := append(durations(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("worst %s (median %s, n=%d)", s[len(s)-1].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond), len(s))
}

// firstStartAfter returns the earliest execution start after t, optionally
// only of one worker.
func (l *ledger) firstStartAfter(t time.Time, worker string) (time.Time, bool) {
	var best time.Time
	found := false
	for _, j := range l.jobs {
		for _, x := range j.Execs {
			if x.Started.After(t) && (worker == "" || x.Worker == worker) && (!found || x.Started.Before(best)) {
				best, found = x.Started, true
			}
		}
	}
	return best, found
}

// failRecorder repeats what failed a test as its last lines: after a
// failure the cleanups still log (the cluster's logs, closing queues),
// and a CI summary shows only a failed test's last lines.
type failRecorder struct {
	*testing.T
	mu   sync.Mutex
	msgs []string
}

// recordFailures wraps t; its Errorf, Error, Fatalf and Fatal are t's,
// and what they said is logged again when every cleanup registered
// after this call has run.
func recordFailures(t *testing.T) *failRecorder {
	f := &failRecorder{T: t}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.msgs) > 0 {
			t.Logf("FAILED, as said above:\n\t%s", strings.Join(f.msgs, "\n\t"))
		}
	})
	return f
}

func (f *failRecorder) note(msg string) {
	f.mu.Lock()
	f.msgs = append(f.msgs, msg)
	f.mu.Unlock()
}

func (f *failRecorder) Errorf(format string, args ...any) {
	f.Helper()
	f.note(fmt.Sprintf(format, args...))
	f.T.Errorf(format, args...)
}

func (f *failRecorder) Error(args ...any) {
	f.Helper()
	f.note(fmt.Sprint(args...))
	f.T.Error(args...)
}

func (f *failRecorder) Fatalf(format string, args ...any) {
	f.Helper()
	f.note(fmt.Sprintf(format, args...))
	f.T.Fatalf(format, args...)
}

func (f *failRecorder) Fatal(args ...any) {
	f.Helper()
	f.note(fmt.Sprint(args...))
	f.T.Fatal(args...)
}
