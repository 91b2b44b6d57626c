package backlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// runs returns the recorded plan times of a schedule, oldest first, and
// checks that none has more than one job.
func (e *env) runs(name string) []time.Time {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT r.plan_time, count(j.id)
		FROM "`+e.schema+`".periodic_runs r LEFT JOIN "`+e.schema+`".all_jobs j ON j.id = r.job_id
		WHERE r.name = $1 GROUP BY r.plan_time ORDER BY r.plan_time`, name)
	require.NoError(e.t, err)
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var p time.Time
		var n int
		require.NoError(e.t, rows.Scan(&p, &n))
		require.LessOrEqual(e.t, n, 1, "plan %s has %d jobs", p, n)
		out = append(out, p)
	}
	require.NoError(e.t, rows.Err())
	return out
}

func (e *env) waitRuns(name string, n int, within time.Duration) []time.Time {
	e.t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if r := e.runs(name); len(r) >= n {
			return r
		}
		require.True(e.t, time.Now().Before(deadline), "fewer than %d runs of %s within %s", n, name, within)
		<-tick.C
	}
}

func TestPeriodicExactlyOncePerPlanAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var qs []*backlog.Queue
	for range 3 {
		q := e.queue(testdb.NewPool(t, 3)) // separate pools, as separate processes
		require.NoError(t, q.Every("heartbeat", time.Second, "tick", map[string]string{"from": "schedule"},
			backlog.Tags{"kind": "periodic"}, backlog.MaxAttempts(2)))
		qs = append(qs, q)
	}
	e.waitRuns("heartbeat", 10, 30*time.Second)
	for _, q := range qs {
		require.NoError(t, q.Close())
	}
	// What the feature promises: exactly one job per (name, plan time),
	// whichever queue enqueued it, and plan times on the interval's grid.
	// Consecutive plans are not promised to be exactly one interval apart:
	// when every scheduler is late by more than an interval (-race on a
	// busy machine), only the most recent missed plan is enqueued
	// (CatchUp(1)), which leaves a gap.
	runs := e.runs("heartbeat") // also checks: at most one job per plan
	for i := 1; i < len(runs); i++ {
		require.True(t, runs[i].After(runs[i-1]), "plans %s and %s are distinct and ordered", runs[i-1], runs[i])
	}
	for _, p := range runs {
		require.Equal(t, p, p.Truncate(time.Second), "plan %s is on the 1 s grid (aligned to the Unix epoch)", p)
	}
	require.Equal(t, len(runs), e.count("type = 'tick'"), "one job per plan, and no job without a plan")
	require.Equal(t, len(runs), e.count(`type = 'tick' AND tags = '{"kind":"periodic"}' AND max_attempts = 2`))
	// Every plan's job exists and runs at its plan time.
	require.Equal(t, len(runs), e.count(`type = 'tick' AND id IN (SELECT job_id FROM "`+e.schema+`".periodic_runs
		WHERE name = 'heartbeat' AND plan_time = run_at)`))
	gaps := 0
	for i := 1; i < len(runs); i++ {
		if runs[i].Sub(runs[i-1]) != time.Second {
			gaps++
		}
	}
	t.Logf("%d plans, one job each, from 3 queues (%d gaps where every scheduler was late)", len(runs), gaps)
}

func TestPeriodicUsesTheDatabaseClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, skew := range []time.Duration{7 * time.Minute, -7 * time.Minute} {
		q := e.queue(e.pool, backlog.WithClock(func() time.Time { return time.Now().Add(skew) }))
		require.NoError(t, q.Every("skewed", time.Second, "tick", nil))
	}
	e.waitRuns("skewed", 4, 30*time.Second)
	// Each plan was enqueued at its plan time on the database clock.
	rows, err := e.pool.Query(context.Background(), `SELECT r.plan_time, j.created_at FROM "`+e.schema+`".periodic_runs r
		JOIN "`+e.schema+`".all_jobs j ON j.id = r.job_id WHERE r.name = 'skewed'`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var plan, created time.Time
		require.NoError(t, rows.Scan(&plan, &created))
		require.False(t, created.Before(plan), "plan %s enqueued early at %s", plan, created)
		require.Less(t, created.Sub(plan), 2*time.Second, "plan %s enqueued late at %s", plan, created)
	}
	require.NoError(t, rows.Err())
}

func TestPeriodicCatchUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// The schedule last ran an hour ago (every process was down since).
	_, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".periodic_runs (name, plan_time, job_id)
		VALUES ('every-minute', date_trunc('minute', now()) - interval '1 hour', gen_random_uuid()),
		       ('every-minute-all', date_trunc('minute', now()) - interval '1 hour', gen_random_uuid())`)
	require.NoError(t, err)
	require.NoError(t, e.q.Every("every-minute", time.Minute, "catchup", nil))
	require.NoError(t, e.q.Every("every-minute-all", time.Minute, "catchup", nil, backlog.CatchUp(5)))
	one := e.waitRuns("every-minute", 2, 10*time.Second)
	all := e.waitRuns("every-minute-all", 6, 10*time.Second)
	require.Len(t, one, 2, "default: only the most recent missed plan")
	require.Len(t, all, 6, "CatchUp(5): the five most recent missed plans")
	require.Equal(t, 4*time.Minute, all[5].Sub(all[1]))

	// Changed schedule and bad input.
	require.NoError(t, e.q.Cron("every-minute", "*/2 * * * *", "catchup", nil))
	require.ErrorIs(t, e.q.Every("x", time.Millisecond, "t", nil), backlog.ErrInvalid)
	require.ErrorIs(t, e.q.Cron("x", "not a cron", "t", nil), backlog.ErrInvalid)
	require.ErrorIs(t, e.q.Every("", time.Second, "t", nil), backlog.ErrInvalid)
	require.ErrorIs(t, e.q.Every("x", time.Second, "", nil), backlog.ErrInvalid)
	require.ErrorIs(t, e.q.Every("x", time.Second, "t", nil, backlog.CatchUp(0)), nil)
	require.ErrorIs(t, e.q.Every("x", time.Second, "t", nil, backlog.CatchUp(-1)), backlog.ErrInvalid)
	_, err = e.q.Enqueue(ctx, "t", nil, backlog.CatchUp(3))
	require.ErrorIs(t, err, backlog.ErrInvalid)
}
