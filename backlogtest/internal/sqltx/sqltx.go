// Package sqltx is the test suite of enqueueing inside a caller's
// transaction (EnqueueTx, EnqueueManyTx, InsertMany), run once per kind of
// transaction backlog accepts: a pgx.Tx and a *sql.Tx of pgx's stdlib
// driver (backlogtest's sqltx_test.go) and a *sql.Tx of lib/pq
// (backlogtest/internal/pqtest, a module of its own so the library never requires
// lib/pq). Every kind must pass the same tests.
package sqltx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/internal/worktest"
)

// Tx is a transaction of the caller's as the suite drives it.
type Tx struct {
	// Value is what EnqueueTx is given.
	Value backlog.Tx
	// Exec runs a statement in the transaction.
	Exec func(ctx context.Context, query string, args ...any) error
	// Int runs a query returning one integer in the transaction.
	Int      func(ctx context.Context, query string, args ...any) (int64, error)
	Commit   func(ctx context.Context) error
	Rollback func(ctx context.Context) error
}

// Begin starts a transaction; the suite rolls it back at the test's end if
// it is still open.
type Begin func(ctx context.Context) (*Tx, error)

// SQL begins transactions on a database/sql pool.
func SQL(db *sql.DB) Begin {
	return func(ctx context.Context) (*Tx, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return &Tx{
			Value: tx,
			Exec: func(ctx context.Context, q string, args ...any) error {
				_, err := tx.ExecContext(ctx, q, args...)
				return err
			},
			Int: func(ctx context.Context, q string, args ...any) (n int64, err error) {
				err = tx.QueryRowContext(ctx, q, args...).Scan(&n)
				return n, err
			},
			Commit:   func(context.Context) error { return tx.Commit() },
			Rollback: func(context.Context) error { return tx.Rollback() },
		}, nil
	}
}

// Pgx begins transactions on a pgx pool.
func Pgx(pool *pgxpool.Pool) Begin {
	return func(ctx context.Context) (*Tx, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return &Tx{
			Value: tx,
			Exec: func(ctx context.Context, q string, args ...any) error {
				_, err := tx.Exec(ctx, q, args...)
				return err
			},
			Int: func(ctx context.Context, q string, args ...any) (n int64, err error) {
				err = tx.QueryRow(ctx, q, args...).Scan(&n)
				return n, err
			},
			Commit:   tx.Commit,
			Rollback: tx.Rollback,
		}, nil
	}
}

// Run runs the suite with transactions from begin.
func Run(t *testing.T, begin Begin) {
	tests := []struct {
		name string
		run  func(*env)
	}{
		{"CommitWakesWorker", testCommitWakesWorker(false)},
		{"CommitWakesWorkerPollOnly", testCommitWakesWorker(true)},
		{"Rollback", testRollback},
		{"BadInputKeepsTxUsable", testBadInput},
		{"IDTakenMeanwhile", testIDTakenMeanwhile},
		{"UniqueKeyDuplicate", testUniqueDuplicate},
		{"Graph", testGraph},
		{"CompletedPrerequisite", testCompletedPrerequisite},
		{"Many", testMany},
	}
	tests = append(tests, isolationTests()...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(&env{t: t, begin: begin})
		})
	}
}

type env struct {
	t      *testing.T
	begin  Begin
	pool   *pgxpool.Pool
	schema string
	q      *backlog.Queue
}

func (e *env) ctx() context.Context { return context.Background() }

