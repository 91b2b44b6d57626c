package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// TestAttemptFigures: each attempt that did not succeed is recorded with
// its worker, start, run time and outcome (an error, a timeout on the
// last-but-one attempt, a panic, and a timeout on the last attempt,
// which fails the job); the successful attempt of another job adds no
// entry, its figures being the job's own.
func TestAttemptFigures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithWorkerID("w-figures"))
	ctx := context.Background()
	mux := backlog.NewMux()
	bo := backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond})
	mux.HandleFunc("steps", func(ctx context.Context, job *backlog.Job) error {
		switch job.Attempt {
		case 1:
			return errors.New("printer on fire")
		case 2:
			panic("out of toner")
		default: // 3 and 4: wait for the job's timeout
			<-ctx.Done()
			return ctx.Err()
		}
	}, bo)
	mux.HandleFunc("ok", func(context.Context, *backlog.Job) error { return nil })
	stop := work(t, e.q, mux)
	defer func() { require.NoError(t, stop()) }()

	before := time.Now()
	id, err := e.q.Enqueue(ctx, "steps", nil, backlog.MaxAttempts(4), backlog.Timeout(50*time.Millisecond))
	require.NoError(t, err)
	okID, err := e.q.Enqueue(ctx, "ok", nil)
	require.NoError(t, err)
	info := e.waitState(id, 20*time.Second, backlog.StateFailed)
	require.Len(t, info.Errors, 4)
	for i, want := range []string{"error", "panic", "timeout", "timeout"} {
		a := info.Errors[i]
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, want, a.Outcome, "attempt %d: %s", a.Attempt, a.Error)
		require.Equal(t, "w-figures", a.Worker)
		require.NotNil(t, a.StartedAt)
		require.WithinRange(t, *a.StartedAt, before.Add(-time.Minute), a.At)
		require.InDelta(t, a.At.Sub(*a.StartedAt).Milliseconds(), a.Duration.Milliseconds(), 1)
		if want == "timeout" {
			require.GreaterOrEqual(t, a.Duration, 50*time.Millisecond, "attempt %d", a.Attempt)
		}
	}
	require.Contains(t, info.Errors[3].Error, "backlog: job timeout after 50ms")

	okInfo := e.waitState(okID, 10*time.Second, backlog.StateCompleted)
	require.Empty(t, okInfo.Errors)
	require.Equal(t, "w-figures", okInfo.Worker)
	require.NotNil(t, okInfo.StartedAt)
	require.NotNil(t, okInfo.FinishedAt)
}

// TestAttemptOutcomeOfAWrappedTimeout: a handler that returns its
// context's cause wrapped has its timeout recorded as "timeout". Its
// error text does not start with backlog's ("fetching the page: backlog:
// job timeout"), from which finish() named the outcome before migration
// 25: it was recorded as "error".
func TestAttemptOutcomeOfAWrappedTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	stop := work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		<-ctx.Done()
		return fmt.Errorf("fetching the page: %w", context.Cause(ctx))
	}), backlog.Types("slow"))
	defer func() { require.NoError(t, stop()) }()
	id, err := e.q.Enqueue(ctx, "slow", nil, backlog.MaxAttempts(1), backlog.Timeout(50*time.Millisecond))
	require.NoError(t, err)
	info := e.waitState(id, 20*time.Second, backlog.StateFailed)
	require.Len(t, info.Errors, 1)
	require.Equal(t, "fetching the page: backlog: job timeout", info.Errors[0].Error)
	require.Equal(t, "timeout", info.Errors[0].Outcome)
}

