package backlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// listAll walks a listing to its end and returns every job, in order.
func listAll(t *testing.T, q *backlog.Queue, f backlog.Filter, opts backlog.ListOptions) []*backlog.JobInfo {
	t.Helper()
	var all []*backlog.JobInfo
	for range 10_000 {
		page, err := q.List(context.Background(), f, opts)
		require.NoError(t, err)
		all = append(all, page.Jobs...)
		if page.Next == "" {
			return all
		}
		opts.Cursor = page.Next
	}
	t.Fatal("the listing did not end")
	return nil
}

func TestListFiltersLiveAndFinishedJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("ok", func(context.Context, *backlog.Job) error { return nil })
	mux.HandleFunc("bad", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("disk 100% full_now")) })
	work(t, e.q, mux, backlog.WorkerTags{"n": "0"})
	work(t, e.q, mux, backlog.WorkerTags{"n": "1"})
	var done []uuid.UUID
	for i := range 30 {
		typ := "ok"
		if i%3 == 0 {
			typ = "bad"
		}
		id, err := e.q.Enqueue(ctx, typ, map[string]int{"i": i}, backlog.Tags{"n": fmt.Sprint(i % 2)})
		require.NoError(t, err)
		done = append(done, id)
	}
	later, err := e.q.Enqueue(ctx, "ok", nil, backlog.Delay(time.Hour), backlog.UniqueKey("later"), backlog.ConcurrencyKey("tenant:7"))
	require.NoError(t, err)
	keyed, err := e.q.Enqueue(ctx, "bad", nil, backlog.OrderingKey("chain"), backlog.ConcurrencyKey("tenant:7"))
	require.NoError(t, err)
	done = append(done, keyed)
	for _, id := range done {
		e.waitJob(id, 10*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	}
	ids := func(js []*backlog.JobInfo) []uuid.UUID {
		out := make([]uuid.UUID, len(js))
		for i, j := range js {
			out[i] = j.ID
		}
		return out
	}
	all := listAll(t, e.q, backlog.Filter{}, backlog.ListOptions{Limit: 7})
	require.Len(t, all, 32)
	require.Equal(t, later, all[0].ID, "newest first: live jobs, then finished ones")
	oldest := listAll(t, e.q, backlog.Filter{}, backlog.ListOptions{Limit: 7, Oldest: true})
	require.ElementsMatch(t, ids(all), ids(oldest))
	require.Equal(t, later, oldest[len(oldest)-1].ID, "oldest first: finished jobs, then live ones")

	failed := listAll(t, e.q, backlog.Filter{States: []backlog.State{backlog.StateFailed}}, backlog.ListOptions{})
	require.Len(t, failed, 11)
	for _, j := range failed {
		require.Equal(t, "bad", j.Type)
	}
	// Text with LIKE's wildcards is matched as text.
	require.Len(t, listAll(t, e.q, backlog.Filter{ErrorContains: "100% full_"}, backlog.ListOptions{}), 11)
	require.Empty(t, listAll(t, e.q, backlog.Filter{ErrorContains: "100%_full"}, backlog.ListOptions{}))
	require.Len(t, listAll(t, e.q, backlog.Filter{Types: []string{"ok"}, Tags: backlog.Tags{"n": "1"}}, backlog.ListOptions{}), 10)
	require.Equal(t, []uuid.UUID{later}, ids(listAll(t, e.q, backlog.Filter{UniqueKey: "later"}, backlog.ListOptions{})))
	require.Equal(t, []uuid.UUID{done[4]}, ids(listAll(t, e.q, backlog.Filter{IDs: []uuid.UUID{done[4], uuid.New()}}, backlog.ListOptions{})))
	// Input that looks like SQL is data.
	require.Empty(t, listAll(t, e.q, backlog.Filter{Types: []string{"'; DROP TABLE jobs; --"}, Tags: backlog.Tags{`k"'`: `v'"`}}, backlog.ListOptions{}))
	require.Len(t, listAll(t, e.q, backlog.Filter{}, backlog.ListOptions{}), 32)
	// Keys: shown, and the concurrency key filters live and finished jobs.
	tenant := listAll(t, e.q, backlog.Filter{ConcurrencyKey: "tenant:7"}, backlog.ListOptions{})
	require.ElementsMatch(t, []uuid.UUID{later, keyed}, ids(tenant))
	for _, j := range tenant {
		require.Equal(t, "tenant:7", j.ConcurrencyKey)
		if j.ID == later {
			require.Equal(t, "later", j.UniqueKey)
		} else {
			require.Equal(t, "chain", j.OrderingKey)
		}
	}
	info, err := e.q.Job(ctx, keyed)
	require.NoError(t, err)
	require.Equal(t, "chain", info.OrderingKey)
	require.Equal(t, "tenant:7", info.ConcurrencyKey)
	require.Equal(t, "", info.UniqueKey)

	var ie *backlog.InputError
	_, err = e.q.List(ctx, backlog.Filter{States: []backlog.State{"lost"}}, backlog.ListOptions{})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "states", ie.Field)
	_, err = e.q.List(ctx, backlog.Filter{}, backlog.ListOptions{Limit: backlog.MaxListLimit + 1})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "limit", ie.Field)
	_, err = e.q.List(ctx, backlog.Filter{}, backlog.ListOptions{Cursor: "not-a-cursor"})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "cursor", ie.Field)
	page, err := e.q.List(ctx, backlog.Filter{}, backlog.ListOptions{Limit: 2})
	require.NoError(t, err)
	_, err = e.q.List(ctx, backlog.Filter{}, backlog.ListOptions{Cursor: page.Next, Oldest: true})
	require.ErrorAs(t, err, &ie, "a cursor of the other order")
}

func TestRetryAndDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	release := make(chan struct{})
	mux := backlog.NewMux()
	mux.HandleFunc("flaky", func(context.Context, *backlog.Job) error {
		if fail.Load() {
			return errors.New("not yet")
		}
		return nil
	})
	mux.HandleFunc("hold", func(ctx context.Context, _ *backlog.Job) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	work(t, e.q, mux)

	// A job that failed with its attempts used up runs again, granted one
	// more attempt; its error history is kept.
	id, err := e.q.Enqueue(ctx, "flaky", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	e.waitState(id, 10*time.Second, backlog.StateFailed)
	fail.Store(false)
	st, err := e.q.Retry(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateAvailable, st)
	info := e.waitState(id, 10*time.Second, backlog.StateCompleted)
	require.Equal(t, 2, info.Attempt)
	require.Equal(t, 2, info.MaxAttempts)
	require.Len(t, info.Errors, 1)
	require.NoError(t, info.Err())

	// Refusals.
	running, err := e.q.Enqueue(ctx, "hold", nil, backlog.UniqueKey("u"), backlog.OrderingKey("k"))
	require.NoError(t, err)
	e.waitState(running, 10*time.Second, backlog.StateRunning)
	_, err = e.q.Retry(ctx, running)
	require.ErrorIs(t, err, backlog.ErrRunning)
	require.ErrorIs(t, e.q.Delete(ctx, running), backlog.ErrRunning)
	blocked, err := e.q.Enqueue(ctx, "flaky", nil, backlog.DependsOn(running))
	require.NoError(t, err)
	_, err = e.q.Retry(ctx, blocked)
	require.ErrorIs(t, err, backlog.ErrBlocked)
	_, err = e.q.Retry(ctx, uuid.New())
	require.ErrorIs(t, err, backlog.ErrNotFound)
	require.ErrorIs(t, e.q.Delete(ctx, uuid.New()), backlog.ErrNotFound)

	// A finished job whose unique key a live job holds cannot run again;
	// one with an ordering key waits behind its key's live jobs.
	fail.Store(true)
	dup, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "flaky", Options: []backlog.EnqueueOption{backlog.MaxAttempts(1), backlog.UniqueKey("v")}}})
	require.NoError(t, err)
	e.waitState(dup[0], 10*time.Second, backlog.StateFailed)
	_, err = e.q.Enqueue(ctx, "hold", nil, backlog.UniqueKey("v"), backlog.Delay(time.Hour))
	require.NoError(t, err)
	_, err = e.q.Retry(ctx, dup[0])
	require.ErrorIs(t, err, backlog.ErrUniqueKeyHeld)
	keyed, err := e.q.Enqueue(ctx, "flaky", nil, backlog.MaxAttempts(1), backlog.OrderingKey("k2"))
	require.NoError(t, err)
	e.waitState(keyed, 10*time.Second, backlog.StateFailed)
	head, err := e.q.Enqueue(ctx, "hold", nil, backlog.OrderingKey("k2"))
	require.NoError(t, err)
	e.waitState(head, 10*time.Second, backlog.StateRunning)
	fail.Store(false)
	st, err = e.q.Retry(ctx, keyed)
	require.NoError(t, err)
	require.Equal(t, backlog.StateBlocked, st, "behind the live job of its key")

	// Deleting a queued prerequisite cancels its dependent, like Cancel.
	pre, err := e.q.Enqueue(ctx, "flaky", nil, backlog.Delay(time.Hour))
	require.NoError(t, err)
	dep, err := e.q.Enqueue(ctx, "flaky", nil, backlog.DependsOn(pre))
	require.NoError(t, err)
	require.NoError(t, e.q.Delete(ctx, pre))
	_, err = e.q.Job(ctx, pre)
	require.ErrorIs(t, err, backlog.ErrNotFound)
	e.waitState(dep, 10*time.Second, backlog.StateCancelled)
	// Deleting a finished job.
	require.NoError(t, e.q.Delete(ctx, id))
	_, err = e.q.Job(ctx, id)
	require.ErrorIs(t, err, backlog.ErrNotFound)

	close(release)
	e.waitState(keyed, 10*time.Second, backlog.StateCompleted)
	e.waitState(blocked, 10*time.Second, backlog.StateCompleted)
}

