package backlogtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogtest"
	"github.com/backlogq/backlog/internal/pgcluster"
	"github.com/backlogq/backlog/internal/testdb"
)

func TestWorkOutcomes(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	type result struct {
		Sent int `json:"sent"`
	}
	for _, c := range []struct {
		name    string
		opts    []backlog.EnqueueOption
		h       backlog.HandlerFunc
		outcome backlog.Outcome
		state   backlog.State
		attempt int
		errHas  string // in Result.Err and the job's last error
	}{
		{name: "completed", h: func(ctx context.Context, job *backlog.Job) error { return job.SetResult(result{Sent: 3}) },
			outcome: backlog.OutcomeCompleted, state: backlog.StateCompleted, attempt: 1},
		{name: "retried", h: func(context.Context, *backlog.Job) error { return errors.New("smtp down") },
			outcome: backlog.OutcomeRetried, state: backlog.StateScheduled, attempt: 1, errHas: "smtp down"},
		{name: "last attempt", opts: []backlog.EnqueueOption{backlog.MaxAttempts(1)},
			h:       func(context.Context, *backlog.Job) error { return errors.New("smtp down") },
			outcome: backlog.OutcomeFailed, state: backlog.StateFailed, attempt: 1, errHas: "smtp down"},
		{name: "permanent", h: func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("bad address")) },
			outcome: backlog.OutcomeFailed, state: backlog.StateFailed, attempt: 1, errHas: "permanent: bad address"},
		{name: "snoozed", h: func(context.Context, *backlog.Job) error { return backlog.Snooze(time.Hour) },
			outcome: backlog.OutcomeSnoozed, state: backlog.StateScheduled, attempt: 0},
		{name: "panic", h: func(context.Context, *backlog.Job) error { panic("boom") },
			outcome: backlog.OutcomeRetried, state: backlog.StateScheduled, attempt: 1, errHas: "panic: boom"},
		{name: "panic on the last attempt", opts: []backlog.EnqueueOption{backlog.MaxAttempts(1)},
			h:       func(context.Context, *backlog.Job) error { panic("boom") },
			outcome: backlog.OutcomeFailed, state: backlog.StateFailed, attempt: 1, errHas: "panic: boom"},
		{name: "timeout", opts: []backlog.EnqueueOption{backlog.Timeout(20 * time.Millisecond)},
			h: func(ctx context.Context, job *backlog.Job) error {
				<-ctx.Done()
				if !errors.Is(context.Cause(ctx), backlog.ErrJobTimeout) {
					return backlog.Permanent(fmt.Errorf("cause %v, want ErrJobTimeout", context.Cause(ctx)))
				}
				return ctx.Err()
			},
			outcome: backlog.OutcomeRetried, state: backlog.StateScheduled, attempt: 1, errHas: "context deadline exceeded"},
		{name: "result too large", h: func(ctx context.Context, job *backlog.Job) error {
			_ = job.SetResult(strings.Repeat("x", backlog.MaxResultBytes+1))
			return nil
		}, outcome: backlog.OutcomeFailed, state: backlog.StateFailed, attempt: 1},
	} {
		tt.Run(c.name, func(tt *testing.T) {
			typ := "t." + strings.ReplaceAll(c.name, " ", "_")
			id, err := q.Enqueue(ctx, typ, emailArgs{To: "ada@example.com"}, c.opts...)
			require.NoError(tt, err)
			r := backlogtest.Work(ctx, tt, q, c.h, id)
			require.Equal(tt, c.outcome, r.Outcome)
			require.Equal(tt, id, r.Job.ID)
			require.Equal(tt, 1, r.Job.Attempt, "the handler sees its attempt")
			require.Equal(tt, c.state, r.Info.State)
			require.Equal(tt, c.attempt, r.Info.Attempt)
			if c.errHas != "" {
				require.ErrorContains(tt, r.Err, c.errHas)
				require.Contains(tt, r.Info.LastError, c.errHas)
			}
			switch c.outcome {
			case backlog.OutcomeCompleted:
				require.NoError(tt, r.Err)
				var res result
				require.NoError(tt, r.Info.DecodeResult(&res))
				require.Equal(tt, 3, res.Sent)
			case backlog.OutcomeSnoozed, backlog.OutcomeRetried:
				require.True(tt, r.Info.RunAt.After(time.Now()), "runs again later: %s", r.Info.RunAt)
			}
			if c.name == "panic" {
				require.ErrorContains(tt, r.Err, "goroutine") // the stack
			}
		})
	}
}