// TestAttemptOutcomeOfAWrappedLeaseLoss: the same for a lease lost
// locally (renewals held off until its local deadline passed, as in
// TestOutcomeWrittenAfterLocalLeaseLoss, the database still holding the
// job under the attempt's token): "lease lost", recorded as "error"
// before migration 25.
func TestAttemptOutcomeOfAWrappedLeaseLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithLease(time.Second), backlog.WithSweepInterval(time.Hour))
	ctx := context.Background()
	causes := make(chan error, 2)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return fmt.Errorf("uploading: %w", context.Cause(ctx))
	}), backlog.Types("held"))
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	id, err := e.q.Enqueue(ctx, "held", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	e.waitState(id, 5*time.Second, backlog.StateRunning)
	_, err = tx.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET lease_expires_at = now() + interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	select {
	case c := <-causes:
		require.ErrorIs(t, c, backlog.ErrLeaseLost)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was not told that its lease was lost")
	}
	require.NoError(t, tx.Commit(ctx))
	info := e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Equal(t, 1, info.Attempt)
	require.Len(t, info.Errors, 1)
	require.Equal(t, "uploading: backlog: lease lost", info.Errors[0].Error)
	require.Equal(t, "lease lost", info.Errors[0].Outcome)
}

// TestAttemptFiguresLeaseExpired: the sweep records an attempt whose
// worker stopped renewing its lease as "lease expired", with the worker
// and start it had.
func TestAttemptFiguresLeaseExpired(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	id, err := e.q.Enqueue(ctx, "crashy", nil)
	require.NoError(t, err)
	// A claim by a process that then vanished: running, its lease
	// already expired.
	_, err = e.pool.Exec(ctx, `UPDATE `+pgx.Identifier{e.schema, "jobs"}.Sanitize()+` SET state = 'running', attempt = 1,
		lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', worker = 'gone',
		started_at = now() - interval '3 seconds' WHERE id = $1`, id)
	require.NoError(t, err)
	n, err := e.q.SweepExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Len(t, info.Errors, 1)
	a := info.Errors[0]
	require.Equal(t, "lease expired", a.Outcome)
	require.Equal(t, "gone", a.Worker)
	require.InDelta(t, 3000, a.Duration.Milliseconds(), 1000)
}