// TestDeleteAndRetryRaceTheWorkers: deletes and retries racing the
// workers that claim and finish the same jobs: each either acts on a job
// that is not running or is refused; no job runs twice in one attempt, and
// every job ends deleted or completed.
func TestDeleteAndRetryRaceTheWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	work(t, e.q, backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		<-time.After(time.Duration(rand.IntN(2000)) * time.Microsecond) // the handler's work
		return nil
	}), backlog.Types("race"), backlog.Concurrency(8))
	const n = 200
	ids := make([]uuid.UUID, n)
	for i := range ids {
		id, err := e.q.Enqueue(ctx, "race", nil)
		require.NoError(t, err)
		ids[i] = id
	}
	deleted := map[uuid.UUID]bool{}
	for i, id := range ids {
		var err error
		if i%2 == 0 {
			err = e.q.Delete(ctx, id)
			if err == nil {
				deleted[id] = true
			}
		} else {
			_, err = e.q.Retry(ctx, id)
		}
		if err != nil && !errors.Is(err, backlog.ErrRunning) {
			require.NoError(t, err)
		}
	}
	for _, id := range ids {
		if deleted[id] {
			_, err := e.q.Job(ctx, id)
			require.ErrorIs(t, err, backlog.ErrNotFound)
			continue
		}
		e.waitState(id, 10*time.Second, backlog.StateCompleted)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if !deleted[id] {
			// A retry of a completed job runs it once more.
			require.LessOrEqual(t, runs[id], 2)
		}
	}
}

func TestBulkActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	var ran atomic.Int64
	mux := backlog.NewMux()
	mux.HandleFunc("bulk", func(context.Context, *backlog.Job) error {
		ran.Add(1)
		if fail.Load() {
			return backlog.Permanent(errors.New("down"))
		}
		return nil
	})
	mux.HandleFunc("other", func(context.Context, *backlog.Job) error { return nil })
	work(t, e.q, mux)
	specs := make([]backlog.JobSpec, 1200)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "bulk", Options: []backlog.EnqueueOption{backlog.MaxAttempts(1)}}
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	e.waitCount("type = 'bulk' AND state = 'failed'", 1200, 30*time.Second)
	// A keyed job takes the one-at-a-time path.
	keyed, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "bulk", Options: []backlog.EnqueueOption{backlog.MaxAttempts(1), backlog.UniqueKey("b")}}})
	require.NoError(t, err)
	e.waitState(keyed[0], 10*time.Second, backlog.StateFailed)

	fail.Store(false)
	n, err := e.q.RetryWhere(ctx, backlog.Filter{Types: []string{"bulk"}, ErrorContains: "down"})
	require.NoError(t, err)
	require.Equal(t, 1201, n)
	e.waitCount("type = 'bulk' AND state = 'completed'", 1201, 30*time.Second)

	later := make([]backlog.JobSpec, 300)
	for i := range later {
		later[i] = backlog.JobSpec{Type: "other", Options: []backlog.EnqueueOption{backlog.Delay(time.Hour)}}
	}
	_, err = e.q.EnqueueMany(ctx, later)
	require.NoError(t, err)
	n, err = e.q.CancelWhere(ctx, backlog.Filter{Types: []string{"other"}})
	require.NoError(t, err)
	require.Equal(t, 300, n)
	e.waitCount("type = 'other' AND state = 'cancelled'", 300, 10*time.Second)

	n, err = e.q.DeleteWhere(ctx, backlog.Filter{States: []backlog.State{backlog.StateCancelled}})
	require.NoError(t, err)
	require.Equal(t, 300, n)
	require.Zero(t, e.count("type = 'other'"))
	// Completed jobs, found by their finish times, a page at a time.
	n, err = e.q.DeleteWhere(ctx, backlog.Filter{Types: []string{"bulk"}})
	require.NoError(t, err)
	require.Equal(t, 1201, n)
	require.Zero(t, e.count("type = 'bulk'"))

	var ie *backlog.InputError
	_, err = e.q.RetryWhere(ctx, backlog.Filter{States: []backlog.State{backlog.StateRunning}})
	require.ErrorAs(t, err, &ie)
	_, err = e.q.DeleteWhere(ctx, backlog.Filter{States: []backlog.State{backlog.StateRunning}})
	require.ErrorAs(t, err, &ie)
}