// queue opens the test's Queue in a fresh schema.
func (e *env) queue(opts ...backlog.Option) *backlog.Queue {
	e.t.Helper()
	e.pool, e.schema = testdb.Pool(e.t), testdb.Schema(e.t)
	all := append([]backlog.Option{backlog.WithSchema(e.schema),
		backlog.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	q, err := backlog.New(e.ctx(), e.pool, all...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { require.NoError(e.t, q.Close()) })
	require.NoError(e.t, q.Migrate(e.ctx()))
	e.q = q
	return q
}

// tx begins a transaction, rolled back at cleanup unless it ended.
func (e *env) tx() *Tx {
	e.t.Helper()
	tx, err := e.begin(e.ctx())
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// count counts the schema's jobs (live and finished) matching where.
func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(e.ctx(), `SELECT count(*) FROM "`+e.schema+`".all_jobs WHERE `+where, args...).Scan(&n))
	return n
}

// requireInput checks that err is an *InputError naming field.
func requireInput(t *testing.T, err error, field string) {
	t.Helper()
	var in *backlog.InputError
	require.True(t, errors.As(err, &in), "want *InputError on %q, got %v", field, err)
	require.Equal(t, field, in.Field, "%v", err)
}

// requireUsable checks that tx still runs statements.
func requireUsable(t *testing.T, tx *Tx) {
	t.Helper()
	n, err := tx.Int(context.Background(), `SELECT 1`)
	require.NoError(t, err, "the caller's transaction must stay usable")
	require.EqualValues(t, 1, n)
}

// recorder is a handler that records the jobs it ran, in order.
type recorder struct {
	mu  sync.Mutex
	ids []uuid.UUID
	ran chan uuid.UUID
}

func newRecorder() *recorder { return &recorder{ran: make(chan uuid.UUID, 10_000)} }

func (r *recorder) Work(_ context.Context, job *backlog.Job) error {
	r.mu.Lock()
	r.ids = append(r.ids, job.ID)
	r.mu.Unlock()
	r.ran <- job.ID
	return nil
}

// await waits until every id ran.
func (r *recorder) await(t *testing.T, within time.Duration, ids ...uuid.UUID) {
	t.Helper()
	want := map[uuid.UUID]bool{}
	for _, id := range ids {
		want[id] = true
	}
	timer := time.NewTimer(within)
	defer timer.Stop()
	for len(want) > 0 {
		select {
		case id := <-r.ran:
			delete(want, id)
		case <-timer.C:
			t.Fatalf("%d of %d jobs did not run within %s", len(want), len(ids), within)
		}
	}
}

// testCommitWakesWorker: jobs enqueued in a transaction are invisible until
// it commits, then a running worker starts them at once: with the backup
// poll at an hour, only the commit's wake-up (the NOTIFY, or in poll-only
// mode the Queue's watch of the transaction) can start them in time.
func testCommitWakesWorker(pollOnly bool) func(*env) {
	return func(e *env) {
		opts := []backlog.Option{backlog.WithPollInterval(time.Hour)}
		if pollOnly {
			opts = append(opts, backlog.WithPollOnly())
		}
		q := e.queue(opts...)
		rec := newRecorder()
		stop := worktest.Run(e.t, func(ctx context.Context) error {
			return q.Work(ctx, rec, backlog.Types("sqltx.wake"), backlog.WorkerTags{"region": "eu"})
		})
		defer func() { require.NoError(e.t, stop()) }()
		// Once a first job ran, the worker is up and waits for a wake-up.
		warm, err := q.Enqueue(e.ctx(), "sqltx.wake", nil)
		require.NoError(e.t, err)
		rec.await(e.t, 20*time.Second, warm)

		tx := e.tx()
		id, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.wake", map[string]string{"k": "v"}, backlog.Tags{"region": "eu"})
		require.NoError(e.t, err)
		more, err := q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{{Type: "sqltx.wake"}, {Type: "sqltx.wake", Args: []int{1}}})
		require.NoError(e.t, err)
		_, err = q.Job(e.ctx(), id)
		require.ErrorIs(e.t, err, backlog.ErrNotFound, "not visible before the commit")
		require.NoError(e.t, tx.Commit(e.ctx()))
		rec.await(e.t, 20*time.Second, append(more, id)...)
		info, err := q.Job(e.ctx(), id)
		require.NoError(e.t, err)
		require.Equal(e.t, map[string]string{"region": "eu"}, info.Tags)
		require.JSONEq(e.t, `{"k": "v"}`, string(info.Args))
	}
}

// testRollback: a rolled-back transaction leaves no job, edge or key.
func testRollback(e *env) {
	q := e.queue()
	tx := e.tx()
	a, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.rb", nil, backlog.UniqueKey("rb:u"), backlog.OrderingKey("rb:o"))
	require.NoError(e.t, err)
	_, err = q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{
		{Type: "sqltx.rb", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}},
		{Type: "sqltx.rb", Options: []backlog.EnqueueOption{backlog.ConcurrencyKey("rb:c")}},
	})
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Rollback(e.ctx()))
	require.Zero(e.t, e.count(`true`))
	var edges int
	require.NoError(e.t, e.pool.QueryRow(e.ctx(), `SELECT count(*) FROM "`+e.schema+`".job_edges`).Scan(&edges))
	require.Zero(e.t, edges)
	// The unique key is free again.
	b, err := q.Enqueue(e.ctx(), "sqltx.rb", nil, backlog.UniqueKey("rb:u"))
	require.NoError(e.t, err)
	require.NotEqual(e.t, a, b)
}