// TestLatencyPercentiles: finish() fills the counters' histograms, and
// Queue.Latency reads percentiles from them within the histogram's
// precision (a slot is 19 % wide): 100 jobs that waited 10..1000 ms and
// ran 20..2000 ms (i*10 and i*20 ms for i = 1..100).
func TestLatencyPercentiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	jobs := pgx.Identifier{e.schema, "jobs"}.Sanitize()
	var ids, tokens []uuid.UUID
	var ms []int
	for i := 1; i <= 100; i++ {
		id, err := e.q.Enqueue(ctx, "lat", nil)
		require.NoError(t, err)
		ids, tokens, ms = append(ids, id), append(tokens, uuid.New()), append(ms, i)
	}
	// Two batches, so that the second merges into the first's counters;
	// each claimed and finished in one transaction, so that now() is the
	// same for both and the times are exact.
	fn := pgx.Identifier{e.schema, "finish"}.Sanitize()
	for _, r := range [][2]int{{0, 37}, {37, 100}} {
		n := r[1] - r[0]
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `UPDATE `+jobs+` j SET state = 'running', attempt = 1, lease_token = t.token,
			lease_expires_at = now() + interval '1 minute', worker = 'w',
			started_at = now() - t.i * 20 * interval '1 millisecond',
			run_at = now() - t.i * 30 * interval '1 millisecond'
			FROM unnest($1::uuid[], $2::uuid[], $3::int[]) AS t(id, token, i) WHERE j.id = t.id`,
			ids[r[0]:r[1]], tokens[r[0]:r[1]], ms[r[0]:r[1]])
		require.NoError(t, err)
		var written int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+fn+`($1::uuid[], $2::uuid[],
			array_fill('completed'::text, ARRAY[$3::int]), array_fill(0::bigint, ARRAY[$3::int]), array_fill(0, ARRAY[$3::int]),
			array_fill(NULL::jsonb, ARRAY[$3::int]), array_fill(NULL::text, ARRAY[$3::int]), '{}'::uuid[], 'x', 86400000, 86400000, 20,
			array_fill(NULL::jsonb, ARRAY[$3::int])) WHERE status = 0`, ids[r[0]:r[1]], tokens[r[0]:r[1]], n).Scan(&written))
		require.Equal(t, n, written)
		require.NoError(t, tx.Commit(ctx))
	}
	ls, err := e.q.Latency(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Len(t, ls, 1)
	l := ls[0]
	require.Equal(t, "lat", l.Type)
	require.EqualValues(t, 100, l.Waited)
	require.EqualValues(t, 100, l.Ran)
	near := func(want, got time.Duration) {
		t.Helper()
		require.InEpsilon(t, float64(want), float64(got), 0.2, "want about %s, got %s", want, got)
	}
	near(500*time.Millisecond, l.Wait.P50)
	near(950*time.Millisecond, l.Wait.P95)
	near(990*time.Millisecond, l.Wait.P99)
	near(1000*time.Millisecond, l.Run.P50)
	near(1900*time.Millisecond, l.Run.P95)

	// The cleaner folds the shards of a closed minute into one row, the
	// histograms added: the same minute counted again by another writer
	// (a shard none of them has: a finish's is its backend's pid % 32, so a
	// fixed one, 7 before, collided in up to one run in 16) doubles every
	// count.
	counts := pgx.Identifier{e.schema, "job_counts"}.Sanitize()
	_, err = e.pool.Exec(ctx, `UPDATE `+counts+` SET bucket = bucket - interval '5 minutes'`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO `+counts+` SELECT bucket, type, state, shard + 32, n, wait_ms, run_ms, wait_hist, run_hist FROM `+counts)
	require.NoError(t, err)
	_, err = e.q.Clean(ctx)
	require.NoError(t, err)
	var rows int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+counts+` WHERE shard <> 0`).Scan(&rows))
	require.Zero(t, rows)
	ls, err = e.q.Latency(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.EqualValues(t, 200, ls[0].Ran)
	near(1000*time.Millisecond, ls[0].Run.P50)
	near(950*time.Millisecond, ls[0].Wait.P95)

	// The roll-up into hours keeps the histograms.
	_, err = e.pool.Exec(ctx, `UPDATE `+counts+` SET bucket = bucket - interval '3 hours'`)
	require.NoError(t, err)
	_, err = e.q.Clean(ctx)
	require.NoError(t, err)
	var minutes int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+counts).Scan(&minutes))
	require.Zero(t, minutes)
	ls, err = e.q.Latency(ctx, time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.EqualValues(t, 200, ls[0].Ran)
	near(1000*time.Millisecond, ls[0].Run.P50)
}

// TestMigration23RollingUpgrade: processes of version 22 keep working
// against schema 23. finish() keeps its signature and result (the call
// above in TestLatencyPercentiles is version 21's); their roll-up of the
// counters, which knows no histograms, still runs and leaves hour rows
// without them, which Latency skips; and their own finish statement
// (the fallback that writes in place) appends error entries without the
// attempt's figures, which JobInfo reads with those fields zero.
func TestMigration23RollingUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	minutes := pgx.Identifier{e.schema, "job_counts"}.Sanitize()
	hours := pgx.Identifier{e.schema, "job_counts_hourly"}.Sanitize()
	_, err := e.pool.Exec(ctx, `INSERT INTO `+minutes+` (bucket, type, state, shard, n, wait_ms, run_ms)
		VALUES (date_trunc('hour', now()) - interval '3 hours', 'old', 'completed', 0, 5, 50, 500)`)
	require.NoError(t, err)
	// Version 22's roll-up statement, as it was.
	_, err = e.pool.Exec(ctx, `WITH m AS (
	DELETE FROM `+minutes+` WHERE bucket < date_trunc('hour', now()) - interval '1 hour'
	RETURNING bucket, type, state, n, wait_ms, run_ms
), h AS (
	INSERT INTO `+hours+` AS h (bucket, type, state, n, wait_ms, run_ms)
	SELECT date_trunc('hour', bucket), type, state, sum(n), sum(wait_ms), sum(run_ms) FROM m GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
	ON CONFLICT (bucket, type, state) DO UPDATE
	SET n = h.n + EXCLUDED.n, wait_ms = h.wait_ms + EXCLUDED.wait_ms, run_ms = h.run_ms + EXCLUDED.run_ms
	RETURNING 1
)
SELECT count(*) FROM m`)
	require.NoError(t, err)
	ls, err := e.q.Latency(ctx, time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []backlog.Latency{{Type: "old"}}, ls)
	st, err := e.q.Throughput(ctx, time.Now().Add(-24*time.Hour), time.Hour)
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.EqualValues(t, 5, st[0].Completed)

	// An entry as version 22's statements write it.
	id, err := e.q.Enqueue(ctx, "old", nil)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+pgx.Identifier{e.schema, "jobs"}.Sanitize()+` j SET last_error = 'e',
		errors = j.errors || jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', 'e')) WHERE id = $1`, id)
	require.NoError(t, err)
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Len(t, info.Errors, 1)
	require.Equal(t, backlog.AttemptError{Attempt: 1, At: info.Errors[0].At, Error: "e"}, info.Errors[0])
}

// TestMigration23DownRestoresVersion22: the functions and columns of a
// schema migrated up and one step down from 0023 are those of a schema
// migrated to 0022 (finish() and retire() of versions 21 and 12, no
// histograms).
func TestMigration23DownRestoresVersion22(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 23)
}