// TestPauseAndResume: a paused type is not claimed by any process, others
// go on, enqueueing goes on, and Resume starts its jobs at once (a NOTIFY:
// the backup poll is an hour).
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	pool2, err := pgxpool.New(ctx, testdb.URL())
	require.NoError(t, err)
	t.Cleanup(pool2.Close)
	worker := e.queue(pool2, backlog.WithPollInterval(time.Hour))
	holding := make(chan struct{})
	release := make(chan struct{})
	mux := backlog.NewMux()
	mux.HandleFunc("p", func(ctx context.Context, j *backlog.Job) error {
		var a struct{ Hold bool }
		_ = json.Unmarshal(j.Args, &a)
		if a.Hold {
			close(holding)
			<-release
		}
		return nil
	})
	mux.HandleFunc("q", func(context.Context, *backlog.Job) error { return nil })
	work(t, worker, mux)
	held, err := e.q.Enqueue(ctx, "p", map[string]bool{"Hold": true})
	require.NoError(t, err)
	<-holding
	require.NoError(t, e.q.Pause(ctx, "p", "never-seen"))
	paused, err := e.q.Paused(ctx)
	require.NoError(t, err)
	require.Len(t, paused, 2)
	var ps []uuid.UUID
	for range 20 {
		id, err := e.q.Enqueue(ctx, "p", nil)
		require.NoError(t, err)
		ps = append(ps, id)
	}
	other, err := e.q.Enqueue(ctx, "q", nil)
	require.NoError(t, err)
	e.waitState(other, 10*time.Second, backlog.StateCompleted)
	close(release)
	e.waitState(held, 10*time.Second, backlog.StateCompleted) // running jobs finish
	for _, id := range ps {
		info, err := e.q.Job(ctx, id)
		require.NoError(t, err)
		require.Equal(t, backlog.StateAvailable, info.State, "a paused type was claimed")
	}
	st, err := e.q.Stats(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"never-seen", "p"}, st.Paused)
	start := time.Now()
	require.NoError(t, e.q.Resume(ctx, "p"))
	for _, id := range ps {
		e.waitState(id, 5*time.Second, backlog.StateCompleted)
	}
	t.Logf("resumed jobs done %s after Resume", time.Since(start))
	var ie *backlog.InputError
	require.ErrorAs(t, e.q.Pause(ctx), &ie)
}

func TestStatsCountFinishedJobsFromCounters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mux := backlog.NewMux()
	mux.HandleFunc("ok", func(context.Context, *backlog.Job) error { return nil })
	mux.HandleFunc("bad", func(context.Context, *backlog.Job) error { return backlog.Permanent(errors.New("no")) })
	work(t, e.q, mux)
	for i := range 40 {
		typ := "ok"
		if i%4 == 0 {
			typ = "bad"
		}
		_, err := e.q.Enqueue(ctx, typ, nil)
		require.NoError(t, err)
	}
	cancelled, err := e.q.Enqueue(ctx, "ok", nil, backlog.Delay(time.Hour))
	require.NoError(t, err)
	_, err = e.q.Cancel(ctx, cancelled)
	require.NoError(t, err)
	_, err = e.q.Enqueue(ctx, "ok", nil, backlog.Delay(time.Hour))
	require.NoError(t, err)
	e.waitCount("state IN ('completed', 'failed')", 40, 10*time.Second)
	e.waitCount("state = 'cancelled' AND expires_at IS NOT NULL", 1, 10*time.Second) // moved to job_history
	st, err := e.q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(30), st.ByState[backlog.StateCompleted])
	require.Equal(t, int64(10), st.ByState[backlog.StateFailed])
	require.Equal(t, int64(1), st.ByState[backlog.StateCancelled])
	require.Equal(t, int64(1), st.ByState[backlog.StateScheduled])
	require.Equal(t, int64(10), st.ByType["bad"][backlog.StateFailed])

	points, err := e.q.Throughput(ctx, time.Now().Add(-time.Hour), time.Minute)
	require.NoError(t, err)
	var completed, failed, cancel int64
	for _, p := range points {
		completed, failed, cancel = completed+p.Completed, failed+p.Failed, cancel+p.Cancelled
	}
	require.Equal(t, []int64{30, 10, 1}, []int64{completed, failed, cancel})
	_, err = e.q.Throughput(ctx, time.Now(), 90*time.Second)
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
}
