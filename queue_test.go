package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

type emailArgs struct {
	To string `json:"to"`
}

func TestEnqueueWorkComplete(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	got := make(chan string, 1)
	mux.Handle("email.send", backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a emailArgs) error {
		got <- a.To
		return job.SetResult(map[string]string{"sent": a.To})
	}))
	work(t, e.q, mux, backlog.Concurrency(2))

	id, err := e.q.Enqueue(ctx, "email.send", emailArgs{To: "a@example.com"})
	require.NoError(t, err)
	select {
	case to := <-got:
		require.Equal(t, "a@example.com", to)
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not run")
	}
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 1, info.Attempt)
	require.JSONEq(t, `{"sent":"a@example.com"}`, string(info.Result))
	require.NotNil(t, info.FinishedAt)
	var args emailArgs
	require.NoError(t, json.Unmarshal(info.Args, &args))
	require.Equal(t, "a@example.com", args.To)
}

func TestEnqueueTxCommitAndRollback(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	committed, err := e.q.EnqueueTx(ctx, tx, "tx.job", map[string]int{"n": 1})
	require.NoError(t, err)
	_, err = e.q.Job(ctx, committed)
	require.ErrorIs(t, err, backlog.ErrNotFound, "invisible before commit")
	require.NoError(t, tx.Commit(ctx))

	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	rolledBack, err := e.q.EnqueueTx(ctx, tx, "tx.job", map[string]int{"n": 2})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	ran := make(chan uuidString, 4)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		ran <- uuidString(job.ID.String())
		return nil
	}), backlog.Types("tx.job"))
	e.waitState(committed, 10*time.Second, backlog.StateCompleted)
	_, err = e.q.Job(ctx, rolledBack)
	require.ErrorIs(t, err, backlog.ErrNotFound)
	require.Equal(t, uuidString(committed.String()), <-ran)
	require.Equal(t, 1, e.count("true"))
}

type uuidString string

func TestRetryUsesBackoffOnDatabaseClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	starts := make(chan time.Time, 4)
	mux := backlog.NewMux()
	mux.HandleFunc("flaky", func(ctx context.Context, job *backlog.Job) error {
		starts <- time.Now()
		if job.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}, backlog.RetryBackoff(backlog.Backoff{Initial: 700 * time.Millisecond, Randomization: 1e-9}))
	work(t, e.q, mux)

	id, err := e.q.Enqueue(ctx, "flaky", nil)
	require.NoError(t, err)
	first := <-starts
	info := e.waitJob(id, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State == backlog.StateScheduled || i.Attempt == 2 })
	if info.State == backlog.StateScheduled {
		// run_at was set from the database clock: now() at the finish + 700ms.
		var gap time.Duration
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT (extract(epoch FROM run_at - (errors->0->>'at')::timestamptz) * 1e6)::bigint * 1000
			FROM "`+e.schema+`".jobs WHERE id = $1`, id).Scan(&gap))
		require.InDelta(t, 700*time.Millisecond, gap, float64(5*time.Millisecond))
	}
	second := <-starts
	require.GreaterOrEqual(t, second.Sub(first), 650*time.Millisecond)
	info = e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 2, info.Attempt)
	require.Len(t, info.Errors, 1)
	require.Equal(t, "first attempt fails", info.Errors[0].Error)
	require.Equal(t, 1, info.Errors[0].Attempt)
}

func TestMaxAttemptsThenFailedWithHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("always.fails", func(ctx context.Context, job *backlog.Job) error {
		return fmt.Errorf("boom %d", job.Attempt)
	})
	work(t, e.q, mux, backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: time.Millisecond}))
	id, err := e.q.Enqueue(ctx, "always.fails", nil, backlog.MaxAttempts(3))
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Equal(t, 3, info.Attempt)
	require.Equal(t, "boom 3", info.LastError)
	require.Len(t, info.Errors, 3)
	for i, ae := range info.Errors {
		require.Equal(t, i+1, ae.Attempt)
		require.Equal(t, fmt.Sprintf("boom %d", i+1), ae.Error)
		require.False(t, ae.At.IsZero())
	}
	require.NotNil(t, info.FinishedAt)
}

func TestPermanentFailsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("perm", func(ctx context.Context, job *backlog.Job) error {
		return backlog.Permanent(errors.New("bad request"))
	})
	work(t, e.q, mux)
	id, err := e.q.Enqueue(ctx, "perm", nil, backlog.MaxAttempts(5))
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Equal(t, 1, info.Attempt)
	require.Contains(t, info.LastError, "bad request")
}

func TestSnoozeDoesNotSpendAnAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	var seen []int
	mux := backlog.NewMux()
	mux.HandleFunc("snoozy", func(ctx context.Context, job *backlog.Job) error {
		mu.Lock()
		seen = append(seen, job.Attempt)
		n := len(seen)
		mu.Unlock()
		if n < 3 {
			return backlog.Snooze(50 * time.Millisecond)
		}
		return nil
	})
	work(t, e.q, mux)
	id, err := e.q.Enqueue(ctx, "snoozy", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 1, info.Attempt)
	require.Empty(t, info.Errors)
	mu.Lock()
	require.Equal(t, []int{1, 1, 1}, seen)
	mu.Unlock()
}

func TestPanicIsRecordedAndRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("panicky", func(ctx context.Context, job *backlog.Job) error {
		if job.Attempt == 1 {
			panic("kaboom")
		}
		return nil
	})
	work(t, e.q, mux, backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond}))
	id, err := e.q.Enqueue(ctx, "panicky", nil)
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 2, info.Attempt)
	require.Len(t, info.Errors, 1)
	require.Contains(t, info.Errors[0].Error, "panic: kaboom")
	require.Contains(t, info.Errors[0].Error, "queue_test.go", "the stack is recorded")
}

func TestTimeoutCancelsHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	causes := make(chan error, 2)
	mux := backlog.NewMux()
	mux.HandleFunc("slow", func(ctx context.Context, job *backlog.Job) error {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	})
	work(t, e.q, mux)
	id, err := e.q.Enqueue(ctx, "slow", nil, backlog.Timeout(100*time.Millisecond), backlog.MaxAttempts(1))
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.ErrorIs(t, <-causes, backlog.ErrJobTimeout)
	require.Contains(t, info.LastError, "deadline exceeded")
	require.Equal(t, 100*time.Millisecond, info.Timeout)
}

func TestUnknownTypeOnMuxFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("known", func(ctx context.Context, job *backlog.Job) error { return nil })
	// The Work call claims "orphan" too, but no handler is registered for it.
	work(t, e.q, mux, backlog.Types("known", "orphan"))
	id, err := e.q.Enqueue(ctx, "orphan", nil)
	require.NoError(t, err)
	// The promise is the outcome, not its speed: beside a CPU burner and
	// another test run the job was still running after 10 s.
	info := e.waitState(id, 30*time.Second, backlog.StateFailed)
	require.Equal(t, 1, info.Attempt)
	require.Contains(t, info.LastError, `no handler registered for job type "orphan"`)
}

func TestArgsThatDoNotDecodeFailPermanently(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.Handle("typed", backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a emailArgs) error { return nil }))
	work(t, e.q, mux)
	id, err := e.q.Enqueue(ctx, "typed", []int{1, 2})
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Contains(t, info.LastError, "backlog_test.emailArgs")
}

func TestOversizedResultFailsWithClearError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("big.result", func(ctx context.Context, job *backlog.Job) error {
		_ = job.SetResult(strings.Repeat("x", backlog.MaxResultBytes))
		return nil
	})
	work(t, e.q, mux)
	id, err := e.q.Enqueue(ctx, "big.result", nil)
	require.NoError(t, err)
	info := e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Contains(t, info.LastError, "invalid result")
	require.Contains(t, info.LastError, "limit")
	require.Nil(t, info.Result)
}

func TestJobNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.q.Job(context.Background(), backlog.NewID())
	require.ErrorIs(t, err, backlog.ErrNotFound)
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	q, err := backlog.New(context.Background(), pool, backlog.WithSchema(schema))
	require.NoError(t, err)
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- q.Migrate(context.Background()) }()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, q.Migrate(context.Background()))
	var v int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT version FROM "`+schema+`".schema_migrations`).Scan(&v))
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	require.Equal(t, int(ms[len(ms)-1].Version), v)
	require.NoError(t, q.Close())
	require.NoError(t, q.Close(), "Close is idempotent")
	_, err = q.Enqueue(context.Background(), "x", nil)
	require.ErrorIs(t, err, backlog.ErrClosed)
}

func TestEnqueueErrorsAreRetryableWhenTheDatabaseIsGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// A pool pointing at a port where nothing listens.
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	dead, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer dead.Close()
	q, err := backlog.New(ctx, dead, backlog.WithSchema(e.schema))
	require.NoError(t, err)
	defer q.Close()
	_, err = q.Enqueue(ctx, "x", nil)
	require.ErrorIs(t, err, backlog.ErrRetryable)
	_, err = q.Enqueue(ctx, "x", nil, backlog.UniqueKey("k"))
	require.ErrorIs(t, err, backlog.ErrRetryable)
	// Bad input is not retryable.
	_, err = e.q.Enqueue(ctx, "", nil)
	require.NotErrorIs(t, err, backlog.ErrRetryable)
}