// TestMigration25RollingUpgrade: processes of version 24 keep finishing
// jobs against a schema at 0025. They send no outcomes: they call finish()
// with 13 parameters, now a wrapper that names each outcome from its error
// text as version 23 did and calls the finish() that takes them. One batch
// sent as version 24's store sends it (its statement and arguments, in a
// READ COMMITTED transaction of its own; here the claim is in it too, so
// that now() is one instant and the figures exact): a completion, a retry
// after a timeout, a failure after a panic, a retry of a job whose cancel
// was requested, a plain error and a lease loss. Every row is written,
// with the outcome version 23 named; the ended jobs are counted, with
// their histograms and their wait and run time. retire(), which they call
// unchanged and whose body 0025 changed too, counts a job finished in
// place likewise.
func TestMigration25RollingUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	st, err := e.q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Version, int64(25))
	jobs := pgx.Identifier{e.schema, "jobs"}.Sanitize()
	type sent struct {
		state, err          string // err "": none
		cancel              bool
		wantState, wantOutc string
	}
	batch := []sent{
		{state: "completed", wantState: "completed"},
		{state: "available", err: "backlog: job timeout after 50ms: context deadline exceeded", wantState: "available", wantOutc: "timeout"},
		{state: "failed", err: "panic: out of toner\n\ngoroutine 7", wantState: "failed", wantOutc: "panic"},
		{state: "available", err: "boom", cancel: true, wantState: "cancelled", wantOutc: "cancelled"},
		{state: "available", err: "printer on fire", wantState: "available", wantOutc: "error"},
		{state: "failed", err: "backlog: lease lost: context canceled", wantState: "failed", wantOutc: "lease lost"},
	}
	n := len(batch)
	ids, tokens, ms := make([]uuid.UUID, n), make([]uuid.UUID, n), make([]int, n)
	states, errs := make([]string, n), make([]*string, n)
	for i, b := range batch {
		ids[i], err = e.q.Enqueue(ctx, "v24", nil)
		require.NoError(t, err)
		tokens[i], ms[i], states[i] = uuid.New(), i+1, b.state
		if b.err != "" {
			errs[i] = &b.err
		}
	}
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `UPDATE `+jobs+` j SET state = 'running', attempt = 1, lease_token = t.token,
		lease_expires_at = now() + interval '1 minute', worker = 'v24', cancel_requested = t.cancel,
		started_at = now() - t.i * 20 * interval '1 millisecond',
		run_at = now() - t.i * 30 * interval '1 millisecond'
		FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::boolean[]) AS t(id, token, i, cancel) WHERE j.id = t.id`,
		ids, tokens, ms, []bool{false, false, false, true, false, false})
	require.NoError(t, err)
	// Version 24's finish statement (internal/store's fin.fast) and its
	// arguments: no delays, no results, no progress, no outcomes.
	rows, err := tx.Query(ctx, `SELECT id, state, status, txid_current(), (SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) FROM `+
		pgx.Identifier{e.schema, "finish"}.Sanitize()+
		`($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::integer[], $6::jsonb[], $7::text[], $8::uuid[], $9, $10, $11, $12, $13::jsonb[])`,
		pgx.QueryExecModeCacheDescribe, ids, tokens, states, make([]int64, n), make([]int32, n), make([]json.RawMessage, n), errs,
		[][16]byte{}, e.schema+".backlog", int64(86400000), int64(604800000), 20, []json.RawMessage(nil))
	require.NoError(t, err)
	written := map[uuid.UUID]string{}
	var id uuid.UUID
	var state *string
	var status int16
	var xid int64
	var tl string
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &status, &xid, &tl}, func() error {
		require.Zero(t, status, "job %s", id)
		written[id] = *state
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, written, n)

	for i, b := range batch {
		info, err := e.q.Job(ctx, ids[i])
		require.NoError(t, err)
		require.Equal(t, backlog.State(b.wantState), info.State, "job %d", i)
		if b.err == "" {
			require.Empty(t, info.Errors)
			continue
		}
		require.Len(t, info.Errors, 1, "job %d", i)
		a := info.Errors[0]
		require.Equal(t, b.wantOutc, a.Outcome, "job %d: %s", i, a.Error)
		require.Equal(t, "v24", a.Worker)
		require.Equal(t, time.Duration(ms[i]*20)*time.Millisecond, a.Duration, "job %d", i)
	}

	// Counted: jobs 0 (completed), 2 and 5 (failed), 3 (cancelled), waits
	// of i*10 ms and runs of i*20 ms (i = index + 1).
	counts := pgx.Identifier{e.schema, "job_counts"}.Sanitize()
	type count struct {
		n, waitMS, runMS, waitHist, runHist int64
	}
	got := map[string]count{}
	rows, err = e.pool.Query(ctx, `SELECT state, sum(n)::bigint, sum(wait_ms)::bigint, sum(run_ms)::bigint,
		sum((SELECT sum(x) FROM unnest(wait_hist) x))::bigint, sum((SELECT sum(x) FROM unnest(run_hist) x))::bigint
		FROM `+counts+` WHERE type = 'v24' GROUP BY state`)
	require.NoError(t, err)
	var s string
	var c count
	_, err = pgx.ForEachRow(rows, []any{&s, &c.n, &c.waitMS, &c.runMS, &c.waitHist, &c.runHist}, func() error {
		got[s] = c
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, map[string]count{
		"completed": {1, 10, 20, 1, 1},
		"failed":    {2, 30 + 60, 60 + 120, 2, 2},
		"cancelled": {1, 40, 80, 1, 1},
	}, got)

	// retire() as version 24 calls it, on a job finished in place.
	inPlace, err := e.q.Enqueue(ctx, "v24retired", nil)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE `+jobs+` SET state = 'completed', attempt = 1, worker = 'v24', finished_at = now(),
		started_at = now() - interval '70 milliseconds', run_at = now() - interval '100 milliseconds' WHERE id = $1`, inPlace)
	require.NoError(t, err)
	var retired int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT `+pgx.Identifier{e.schema, "retire"}.Sanitize()+`($1, $2, $3)`,
		1000, int64(86400000), int64(604800000)).Scan(&retired))
	require.Equal(t, 1, retired)
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT sum(n)::bigint, sum(wait_ms)::bigint, sum(run_ms)::bigint,
		sum((SELECT sum(x) FROM unnest(wait_hist) x))::bigint, sum((SELECT sum(x) FROM unnest(run_hist) x))::bigint
		FROM `+counts+` WHERE type = 'v24retired'`).Scan(&c.n, &c.waitMS, &c.runMS, &c.waitHist, &c.runHist))
	require.Equal(t, count{1, 30, 70, 1, 1}, c)
}

// TestMigration25DownRestoresVersion24: the functions and columns of a
// schema migrated up and one step down from 0025 are those of a schema
// migrated to 0024 (finish() and retire() of version 23, latency_hist()
// with its version 23 body; no finish() with outcomes, no
// attempt_outcome()).
func TestMigration25DownRestoresVersion24(t *testing.T) {
	t.Parallel()
	migrationDownRestores(t, 25)
}
