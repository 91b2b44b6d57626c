package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// A worker process SIGKILLed while its jobs hold every slot of a
// concurrency limit: no other process starts a job of the type while the
// dead process's leases last (the slots are still taken), and once they
// expire and the sweep makes the jobs available again, another process
// runs everything, never more than the limit's handlers at once (each
// records its start and its end; a job's row stays running until its
// outcome is written, after its handler has freed the slot: migration
// 0028).
func TestKilledProcessSlotsReturnAfterLeaseExpiry(t *testing.T) {
	requireFaults(t)
	const (
		limit = 2
		jobs  = 10
		lease = 2 * time.Second
		sweep = 200 * time.Millisecond
	)
	e := newFEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, childType, backlog.Limit{Concurrency: limit}))
	specs := make([]backlog.JobSpec, jobs)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: childType, Args: map[string]int{"n": i}}
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)

	// A holds both slots with jobs that would run for an hour.
	a := startChild(t, e.schema, "holder", lease, sweep, 4, childHoldEnv+"=1h")
	t.Cleanup(a.kill)
	running := func() (n int) {
		require.NoError(t, e.ctl.QueryRow(ctx, `SELECT count(*) FROM `+e.table("jobs")+` WHERE state = 'running'`).Scan(&n))
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for running() < limit {
		require.True(t, time.Now().Before(deadline), "the holder never took the %d slots", limit)
		<-time.After(10 * time.Millisecond)
	}
	var expires time.Time
	require.NoError(t, e.ctl.QueryRow(ctx, `SELECT min(lease_expires_at) FROM `+e.table("jobs")+` WHERE state = 'running'`).Scan(&expires))
	a.kill()

	// B: fast jobs, four workers; it must wait for A's leases.
	b := startChild(t, e.schema, "taker", lease, sweep, 4, childEndsEnv+"=1")
	t.Cleanup(func() { _ = b.stop(10 * time.Second) })
	deadline = time.Now().Add(60 * time.Second)
	for {
		var done int
		require.NoError(t, e.ctl.QueryRow(ctx, `SELECT count(*) FROM `+e.table("job_history")+` WHERE state = 'completed'`).Scan(&done))
		if done == jobs {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d jobs completed within 60 s", done, jobs)
		<-time.After(5 * time.Millisecond)
	}
	// The taker's handlers, by their recorded starts and ends (an end
	// before a start at one instant).
	var peak int
	require.NoError(t, e.ctl.QueryRow(ctx, `SELECT coalesce(max(n), 0) FROM (
		SELECT sum(d) OVER (ORDER BY at, d) AS n FROM (
			SELECT started_at AS at, 1 AS d FROM `+e.table("executions")+` WHERE worker = 'taker'
			UNION ALL
			SELECT stopped_at, -1 FROM `+e.table("executions")+` WHERE worker = 'taker') x) y`).Scan(&peak))
	require.NotZero(t, peak)
	require.LessOrEqual(t, peak, limit, "handlers running at once")
	var early, first int
	var firstAt time.Time
	require.NoError(t, e.ctl.QueryRow(ctx, `SELECT count(*) FILTER (WHERE started_at < $1), count(*), min(started_at)
		FROM `+e.table("executions")+` WHERE worker = 'taker'`, expires).Scan(&early, &first, &firstAt))
	require.Zero(t, early, "the taker started jobs while the killed holder's leases still held the slots")
	t.Logf("holder killed holding %d slots; its first lease expired at %s; the taker's first start came %s after that, %d executions, at most %d at once",
		limit, expires.Format(time.RFC3339Nano), firstAt.Sub(expires).Round(time.Millisecond), first, peak)
	report(t, summaryRow{
		Scenario:   fmt.Sprintf("8. SIGKILL while holding every slot of a concurrency limit of %d (lease %s)", limit, lease),
		Jobs:       jobs,
		Faults:     "1 SIGKILL of the process holding both slots",
		Lost:       0,
		Duplicates: fmt.Sprintf("%d executions for %d jobs (the killed process's %d ran again)", first+limit, jobs, limit),
		Pickup:     fmt.Sprintf("slots back %s after lease expiry", firstAt.Sub(expires).Round(time.Millisecond)),
	})
}
