package backlog_test

import (
	"context"
	"encoding/json"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// A JSON number PostgreSQL's jsonb cannot hold (1e200000: numeric keeps at
// most 131072 digits before the point and 16383 after) is bad input at
// the call that gives it, naming the field: nothing is written, and a
// caller's transaction stays usable. Before, EnqueueTx returned a raw
// 22003 error and aborted the caller's transaction, and SetResult and
// SetProgress returned nil (the job then failed on the write).
func TestJSONNumbersPostgreSQLCannotStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	requireInvalid := func(err error, field string) {
		t.Helper()
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, field, ie.Field)
		require.ErrorIs(t, err, backlog.ErrInvalid)
	}
	huge := json.RawMessage(`{"n":1e200000}`)
	longRun, _ := new(big.Int).SetString("1"+strings.Repeat("0", 131072), 10) // 131073 digits

	// Inside the caller's transaction: refused, and the transaction goes on.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = e.q.EnqueueTx(ctx, tx, "num", huge)
	requireInvalid(err, "args")
	_, err = e.q.EnqueueTx(ctx, tx, "num", map[string]any{"n": json.Number("-2.5e-16384")}, backlog.OrderingKey("k"))
	requireInvalid(err, "args")
	var one int
	require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one), "the caller's transaction is still usable")
	good, err := e.q.EnqueueTx(ctx, tx, "num", json.RawMessage(`{"n":1e1000,"m":0e200000,"s":"1e200000"}`))
	require.NoError(t, err, "numbers PostgreSQL stores, and a string that only looks like one")
	require.NoError(t, tx.Commit(ctx))

	_, err = e.q.Enqueue(ctx, "num", longRun)
	requireInvalid(err, "args")
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "num"}, {Type: "num", Args: huge}})
	requireInvalid(err, "args")
	require.ErrorContains(t, err, "job 1")
	_, err = e.q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "num", Args: json.RawMessage(`[0.` + strings.Repeat("1", 16384) + `]`)}})
	requireInvalid(err, "args")
	requireInvalid(e.q.Every("nums", time.Hour, "num", huge), "args")
	// Metadata holds strings only: a string that looks like such a number
	// is just text.
	meta, err := e.q.Enqueue(ctx, "num", nil, backlog.Metadata(map[string]string{"n": "1e200000"}))
	require.NoError(t, err)
	require.Equal(t, 2, e.count("true"), "only the good jobs were written")
	info, err := e.q.Job(ctx, meta)
	require.NoError(t, err)
	require.Equal(t, "1e200000", info.Metadata["n"])
	info, err = e.q.Job(ctx, good)
	require.NoError(t, err)
	require.Contains(t, string(info.Args), `"s": "1e200000"`)
}

// In a handler: SetProgress and SetResult refuse such a number at the
// call, naming the field; the previous progress is kept, and a refused
// result fails the job with the reason (as any result that cannot be
// stored), unless a good result replaces it.
func TestJSONNumbersInResultAndProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	requireInvalid := func(err error, field string) {
		t.Helper()
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, field, ie.Field)
		require.ErrorIs(t, err, backlog.ErrInvalid)
	}
	huge := json.RawMessage(`{"n":1e200000}`)
	good, err := e.q.Enqueue(ctx, "num", nil)
	require.NoError(t, err)
	bad, err := e.q.Enqueue(ctx, "num", nil)
	require.NoError(t, err)
	type outcome struct {
		progress, result, result2 error
	}
	seen := make(chan outcome, 2)
	mux := backlog.NewMux()
	mux.HandleFunc("num", func(ctx context.Context, job *backlog.Job) error {
		var o outcome
		if err := job.SetProgress(ctx, map[string]int{"done": 1}); err != nil {
			return err
		}
		o.progress = job.SetProgress(ctx, huge)
		o.result = job.SetResult(json.RawMessage(`[1,2,3e131072]`))
		if job.ID == good {
			o.result2 = job.SetResult(map[string]any{"n": json.Number("1e131071")}) // the largest power of ten
		}
		seen <- o
		return nil
	})
	work(t, e.q, mux, backlog.Types("num"), backlog.Concurrency(1))
	for range 2 {
		select {
		case o := <-seen:
			requireInvalid(o.progress, "progress")
			requireInvalid(o.result, "result")
			require.NoError(t, o.result2)
		case <-time.After(10 * time.Second):
			t.Fatal("the handlers did not run")
		}
	}
	done := e.waitState(good, 10*time.Second, backlog.StateCompleted)
	require.JSONEq(t, `{"done":1}`, string(done.Progress), "the refused progress left the previous value")
	require.True(t, strings.HasPrefix(string(done.Result), `{"n": 1000`), "%.40s", done.Result)
	failed := e.waitState(bad, 10*time.Second, backlog.StateFailed)
	require.Contains(t, failed.LastError, "result")
	require.Contains(t, failed.LastError, "out of the range PostgreSQL stores")
	require.Equal(t, 1, failed.Attempt, "a permanent failure")
}

// A number PostgreSQL cannot store never reaches the SQL enqueue(): the
// cast of the argument to jsonb refuses it first, with PostgreSQL's own
// error (22003), and nothing is written.
func TestSQLEnqueueOfANumberPostgreSQLCannotStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `SELECT "`+e.schema+`".enqueue('num', '{"n":1e200000}')`)
	require.ErrorContains(t, err, "22003")
	_, err = e.pool.Exec(ctx, `SELECT "`+e.schema+`".enqueue('num', $1::jsonb)`, `{"n":1e200000}`)
	require.ErrorContains(t, err, "22003")
	require.Zero(t, e.count("true"))
}