// testBadInput: bad input returns an *InputError, writes nothing, and
// leaves the caller's transaction usable, holding none of the enqueue's
// locks.
func testBadInput(e *env) {
	q := e.queue()
	existing, err := q.Enqueue(e.ctx(), "sqltx.bad", nil)
	require.NoError(e.t, err)
	tx := e.tx()

	_, err = q.EnqueueTx(e.ctx(), tx.Value, "", nil)
	requireInput(e.t, err, "type")
	requireUsable(e.t, tx)

	_, err = q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{{Type: "sqltx.bad"}, {Type: "sqltx.bad", Options: []backlog.EnqueueOption{backlog.Priority(101)}}})
	requireInput(e.t, err, "priority")
	requireUsable(e.t, tx)

	// Judged by the database, after the ordering key's lock was taken.
	_, err = q.EnqueueTx(e.ctx(), tx.Value, "sqltx.bad", nil, backlog.OrderingKey("bad:o"), backlog.DependsOn(backlog.NewID()))
	requireInput(e.t, err, "depends on")
	requireUsable(e.t, tx)
	// The key's lock went with the savepoint: another transaction takes it
	// at once.
	ctx, cancel := context.WithTimeout(e.ctx(), 10*time.Second)
	defer cancel()
	_, err = q.Enqueue(ctx, "sqltx.bad", nil, backlog.OrderingKey("bad:o"))
	require.NoError(e.t, err, "the ordering key must not stay locked by the caller's transaction")

	_, err = q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{{ID: existing, Type: "sqltx.bad"}})
	requireInput(e.t, err, "id")
	requireUsable(e.t, tx)

	_, err = q.InsertMany(e.ctx(), tx.Value, nil)
	requireInput(e.t, err, "jobs")
	requireUsable(e.t, tx)

	good, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.bad", nil, backlog.OrderingKey("bad:o"))
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(e.ctx()))
	require.Equal(e.t, 3, e.count(`true`), "the first job, the other transaction's and the good one")
	require.Equal(e.t, 1, e.count(`id = $1`, good))
}

// testIDTakenMeanwhile: an ID that another transaction inserts while the
// enqueue runs is found by the insert itself (a unique violation, which
// would abort the caller's transaction without the savepoint).
func testIDTakenMeanwhile(e *env) {
	q := e.queue()
	id := backlog.NewID()
	other, err := e.pool.Begin(e.ctx())
	require.NoError(e.t, err)
	defer func() { _ = other.Rollback(context.Background()) }()
	_, err = q.EnqueueTx(e.ctx(), other, "sqltx.race", nil)
	require.NoError(e.t, err)
	_, err = q.EnqueueManyTx(e.ctx(), other, []backlog.JobSpec{{ID: id, Type: "sqltx.race"}})
	require.NoError(e.t, err)

	tx := e.tx()
	pid, err := tx.Int(e.ctx(), `SELECT pg_backend_pid()`)
	require.NoError(e.t, err)
	done := make(chan error, 1)
	go func() {
		_, err := q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{{ID: id, Type: "sqltx.race"}})
		done <- err
	}()
	// Wait until the insert waits for the other transaction's row.
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting bool
		require.NoError(e.t, e.pool.QueryRow(e.ctx(),
			`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`, pid).Scan(&waiting))
		if waiting {
			break
		}
		select {
		case err := <-done:
			e.t.Fatalf("the enqueue ended before the other transaction committed: %v", err)
		default:
		}
		require.True(e.t, time.Now().Before(deadline), "the enqueue never waited for the other transaction")
		<-tick.C
	}
	require.NoError(e.t, other.Commit(e.ctx()))
	requireInput(e.t, <-done, "id")
	requireUsable(e.t, tx)
	mine, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.race", nil)
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(e.ctx()))
	require.Equal(e.t, 1, e.count(`id = $1`, mine))
	require.Equal(e.t, 3, e.count(`true`))
}

