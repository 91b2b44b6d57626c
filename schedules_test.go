package backlog_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// waitSchedules polls q.Schedules until cond holds or the deadline passes,
// and returns the last list.
func waitSchedules(t *testing.T, q *backlog.Queue, within time.Duration, what string, cond func([]backlog.ScheduleInfo) bool) []backlog.ScheduleInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ss, err := q.Schedules(context.Background())
		require.NoError(t, err)
		if cond(ss) {
			return ss
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedules: %s: not within %s; last: %+v", what, within, ss)
		}
		<-tick.C
	}
}

func schedule(ss []backlog.ScheduleInfo, name string) *backlog.ScheduleInfo {
	for i := range ss {
		if ss[i].Name == name {
			return &ss[i]
		}
	}
	return nil
}

func (e *env) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now))
	return now
}

// Schedules registered with Every and Cron by one process are listed by
// another that registers none, with their definitions, the latest plan
// enqueued and the next one.
func TestSchedulesListed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	start := e.dbNow()
	q1 := e.queue(testdb.NewPool(t, 3), backlog.WithWorkerID("scheduler-1"))
	require.NoError(t, q1.Every("every-2s", 2*time.Second, "tick", map[string]int{"n": 1}, backlog.Tags{"k": "v"},
		backlog.MaxAttempts(3), backlog.Priority(7), backlog.Timeout(time.Minute), backlog.CatchUp(4)))
	require.NoError(t, q1.Cron("cron-5m", "*/5 * * * *", "report", nil, backlog.UniqueKey("report")))
	require.NoError(t, q1.Cron("cron-every", "@every 3s", "tock", nil, backlog.OrderingKey("tocks")))

	// e.q registers no schedule.
	waitSchedules(t, e.q, 20*time.Second, "all three, two of them run", func(ss []backlog.ScheduleInfo) bool {
		return len(ss) == 3 && !ss[1].LastPlan.IsZero() && !ss[2].LastPlan.IsZero() // by name: cron-5m, cron-every, every-2s
	})
	before := e.dbNow()
	ss, err := e.q.Schedules(ctx)
	require.NoError(t, err)
	after := e.dbNow()
	require.Equal(t, []string{"cron-5m", "cron-every", "every-2s"}, []string{ss[0].Name, ss[1].Name, ss[2].Name})

	// The latest plan is a recorded one, with its job.
	checkLast := func(s *backlog.ScheduleInfo) {
		t.Helper()
		var job uuid.UUID
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT job_id FROM "`+e.schema+`".periodic_runs WHERE name = $1 AND plan_time = $2`,
			s.Name, s.LastPlan).Scan(&job))
		require.Equal(t, job, s.LastJobID)
	}
	// The next plan is the first on the grid after the latest plan and
	// the database's now() at the listing, which fell in [before, after].
	checkNext := func(s *backlog.ScheduleInfo, grid time.Duration) {
		t.Helper()
		require.Equal(t, s.NextPlan, s.NextPlan.Truncate(grid), "%s: next plan %s on the %s grid", s.Name, s.NextPlan, grid)
		require.True(t, s.NextPlan.After(before) && s.NextPlan.After(s.LastPlan), "%s: next plan %s after %s and %s",
			s.Name, s.NextPlan, before, s.LastPlan)
		require.False(t, s.NextPlan.After(after.Add(grid)), "%s: next plan %s no later than %s + %s", s.Name, s.NextPlan, after, grid)
	}

	every := schedule(ss, "every-2s")
	require.Equal(t, backlog.ScheduleEvery, every.Kind)
	require.Equal(t, "2s", every.Spec)
	require.Equal(t, "tick", every.Type)
	require.JSONEq(t, `{"n":1}`, string(every.Args))
	require.Equal(t, map[string]string{"k": "v"}, every.Tags)
	require.Equal(t, 7, every.Priority)
	require.Equal(t, 3, every.MaxAttempts)
	require.Equal(t, time.Minute, every.Timeout)
	require.Equal(t, 4, every.CatchUp)
	require.Equal(t, "scheduler-1", every.RegisteredBy)
	require.False(t, every.Stale)
	require.Equal(t, every.LastPlan, every.LastPlan.Truncate(2*time.Second))
	checkLast(every)
	checkNext(every, 2*time.Second)

	cronEvery := schedule(ss, "cron-every")
	require.Equal(t, backlog.ScheduleCron, cronEvery.Kind)
	require.Equal(t, "@every 3s", cronEvery.Spec)
	require.Equal(t, "tocks", cronEvery.OrderingKey)
	require.Nil(t, cronEvery.Tags)
	checkLast(cronEvery)
	checkNext(cronEvery, 3*time.Second)

	cron5 := schedule(ss, "cron-5m")
	require.Equal(t, backlog.ScheduleCron, cron5.Kind)
	require.Equal(t, "*/5 * * * *", cron5.Spec)
	require.Equal(t, "report", cron5.UniqueKey)
	require.Equal(t, backlog.DefaultMaxAttempts, cron5.MaxAttempts)
	require.Equal(t, 1, cron5.CatchUp)
	if cron5.LastPlan.IsZero() {
		require.Equal(t, uuid.Nil, cron5.LastJobID)
	} else {
		// Not run, unless one of its plans fell due while the test ran (a
		// run that straddles a 5-minute boundary): then that one.
		require.True(t, cron5.LastPlan.After(start) && !cron5.LastPlan.After(after),
			"cron-5m ran for %s, which was not due while the test ran (%s to %s)", cron5.LastPlan, start, after)
		require.Equal(t, cron5.LastPlan, cron5.LastPlan.Truncate(5*time.Minute))
		checkLast(cron5)
	}
	checkNext(cron5, 5*time.Minute)

	// A plan recorded for it (as if it had run) moves the next plan on.
	lastPlan := cron5.NextPlan.Add(10 * time.Minute)
	_, err = e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".periodic_runs (name, plan_time, job_id) VALUES ('cron-5m', $1, $2)`,
		lastPlan, backlog.NewID())
	require.NoError(t, err)
	ss, err = e.q.Schedules(ctx)
	require.NoError(t, err)
	require.True(t, schedule(ss, "cron-5m").LastPlan.Equal(lastPlan))
	require.True(t, schedule(ss, "cron-5m").NextPlan.Equal(lastPlan.Add(5*time.Minute)))

	// A changed definition replaces the listed one; the creation time stays.
	require.NoError(t, q1.Every("every-2s", 4*time.Second, "tick", map[string]int{"n": 2}))
	ss = waitSchedules(t, e.q, 10*time.Second, "every-2s redefined", func(ss []backlog.ScheduleInfo) bool {
		return schedule(ss, "every-2s").Spec == "4s"
	})
	changed := schedule(ss, "every-2s")
	require.JSONEq(t, `{"n":2}`, string(changed.Args))
	require.Nil(t, changed.Tags)
	require.True(t, changed.CreatedAt.Equal(every.CreatedAt))
	require.True(t, changed.UpdatedAt.After(every.UpdatedAt))
	require.Equal(t, changed.NextPlan, changed.NextPlan.Truncate(4*time.Second))

	// The same definition registered again changes nothing but the
	// registration time.
	require.NoError(t, q1.Every("every-2s", 4*time.Second, "tick", map[string]int{"n": 2}))
	ss = waitSchedules(t, e.q, 10*time.Second, "every-2s registered again", func(ss []backlog.ScheduleInfo) bool {
		return schedule(ss, "every-2s").RegisteredAt.After(changed.RegisteredAt)
	})
	require.True(t, schedule(ss, "every-2s").UpdatedAt.Equal(changed.UpdatedAt))
}