func TestWorkRunsTheGivenJobThroughTheClaim(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	var ids []uuid.UUID
	for i := range 3 {
		id, err := q.Enqueue(ctx, "email.send", emailArgs{To: fmt.Sprint(i)}, backlog.Tags{"region": "eu"}, backlog.Priority(i))
		require.NoError(tt, err)
		ids = append(ids, id)
	}
	var got *backlog.Job
	r := backlogtest.Work(ctx, tt, q, backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a emailArgs) error {
		got = job
		if a.To != "2" {
			return backlog.Permanent(fmt.Errorf("args %+v", a))
		}
		return nil
	}), ids[2])
	require.Equal(tt, backlog.OutcomeCompleted, r.Outcome, "%v", r.Err)
	require.Same(tt, got, r.Job)
	require.Equal(tt, map[string]string{"region": "eu"}, got.Tags)
	require.Equal(tt, 2, got.Priority)
	require.Equal(tt, backlog.DefaultMaxAttempts, got.MaxAttempts)
	require.Equal(tt, q.WorkerID(), r.Info.Worker)
	require.NotNil(tt, r.Info.StartedAt)
	require.NotNil(tt, r.Info.FinishedAt)
	for _, id := range ids[:2] { // the earlier jobs, which a claim takes first, were left alone
		info, err := q.Job(ctx, id)
		require.NoError(tt, err)
		require.Equal(tt, backlog.StateAvailable, info.State)
		require.Zero(tt, info.Attempt)
		require.Nil(tt, info.StartedAt)
	}
}

func TestWorkFenceRefusesAStolenLease(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	pool := testdb.Pool(tt)
	id, err := q.Enqueue(ctx, "a", nil)
	require.NoError(tt, err)
	r := backlogtest.Work(ctx, tt, q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		// As if the sweep had handed the job to another worker.
		_, err := pool.Exec(ctx, `UPDATE "`+q.Schema()+`".jobs SET lease_token = gen_random_uuid() WHERE id = $1`, job.ID)
		return err
	}), id)
	require.Equal(tt, backlog.OutcomeLeaseLost, r.Outcome)
	require.Equal(tt, backlog.StateRunning, r.Info.State, "the finish was refused")
}

func TestWorkContextEndAndCancel(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	tt.Run("ctx ends: released", func(tt *testing.T) {
		id, err := q.Enqueue(ctx, "a", nil)
		require.NoError(tt, err)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var cause error
		r := backlogtest.Work(wctx, tt, q, backlog.HandlerFunc(func(hctx context.Context, job *backlog.Job) error {
			cancel()
			<-hctx.Done()
			cause = context.Cause(hctx)
			return hctx.Err()
		}), id)
		require.ErrorIs(tt, cause, backlog.ErrShutdown)
		require.Equal(tt, backlog.OutcomeReleased, r.Outcome)
		require.Equal(tt, backlog.StateAvailable, r.Info.State)
		require.Zero(tt, r.Info.Attempt, "a release does not spend the attempt")
	})
	tt.Run("Queue.Cancel: cancelled", func(tt *testing.T) {
		id, err := q.Enqueue(ctx, "b", nil)
		require.NoError(tt, err)
		r := backlogtest.Work(ctx, tt, q, backlog.HandlerFunc(func(hctx context.Context, job *backlog.Job) error {
			st, err := q.Cancel(ctx, job.ID)
			if err != nil || st != backlog.StateRunning {
				return backlog.Permanent(fmt.Errorf("cancel: %v %v", st, err))
			}
			select {
			case <-hctx.Done():
				return context.Cause(hctx)
			case <-time.After(30 * time.Second):
				return backlog.Permanent(errors.New("the handler's context was not cancelled"))
			}
		}), id)
		require.Equal(tt, backlog.OutcomeCancelled, r.Outcome, "%v", r.Err)
		require.ErrorIs(tt, r.Err, backlog.ErrCancelled)
		require.Equal(tt, backlog.StateCancelled, r.Info.State)
	})
}

func TestWorkCallsHooksAndUsesBackoff(tt *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var events []backlog.Outcome
	q := newQ(tt, backlog.WithHooks(backlog.Hooks{Finished: func(_ context.Context, _ *backlog.Job, ev backlog.JobEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev.Outcome)
	}}))
	id, err := q.Enqueue(ctx, "a", nil)
	require.NoError(tt, err)
	before := time.Now()
	r := backlogtest.Work(ctx, tt, q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return errors.New("x") }), id,
		backlog.RetryBackoff(backlog.Backoff{Initial: 10 * time.Hour, Randomization: 1e-9, Max: 20 * time.Hour}))
	require.Equal(tt, backlog.OutcomeRetried, r.Outcome)
	require.WithinDuration(tt, before.Add(10*time.Hour), r.Info.RunAt, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(tt, []backlog.Outcome{backlog.OutcomeRetried}, events)
}