// testUniqueDuplicate: a unique key held by a live job returns the
// holder's ID, in EnqueueTx and InsertMany.
func testUniqueDuplicate(e *env) {
	q := e.queue()
	holder, err := q.Enqueue(e.ctx(), "sqltx.uniq", nil, backlog.UniqueKey("u:1"))
	require.NoError(e.t, err)
	tx := e.tx()
	id, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.uniq", nil, backlog.UniqueKey("u:1"))
	require.NoError(e.t, err)
	require.Equal(e.t, holder, id)
	res, err := q.InsertMany(e.ctx(), tx.Value, []backlog.JobSpec{
		{Type: "sqltx.uniq", Options: []backlog.EnqueueOption{backlog.UniqueKey("u:1")}},
		{Type: "sqltx.uniq", Options: []backlog.EnqueueOption{backlog.UniqueKey("u:2")}},
	})
	require.NoError(e.t, err)
	require.Equal(e.t, backlog.Inserted{ID: holder, Duplicate: true}, res[0])
	require.False(e.t, res[1].Duplicate)
	// Within the transaction, the new holder of u:2 is found too.
	again, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.uniq", nil, backlog.UniqueKey("u:2"))
	require.NoError(e.t, err)
	require.Equal(e.t, res[1].ID, again)
	require.NoError(e.t, tx.Commit(e.ctx()))
	require.Equal(e.t, 1, e.count(`unique_key = 'u:1'`))
	require.Equal(e.t, 1, e.count(`unique_key = 'u:2'`))
}

// testCompletedPrerequisite: a job enqueued in the caller's transaction
// with a prerequisite that had already completed lists it and reads its
// result (migration 0012's recordInputs runs on that transaction too),
// and keeps its metadata (0011); its progress is recorded.
func testCompletedPrerequisite(e *env) {
	q := e.queue()
	type page struct {
		Words int `json:"words"`
	}
	p, err := q.Enqueue(e.ctx(), "sqltx.fetch", nil)
	require.NoError(e.t, err)
	got := make(chan page, 1)
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if job.Type == "sqltx.fetch" {
			return job.SetResult(page{Words: 7})
		}
		if !slices.Equal(job.PrerequisiteIDs(), []uuid.UUID{p}) {
			return backlog.Permanent(fmt.Errorf("prerequisites %v, want [%s]", job.PrerequisiteIDs(), p))
		}
		if job.Metadata["m"] != "v" {
			return backlog.Permanent(fmt.Errorf("metadata %v", job.Metadata))
		}
		r, err := backlog.PrerequisiteResult[page](ctx, job, p)
		if err != nil {
			return err
		}
		if err := job.SetProgress(ctx, map[string]int{"done": 1}); err != nil {
			return err
		}
		got <- r
		return nil
	})
	stop := worktest.Run(e.t, func(ctx context.Context) error {
		return q.Work(ctx, h, backlog.Types("sqltx.fetch", "sqltx.count"))
	})
	require.Eventually(e.t, func() bool {
		info, err := q.Job(e.ctx(), p)
		return err == nil && info.State == backlog.StateCompleted
	}, 30*time.Second, 10*time.Millisecond)

	tx := e.tx()
	d, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.count", nil, backlog.DependsOn(p), backlog.Metadata(map[string]string{"m": "v"}))
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(e.ctx()))
	select {
	case r := <-got:
		require.Equal(e.t, page{Words: 7}, r)
	case <-time.After(30 * time.Second):
		e.t.Fatal("the dependent did not run")
	}
	require.Eventually(e.t, func() bool {
		info, err := q.Job(e.ctx(), d)
		return err == nil && info.State == backlog.StateCompleted
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(e.t, stop())
	info, err := q.Job(e.ctx(), d)
	require.NoError(e.t, err)
	require.Equal(e.t, map[string]string{"m": "v"}, info.Metadata)
	require.JSONEq(e.t, `{"done": 1}`, string(info.Progress))
}

// testGraph: a small DAG and an ordering chain enqueued in one
// transaction, over several calls, run in dependency order.
func testGraph(e *env) {
	q := e.queue()
	tx := e.tx()
	a, b, c := backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err := q.EnqueueManyTx(e.ctx(), tx.Value, []backlog.JobSpec{
		{ID: c, Type: "sqltx.dag", Options: []backlog.EnqueueOption{backlog.DependsOn(a, b)}},
		{ID: a, Type: "sqltx.dag"},
		{ID: b, Type: "sqltx.dag", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}},
	})
	require.NoError(e.t, err)
	// Depends on a job of the same, uncommitted, transaction.
	d, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.dag", nil, backlog.DependsOn(c))
	require.NoError(e.t, err)
	k1, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.dag", nil, backlog.OrderingKey("dag:k"))
	require.NoError(e.t, err)
	k2, err := q.EnqueueTx(e.ctx(), tx.Value, "sqltx.dag", nil, backlog.OrderingKey("dag:k"), backlog.ConcurrencyKey("dag:c"),
		backlog.Metadata(map[string]string{"m": "v"}))
	require.NoError(e.t, err)
	require.NoError(e.t, tx.Commit(e.ctx()))

	for id, want := range map[uuid.UUID]backlog.State{a: backlog.StateAvailable, b: backlog.StateBlocked, c: backlog.StateBlocked,
		d: backlog.StateBlocked, k1: backlog.StateAvailable, k2: backlog.StateBlocked} {
		info, err := q.Job(e.ctx(), id)
		require.NoError(e.t, err)
		require.Equal(e.t, want, info.State, "job %s", id)
	}
	info, err := q.Job(e.ctx(), k2)
	require.NoError(e.t, err)
	require.Equal(e.t, "dag:c", info.ConcurrencyKey)
	require.Equal(e.t, map[string]string{"m": "v"}, info.Metadata)

	rec := newRecorder()
	stop := worktest.Run(e.t, func(ctx context.Context) error { return q.Work(ctx, rec, backlog.Types("sqltx.dag")) })
	rec.await(e.t, 30*time.Second, a, b, c, d, k1, k2)
	require.NoError(e.t, stop())
	pos := func(id uuid.UUID) int { return slices.Index(rec.ids, id) }
	require.Less(e.t, pos(a), pos(b))
	require.Less(e.t, pos(b), pos(c))
	require.Less(e.t, pos(c), pos(d))
	require.Less(e.t, pos(k1), pos(k2))
}