// Every process confirms the schedules it registers: a row deleted or
// left unconfirmed comes back; a schedule no process registers any more
// stays listed, stale.
func TestSchedulesConfirmedAndStale(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	confirm := 200 * time.Millisecond // stale after three of them
	backlog.SetScheduleConfirmForTest(e.q, confirm)
	q1 := e.queue(testdb.NewPool(t, 3))
	backlog.SetScheduleConfirmForTest(q1, confirm)
	require.NoError(t, q1.Every("hourly", time.Hour, "report", json.RawMessage(`{"a":1}`)))
	ss := waitSchedules(t, e.q, 10*time.Second, "listed", func(ss []backlog.ScheduleInfo) bool { return len(ss) == 1 })
	require.False(t, ss[0].Stale)
	first := ss[0].RegisteredAt

	// Confirmed while q1 runs.
	waitSchedules(t, e.q, 10*time.Second, "confirmed", func(ss []backlog.ScheduleInfo) bool {
		return len(ss) == 1 && ss[0].RegisteredAt.After(first)
	})
	_, err := e.pool.Exec(ctx, `UPDATE "`+e.schema+`".schedules SET registered_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	waitSchedules(t, e.q, 10*time.Second, "confirmed again", func(ss []backlog.ScheduleInfo) bool {
		return len(ss) == 1 && !ss[0].Stale
	})
	_, err = e.pool.Exec(ctx, `DELETE FROM "`+e.schema+`".schedules`)
	require.NoError(t, err)
	waitSchedules(t, e.q, 10*time.Second, "written again", func(ss []backlog.ScheduleInfo) bool {
		return len(ss) == 1 && ss[0].Type == "report"
	})

	// No process registers it any more: listed, stale, with its next plan.
	require.NoError(t, q1.Close())
	ss = waitSchedules(t, e.q, 10*time.Second, "stale", func(ss []backlog.ScheduleInfo) bool {
		return len(ss) == 1 && ss[0].Stale
	})
	require.JSONEq(t, `{"a":1}`, string(ss[0].Args))
	require.Equal(t, ss[0].NextPlan, ss[0].NextPlan.Truncate(time.Hour))
	require.True(t, ss[0].NextPlan.After(e.dbNow().Add(-time.Second)))
}

func TestSchedulesAfterCloseAndUnmigrated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(e.pool)
	require.NoError(t, q.Close())
	_, err := q.Schedules(context.Background())
	require.ErrorIs(t, err, backlog.ErrClosed)

	fresh, err := backlog.New(context.Background(), e.pool, backlog.WithSchema(testdb.Schema(t)), backlog.WithLogger(logger(t)))
	require.NoError(t, err)
	defer fresh.Close()
	_, err = fresh.Schedules(context.Background())
	require.ErrorIs(t, err, backlog.ErrNotMigrated)
}