func TestWorkFailsWhenTheJobCannotBeClaimed(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	ok := backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil })
	enqueue := func(typ string, opts ...backlog.EnqueueOption) uuid.UUID {
		id, err := q.Enqueue(ctx, typ, nil, opts...)
		require.NoError(tt, err)
		return id
	}
	work := func(id uuid.UUID, h backlog.Handler) string {
		return fails(tt, func(tb backlogtest.TB) { backlogtest.Work(ctx, tb, q, h, id) })
	}

	require.Contains(tt, work(uuid.New(), ok), "job not found")
	require.Contains(tt, work(enqueue("later", backlog.Delay(time.Hour)), ok), "(later) is scheduled (due at ")
	first := enqueue("first")
	require.Contains(tt, work(enqueue("after", backlog.DependsOn(first)), ok), "(after) is blocked (waiting for its prerequisites")
	backlogtest.Work(ctx, tt, q, ok, first)
	require.Contains(tt, work(first, ok), "(first) is completed, not available")

	mux := backlog.NewMux()
	mux.HandleFunc("other", func(context.Context, *backlog.Job) error { return nil })
	require.Contains(tt, work(enqueue("unrouted"), mux), `is of type "unrouted", which the Mux does not handle (it handles ["other"])`)
	require.Contains(tt, work(enqueue("x"), nil), "handler")

	require.NoError(tt, q.Pause(ctx, "paused"))
	require.Contains(tt, work(enqueue("paused"), ok), "its type is paused, or another transaction holds its row")

	require.NoError(tt, q.SetLimit(ctx, "rated", backlog.Limit{Rate: 1, Per: time.Hour, Burst: 1}))
	backlogtest.Work(ctx, tt, q, ok, enqueue("rated"))
	require.Contains(tt, work(enqueue("rated"), ok), "a limit of its type (SetLimit) holds it back")

	locked := enqueue("locked")
	tx, err := testdb.Pool(tt).Begin(ctx)
	require.NoError(tt, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM "`+q.Schema()+`".jobs WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(tt, err)
	require.Contains(tt, work(locked, ok), "another transaction holds its row")
	require.NoError(tt, tx.Rollback(ctx))
	backlogtest.Work(ctx, tt, q, ok, locked) // claimable once the lock is gone

	q2, err := backlog.New(ctx, testdb.Pool(tt), backlog.WithSchema(q.Schema()), quiet())
	require.NoError(tt, err)
	require.NoError(tt, q2.Close())
	require.Contains(tt, fails(tt, func(tb backlogtest.TB) { backlogtest.Work(ctx, tb, q2, ok, enqueue("y")) }), "closed")
}