// testMany: EnqueueManyTx of 1,000 jobs writes the rows the pgx path
// writes for the same specs, text that needs quoting included.
func testMany(e *env) {
	q := e.queue()
	at := time.Date(2031, 7, 1, 12, 30, 45, 123456789, time.UTC)
	specs := func() []backlog.JobSpec {
		specs := make([]backlog.JobSpec, 1000)
		for i := range specs {
			s := backlog.JobSpec{Type: fmt.Sprintf("sqltx.many.%d", i%7), Args: map[string]any{"i": i, "s": `q"uo\te {a,b} ' é ☃`}}
			s.Options = []backlog.EnqueueOption{backlog.Priority(i % 101), backlog.MaxAttempts(1 + i%9)}
			switch i % 5 {
			case 0:
				s.Options = append(s.Options, backlog.Tags{"t": `x"y\z,{}`, "n": fmt.Sprint(i)}, backlog.ConcurrencyKey(fmt.Sprintf(`tenant "%d", {x}`, i%3)))
			case 1:
				s.Options = append(s.Options, backlog.RunAt(at), backlog.Timeout(1500*time.Millisecond))
			case 2:
				s.Options = append(s.Options, backlog.Delay(time.Hour))
			case 3:
				s.Args = nil
				s.Options = append(s.Options, backlog.Metadata(map[string]string{"trace": `t"1\{x}`, "n": fmt.Sprint(i)}))
			}
			specs[i] = s
		}
		return specs
	}
	tx := e.tx()
	viaTx, err := q.EnqueueManyTx(e.ctx(), tx.Value, specs())
	require.NoError(e.t, err)
	require.Len(e.t, viaTx, 1000)
	require.NoError(e.t, tx.Commit(e.ctx()))
	viaPool, err := q.EnqueueMany(e.ctx(), specs())
	require.NoError(e.t, err)

	rows := func(ids []uuid.UUID) []string {
		r, err := e.pool.Query(e.ctx(), `SELECT concat_ws('|', j.type, j.args::text, j.tags::text, j.priority, j.max_attempts, j.timeout_ms, j.state,
			COALESCE(j.concurrency_key, '<none>'), COALESCE(j.meta::text, '<none>'), CASE WHEN j.run_at > now() + interval '1 day' THEN j.run_at::text ELSE 'near' END)
			FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n) JOIN "`+e.schema+`".jobs j ON j.id = u.id ORDER BY u.n`, ids)
		require.NoError(e.t, err)
		out, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(e.t, err)
		return out
	}
	got, want := rows(viaTx), rows(viaPool)
	require.Len(e.t, got, 1000)
	require.Equal(e.t, want, got)
	require.Equal(e.t, 200, e.count(`concurrency_key IS NOT NULL AND id = ANY($1)`, viaTx))
	require.Equal(e.t, 400, e.count(`state = 'scheduled' AND id = ANY($1)`, viaTx))
	withMeta := 0
	for _, r := range got {
		if strings.Contains(r, `"trace"`) {
			withMeta++
		}
	}
	require.Equal(e.t, 200, withMeta)
}