func TestDrainUntilIdle(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	mux := backlog.NewMux()
	mux.HandleFunc("signup", func(ctx context.Context, job *backlog.Job) error {
		note("signup")
		_, err := q.Enqueue(ctx, "welcome", job.Args) // a job enqueued by a handler
		return err
	})
	mux.HandleFunc("welcome", func(ctx context.Context, job *backlog.Job) error { note("welcome"); return nil })
	mux.HandleFunc("step", func(ctx context.Context, job *backlog.Job) error {
		note("step " + string(job.Args))
		return nil
	})
	// A retry an hour away: the drain, however slow, must not see it due.
	mux.HandleFunc("flaky", func(ctx context.Context, job *backlog.Job) error { note("flaky"); return errors.New("flaky") },
		backlog.RetryBackoff(backlog.Backoff{Initial: time.Hour}))

	_, err := q.Enqueue(ctx, "signup", map[string]string{"user": "ada"})
	require.NoError(tt, err)
	a, b, c := backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err = q.EnqueueMany(ctx, []backlog.JobSpec{ // a DAG: c after b after a, enqueued in reverse order
		{ID: c, Type: "step", Args: "c", Options: []backlog.EnqueueOption{backlog.DependsOn(a, b)}},
		{ID: b, Type: "step", Args: "b", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}},
		{ID: a, Type: "step", Args: "a", Options: []backlog.EnqueueOption{backlog.Priority(50)}},
	})
	require.NoError(tt, err)
	later, err := q.Enqueue(ctx, "welcome", nil, backlog.Delay(time.Hour))
	require.NoError(tt, err)
	flaky, err := q.Enqueue(ctx, "flaky", nil, backlog.MaxAttempts(3))
	require.NoError(tt, err)

	s := backlogtest.DrainUntilIdle(ctx, tt, q, mux, nil)
	require.Equal(tt, 1, s.Count(backlog.OutcomeRetried))
	require.Equal(tt, 5, s.Count(backlog.OutcomeCompleted))
	require.Len(tt, s.Runs, 6)
	require.Equal(tt, []string{"signup", "flaky", "welcome", "step \"a\"", "step \"b\"", "step \"c\""}, order)
	info, err := q.Job(ctx, later)
	require.NoError(tt, err)
	require.Equal(tt, backlog.StateScheduled, info.State, "a job due later is left alone")
	info, err = q.Job(ctx, flaky)
	require.NoError(tt, err)
	require.Equal(tt, backlog.StateScheduled, info.State, "a retry waits for its backoff")
	backlogtest.RequireEnqueued(ctx, tt, q, "welcome", &backlogtest.Want{Args: map[string]string{"user": "ada"}, State: backlog.StateCompleted})

	// Idle already: nothing runs.
	s = backlogtest.DrainUntilIdle(ctx, tt, q, mux, nil)
	require.Empty(tt, s.Runs)

	// RunScheduled: the delayed job and the retries run too.
	order = nil
	s = backlogtest.DrainUntilIdle(ctx, tt, q, mux, &backlogtest.DrainOptions{RunScheduled: true})
	require.Equal(tt, []string{"welcome", "flaky", "flaky"}, order)
	require.Equal(tt, map[backlog.Outcome]int{backlog.OutcomeCompleted: 1, backlog.OutcomeRetried: 1, backlog.OutcomeFailed: 1}, s.Outcomes)
	require.Equal(tt, backlog.StateFailed, s.Runs[2].Info.State)
	require.Equal(tt, 3, s.Runs[2].Info.Attempt)
}

func TestDrainUntilIdleOrderingKeyAndTags(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	var got []string
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		got = append(got, string(job.Args))
		return nil
	})
	for _, s := range []string{"1", "2", "3"} {
		_, err := q.Enqueue(ctx, "k", s, backlog.OrderingKey("acct"))
		require.NoError(tt, err)
	}
	_, err := q.Enqueue(ctx, "k", "eu", backlog.Tags{"region": "eu"})
	require.NoError(tt, err)
	backlogtest.DrainUntilIdle(ctx, tt, q, h, &backlogtest.DrainOptions{Work: []backlog.WorkOption{backlog.Types("k")}})
	require.Equal(tt, []string{`"1"`, `"2"`, `"3"`}, got, "a tagged job waits for a worker with its tags")
	s := backlogtest.DrainUntilIdle(ctx, tt, q, h, &backlogtest.DrainOptions{
		Work: []backlog.WorkOption{backlog.Types("k"), backlog.WorkerTags{"region": "eu"}}})
	require.Len(tt, s.Runs, 1)
	require.Equal(tt, `"eu"`, got[3])
}

func TestDrainUntilIdleFailures(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	// A job that keeps enqueueing another: MaxRuns stops it.
	loop := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		_, err := q.Enqueue(ctx, "loop", nil)
		return err
	})
	_, err := q.Enqueue(ctx, "loop", nil)
	require.NoError(tt, err)
	msg := fails(tt, func(tb backlogtest.TB) {
		backlogtest.DrainUntilIdle(ctx, tb, q, loop, &backlogtest.DrainOptions{Work: []backlog.WorkOption{backlog.Types("loop")}, MaxRuns: 5})
	})
	require.Contains(tt, msg, "DrainUntilIdle: 5 runs (MaxRuns) without reaching idle; the last: job ")
	require.Contains(tt, msg, "(loop) completed")

	// No types.
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.DrainUntilIdle(ctx, tb, q, loop, nil) })
	require.Contains(tt, msg, "draining needs at least one job type")
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.DrainUntilIdle(ctx, tb, q, loop, &backlogtest.DrainOptions{MaxRuns: -1})
	})
	require.Contains(tt, msg, "MaxRuns must not be negative")

	// A due job locked by another transaction: the drain waits for it
	// (until ctx ends) rather than calling the queue idle.
	id, err := q.Enqueue(ctx, "held", nil)
	require.NoError(tt, err)
	tx, err := testdb.Pool(tt).Begin(ctx)
	require.NoError(tt, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM "`+q.Schema()+`".jobs WHERE id = $1 FOR UPDATE`, id)
	require.NoError(tt, err)
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	ok := backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil })
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.DrainUntilIdle(dctx, tb, q, ok, &backlogtest.DrainOptions{Work: []backlog.WorkOption{backlog.Types("held")}})
	})
	require.Contains(tt, msg, "0 run(s)") // stopped by ctx while waiting (or, on a slow machine, in its claim)
	require.Contains(tt, msg, "context deadline exceeded")
	require.NoError(tt, tx.Rollback(ctx))
	s := backlogtest.DrainUntilIdle(ctx, tt, q, ok, &backlogtest.DrainOptions{Work: []backlog.WorkOption{backlog.Types("held")}})
	require.Equal(tt, 1, s.Count(backlog.OutcomeCompleted))
}

// TestWorkDAGMetadataProgress: Work claims through the Queue's claimer, so
// a dependent run inline gets its prerequisites' results (migration 0012)
// and its metadata (0011), and its progress is written with the outcome.
func TestWorkDAGMetadataProgress(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	type page struct {
		Words int `json:"words"`
	}
	fetch, err := q.Enqueue(ctx, "fetch", nil)
	require.NoError(tt, err)
	count, err := q.Enqueue(ctx, "count", nil, backlog.DependsOn(fetch), backlog.Metadata(map[string]string{"trace": "t1"}))
	require.NoError(tt, err)

	r := backlogtest.Work(ctx, tt, q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if err := job.SetProgress(ctx, "half"); err != nil {
			return err
		}
		return job.SetResult(page{Words: 3})
	}), fetch)
	require.Equal(tt, backlog.OutcomeCompleted, r.Outcome, "%v", r.Err)
	require.JSONEq(tt, `"half"`, string(r.Info.Progress))

	var got page
	r = backlogtest.Work(ctx, tt, q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if job.Metadata["trace"] != "t1" {
			return backlog.Permanent(fmt.Errorf("metadata %v", job.Metadata))
		}
		if ids := job.PrerequisiteIDs(); len(ids) != 1 || ids[0] != fetch {
			return backlog.Permanent(fmt.Errorf("prerequisites %v", ids))
		}
		got, err = backlog.PrerequisiteResultOfType[page](ctx, job, "fetch")
		if err != nil {
			return err
		}
		return job.SetProgress(ctx, map[string]int{"done": 3})
	}), count)
	require.Equal(tt, backlog.OutcomeCompleted, r.Outcome, "%v", r.Err)
	require.Equal(tt, page{Words: 3}, got)
	require.Equal(tt, map[string]string{"trace": "t1"}, r.Info.Metadata)
	require.JSONEq(tt, `{"done": 3}`, string(r.Info.Progress))
}

// TestWorkReadsTheOutcomeFromThePrimary: with a read pool on a standby
// whose replay is paused (a private primary and a real streaming hot
// standby made of it), Work's Result.Info is the job's record as the
// primary has it once the outcome is written, not the standby's (where
// the job, enqueued after the pause, does not exist).
func TestWorkReadsTheOutcomeFromThePrimary(tt *testing.T) {
	tt.Parallel()
	primary := pgcluster.Start(tt, os.Getenv("BACKLOG_CI") == "1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, primary.URL())
	require.NoError(tt, err)
	tt.Cleanup(pool.Close)
	setup, err := backlog.New(ctx, pool, quiet())
	require.NoError(tt, err)
	require.NoError(tt, setup.Migrate(ctx))
	require.NoError(tt, setup.Close())
	standby, err := primary.Standby()
	require.NoError(tt, err)
	require.NoError(tt, standby.PauseReplay(ctx))
	readPool, err := pgxpool.New(ctx, standby.URL())
	require.NoError(tt, err)
	tt.Cleanup(readPool.Close)
	q, err := backlog.New(ctx, pool, quiet(), backlog.WithReadPool(readPool))
	require.NoError(tt, err)
	tt.Cleanup(func() { require.NoError(tt, q.Close()) })

	id, err := q.Enqueue(ctx, "t.replica", emailArgs{To: "ada@example.com"})
	require.NoError(tt, err)
	_, err = q.Job(ctx, id)
	require.ErrorIs(tt, err, backlog.ErrNotFound, "the standby has the job: replay is not paused")
	r := backlogtest.Work(ctx, tt, q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		return job.SetResult(map[string]int{"sent": 1})
	}), id)
	require.Equal(tt, backlog.OutcomeCompleted, r.Outcome)
	require.Equal(tt, backlog.StateCompleted, r.Info.State)
	var res map[string]int
	require.NoError(tt, r.Info.DecodeResult(&res))
	require.Equal(tt, map[string]int{"sent": 1}, res)
}
