package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// enqueueN enqueues n jobs of typ on the control queue in batches.
func (e *fenv) enqueueN(typ string, n int, opts ...backlog.EnqueueOption) {
	e.t.Helper()
	for i := 0; i < n; i += 500 {
		specs := make([]backlog.JobSpec, min(500, n-i))
		for k := range specs {
			specs[k] = backlog.JobSpec{Type: typ, Args: map[string]int{"n": i + k}, Options: opts}
		}
		_, err := e.q.EnqueueMany(context.Background(), specs)
		require.NoError(e.t, err)
	}
}

// recorder is a handler that inserts an execution row on the control pool
// (so the handler's side effect never depends on the faulty path) and
// completes.
func (e *fenv) recorder(worker string) backlog.HandlerFunc {
	return func(ctx context.Context, job *backlog.Job) error {
		_, err := e.record(ctx, e.ctl, job, worker)
		return err
	}
}

// leaseObservation is what the partitioned worker's handler saw when its
// context was cancelled.
type leaseObservation struct {
	cause     error
	stoppedAt time.Time // database clock right after the handler saw ctx.Done()
	leaseExp  time.Time // the attempt's last lease_expires_at in the database
	state     string    // the job's state at that moment
	guarded   bool      // ctx was never cancelled; the handler gave up by itself
}

// TestBlackholeLeaseLostBeforeExpiry partitions a worker from the database
// while it runs a long job. Its handler must be cancelled (cause
// ErrLeaseLost) before the job's lease expires in the database; a second
// worker gets the job only after expiry and the sweep, so the two never run
// the same attempt at once. When the partition heals, held stale bytes
// (renewals of the old lease) arrive and change nothing, and the first
// worker resumes.
//
// Two variants: w2 sweeps every 200 ms, and every 10 ms (what a fleet of
// many processes, each sweeping every few seconds, adds up to).
func TestBlackholeLeaseLostBeforeExpiry(t *testing.T) {
	requireFaults(t)
	for _, sweep := range []time.Duration{200 * time.Millisecond, 10 * time.Millisecond} {
		t.Run("w2-sweeps-every-"+sweep.String(), func(t *testing.T) { blackhole(t, sweep) })
	}
}

func blackhole(t *testing.T, sweep time.Duration) {
	const lease = 3 * time.Second
	e := newFEnv(t)
	ctx := context.Background()
	px := newProxy(t)
	q1 := e.queue(e.pool("w1", 4, px.Route), "w1", backlog.WithLease(lease), backlog.WithSweepInterval(200*time.Millisecond),
		backlog.WithPollInterval(time.Hour))
	q2 := e.queue(e.pool("w2", 4, nil), "w2", backlog.WithLease(lease), backlog.WithSweepInterval(sweep),
		backlog.WithPollInterval(time.Hour))
	e.logLeases()

	started := make(chan struct{}, 1)
	observed := make(chan leaseObservation, 1)
	mux1 := backlog.NewMux()
	mux1.HandleFunc("s3.long", func(ctx context.Context, job *backlog.Job) error {
		if _, err := e.record(ctx, e.ctl, job, "w1"); err != nil {
			return err
		}
		started <- struct{}{}
		guard := time.NewTimer(10 * lease)
		defer guard.Stop()
		var o leaseObservation
		select {
		case <-ctx.Done():
			o.cause = context.Cause(ctx)
		case <-guard.C:
			o.guarded = true
		}
		err := e.ctl.QueryRow(context.Background(), `UPDATE `+e.table("executions")+` x SET stopped_at = clock_timestamp(), note = $3
			FROM `+e.table("all_jobs")+` j WHERE x.job_id = $1 AND x.attempt = $2 AND j.id = $1
			RETURNING x.stopped_at, j.state`, job.ID, job.Attempt, fmt.Sprint(o.cause)).
			Scan(&o.stoppedAt, &o.state)
		if err != nil {
			o.cause = fmt.Errorf("recording the stop: %w (cause %v)", err, o.cause)
		}
		observed <- o
		return context.Cause(ctx)
	})
	mux1.Handle("s3.after", e.recorder("w1"))
	mux2 := backlog.NewMux()
	mux2.Handle("s3.long", e.recorder("w2"))

	id, err := e.q.Enqueue(ctx, "s3.long", nil, backlog.MaxAttempts(3))
	require.NoError(t, err)
	work(t, q1, mux1, backlog.Concurrency(2))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("w1 did not start the long job")
	}
	work(t, q2, mux2, backlog.Concurrency(1))

	// Partition in steady state: after at least one renewal landed.
	eventually(t, 2*lease, 20*time.Millisecond, "a lease renewal of the long job", func() bool {
		return e.count(`SELECT count(*) FROM `+e.table("lease_log")+` WHERE job_id = $1`, id) >= 2
	})
	var before time.Time
	require.NoError(t, e.ctl.QueryRow(ctx, `SELECT lease_expires_at FROM `+e.table("jobs")+` WHERE id = $1`, id).Scan(&before))
	px.Blackhole()
	blackholedAt := e.dbNow()
	var renewals int
	require.NoError(t, e.ctl.QueryRow(ctx, `SELECT count(*) FROM `+e.table("lease_log")+` WHERE job_id = $1`, id).Scan(&renewals))

	var o leaseObservation
	select {
	case o = <-observed:
	case <-time.After(20 * lease):
		t.Fatal("the partitioned handler never returned")
	}
	require.False(t, o.guarded, "the partitioned worker's handler was never cancelled")
	// Every lease_expires_at the database ever held for attempt 1 was
	// logged by a trigger: the last one is when the lease expired there.
	var after int
	require.NoError(t, e.ctl.QueryRow(ctx, `SELECT max(lease_expires_at), count(*) FILTER (WHERE logged_at > $2)
		FROM `+e.table("lease_log")+` WHERE job_id = $1 AND attempt = 1`, id, blackholedAt).Scan(&o.leaseExp, &after))
	require.Zero(t, after, "a renewal reached the database during the partition")
	require.ErrorIs(t, o.cause, backlog.ErrLeaseLost, "cause of the partitioned handler's cancellation")
	require.False(t, o.leaseExp.Before(before), "lease_expires_at moved backwards")
	margin := o.leaseExp.Sub(o.stoppedAt)
	t.Logf("lease %s (%d claims/renewals logged): lease_expires_at read before the blackhole %s, last one %s (renewed %s later); blackholed at %s; handler cancelled at %s: %s after the blackhole, margin to the database-side expiry %s (designed: lease/5 = %s)",
		lease, renewals, before.Format("15:04:05.000"), o.leaseExp.Format("15:04:05.000"), o.leaseExp.Sub(before).Round(time.Millisecond),
		blackholedAt.Format("15:04:05.000"), o.stoppedAt.Format("15:04:05.000"), o.stoppedAt.Sub(blackholedAt).Round(time.Millisecond),
		margin.Round(time.Millisecond), lease/5)
	assert.Positive(t, margin, "the partitioned handler must be cancelled BEFORE its lease expires in the database "+
		"(cancelled at %s, lease_expires_at %s, state then %s)", o.stoppedAt.Format("15:04:05.000"), o.leaseExp.Format("15:04:05.000"), o.state)

	// w2 takes the job over after the expiry and the sweep.
	eventually(t, 30*time.Second, 20*time.Millisecond, "w2 completes the job", func() bool {
		return e.count(`SELECT count(*) FROM `+e.table("all_jobs")+` WHERE id = $1 AND state = 'completed'`, id) == 1
	})
	// Work for w1 only, queued while it is cut off.
	e.enqueueN("s3.after", 20)
	px.Heal()
	healedAt := e.dbNow()
	e.waitSettled(30 * time.Second)

	l := e.ledger()
	l.requireCompletedOnceNoAttemptTwice(t, "s3.long", "s3.after")
	// The long job's re-run is the scenario's one by design (checked
	// below); the jobs queued for w1 during the partition run once each.
	l.requireOneExecutionEach(t, "s3.after")
	j := l.jobs[id.String()]
	require.Len(t, j.Execs, 2, "the long job ran on w1 (partitioned) and on w2: %+v", j.Execs)
	x1, x2 := j.Execs[0], j.Execs[1]
	require.Equal(t, "w1", x1.Worker)
	require.Equal(t, "w2", x2.Worker)
	require.Equal(t, 2, j.Attempt)
	require.Contains(t, j.errorOf(1), "lease expired: worker w1")
	require.NotNil(t, x1.Stopped)
	overlap := x1.Stopped.Sub(x2.Started)
	t.Logf("w1 attempt 1 ran %s – %s; w2 attempt 2 started %s (%s after the database-side expiry)",
		x1.Started.Format("15:04:05.000"), x1.Stopped.Format("15:04:05.000"), x2.Started.Format("15:04:05.000"),
		x2.Started.Sub(o.leaseExp).Round(time.Millisecond))
	assert.True(t, x2.Started.After(o.leaseExp), "w2 got the job before its lease expired")
	assert.True(t, x1.Stopped.Before(x2.Started), "the two workers ran the job at once for %s", overlap.Round(time.Millisecond))

	first, ok := l.firstStartAfter(healedAt, "w1")
	require.True(t, ok)
	pickup := first.Sub(healedAt)
	t.Logf("partition healed at %s; w1 ran its first job %s later", healedAt.Format("15:04:05.000"), pickup.Round(time.Millisecond))
	report(t, summaryRow{
		Scenario: fmt.Sprintf("3a. blackhole (partition) of a worker's pool + LISTEN, lease 3s; 2nd worker sweeps every %s", sweep),
		Jobs:     1 + 20,
		Faults:   fmt.Sprintf("1 partition of %s, then healed (held stale bytes delivered)", healedAt.Sub(blackholedAt).Round(100*time.Millisecond)),
		Lost:     len(l.jobs) - l.states["completed"],
		Duplicates: fmt.Sprintf("1 by design: attempt 1 on w1 (partitioned; %s) and attempt 2 on w2 (%s)",
			relative(margin, "cancelled %s before the DB-side lease expiry", "BUG: cancelled %s after the DB-side lease expiry"),
			relative(-overlap, "started %s after w1's handler stopped", "BUG: started %s before w1's handler stopped: both ran the job at once")),
		Pickup: fmt.Sprintf("heal → w1's next job start: %s", pickup.Round(time.Millisecond)),
	})
}

// relative formats d with ok when it is positive, else -d with bad.
func relative(d time.Duration, ok, bad string) string {
	if d > 0 {
		return fmt.Sprintf(ok, d.Round(time.Millisecond))
	}
	return fmt.Sprintf(bad, (-d).Round(time.Millisecond))
}

// logLeases installs a trigger that logs every lease_expires_at a job
// gets (claims and renewals) with the database time it was written.
func (e *fenv) logLeases() {
	e.t.Helper()
	_, err := e.ctl.Exec(context.Background(), `
CREATE TABLE `+e.table("lease_log")+` (job_id uuid, attempt int, token uuid, lease_expires_at timestamptz,
	logged_at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION `+e.table("log_lease")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO `+e.table("lease_log")+` (job_id, attempt, token, lease_expires_at)
	VALUES (NEW.id, NEW.attempt, NEW.lease_token, NEW.lease_expires_at);
	RETURN NULL;
END $$;
CREATE TRIGGER log_lease AFTER INSERT OR UPDATE OF lease_expires_at ON `+e.table("jobs")+`
	FOR EACH ROW WHEN (NEW.lease_expires_at IS NOT NULL) EXECUTE FUNCTION `+e.table("log_lease")+`();`)
	require.NoError(e.t, err)
}

// TestSlowConnections: 20 ms each way between a worker and the database;
// jobs still complete exactly once, and no lease is lost.
func TestSlowConnections(t *testing.T) {
	requireFaults(t)
	const jobs = 1000
	e := newFEnv(t)
	px := newProxy(t)
	const latency = 20 * time.Millisecond
	px.SetLatency(latency)
	pool := e.pool("slow", 8, px.Route)
	q := e.queue(pool, "slow", backlog.WithLease(2*time.Second), backlog.WithSweepInterval(200*time.Millisecond),
		backlog.WithPollInterval(2*time.Second))
	// The latency is really there: one query on an open connection (not
	// the connection set-up) takes at least a delay each way.
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	rt := time.Now()
	_, err = conn.Exec(context.Background(), `SELECT 1`)
	roundTrip := time.Since(rt)
	conn.Release()
	require.NoError(t, err)
	require.GreaterOrEqual(t, roundTrip, 2*latency, "a round trip through the proxy must carry the injected latency both ways")
	t.Logf("round trip through the proxy: %s", roundTrip.Round(time.Millisecond))

	// Half enqueued directly, half through the slow pool, one at a time.
	e.enqueueN("s3.slow", jobs/2)
	start := time.Now()
	work(t, q, e.recorder("slow"), backlog.Types("s3.slow"), backlog.Concurrency(16))
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			for i := range jobs / 8 {
				if _, err := q.Enqueue(context.Background(), "s3.slow", map[string]int{"g": g, "i": i}); err != nil {
					failed.Add(1)
					t.Errorf("enqueue through the slow pool: %v", err)
				}
			}
		})
	}
	wg.Wait()
	e.waitSettled(2 * time.Minute)
	elapsed := time.Since(start)
	l := e.ledger()
	require.Len(t, l.jobs, jobs)
	l.requireCompletedOnceNoAttemptTwice(t, "s3.slow")
	l.requireOneExecutionEach(t, "s3.slow")
	for _, j := range l.jobs {
		require.Empty(t, j.Errors, "job %s: a lease was lost or an attempt failed", j.ID)
	}
	t.Logf("%d jobs through +20 ms each way in %s", jobs, elapsed.Round(time.Millisecond))
	report(t, summaryRow{
		Scenario:   "3b. slow network: +20 ms each way (worker pool, 500 enqueues through it)",
		Jobs:       jobs,
		Faults:     fmt.Sprintf("latency 40 ms per round trip for the whole run (measured: %s)", roundTrip.Round(time.Millisecond)),
		Lost:       jobs - l.states["completed"],
		Duplicates: "0 (no lease lost, no attempt failed)",
		Pickup:     "n/a (no outage)",
	})
}

// TestDroppedConnections cuts every connection of a worker's pool (LISTEN
// included) again and again while it works. Jobs complete, each handler
// runs once.
func TestDroppedConnections(t *testing.T) {
	requireFaults(t)
	const (
		jobs  = 3000
		cuts  = 8
		lease = 3 * time.Second
	)
	e := newFEnv(t)
	px := newProxy(t)
	q := e.queue(e.pool("cut", 6, px.Route), "cut", backlog.WithLease(lease), backlog.WithSweepInterval(200*time.Millisecond),
		backlog.WithPollInterval(time.Second))
	e.enqueueN("s3.cut", jobs)
	work(t, q, e.recorder("cut"), backlog.Types("s3.cut"), backlog.Concurrency(8))

	// A cut counts only when it closed connections; at least one must
	// land while jobs are still waiting (the worker busy).
	var cutAt []time.Time
	cutConns, midWork := 0, 0
	tick := time.NewTimer(300 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.Now().Add(time.Minute)
	for len(cutAt) < cuts {
		require.True(t, time.Now().Before(giveUp), "only %d of %d cuts found connections to cut within a minute", len(cutAt), cuts)
		<-tick.C
		at := e.dbNow()
		waiting := e.count(`SELECT count(*) FROM ` + e.table("all_jobs") + ` WHERE state <> 'completed'`)
		n := px.CutAll()
		t.Logf("cut %d connections (%d jobs not completed)", n, waiting)
		tick.Reset(300*time.Millisecond + rand.N(300*time.Millisecond))
		if n == 0 {
			continue
		}
		cutAt = append(cutAt, at)
		cutConns += n
		if waiting > 0 {
			midWork++
		}
	}
	require.Positive(t, midWork, "no cut landed while jobs were still to be done")
	e.waitSettled(time.Minute)
	l := e.ledger()
	require.Len(t, l.jobs, jobs)
	l.requireCompletedOnceNoAttemptTwice(t, "s3.cut")
	l.requireOneExecutionEach(t, "s3.cut")
	// A claim whose answer was cut off leaves jobs leased to this live
	// worker that it never saw: they expire and run later. No handler ran
	// for the lost attempt (each job has one execution), so that is no
	// duplicate.
	lostClaims := 0
	for _, j := range l.jobs {
		for _, ae := range j.Errors {
			require.Contains(t, ae.Error, "lease expired: worker cut", "job %s", j.ID)
			lostClaims++
		}
	}
	var pickup durations
	for _, c := range cutAt {
		if s, ok := l.firstStartAfter(c, ""); ok {
			pickup = append(pickup, s.Sub(c))
		}
	}
	t.Logf("%d jobs, %d cuts; %d attempts lost with a cut-off claim answer (re-run after expiry, no handler had run); cut → next job start: %s",
		jobs, cuts, lostClaims, pickup)
	report(t, summaryRow{
		Scenario:   "3c. dropped connections: every connection of a worker cut",
		Jobs:       jobs,
		Faults:     fmt.Sprintf("%d cuts of all connections (%d connections, %d cuts mid-work), 300-600 ms apart", cuts, cutConns, midWork),
		Lost:       jobs - l.states["completed"],
		Duplicates: fmt.Sprintf("0 (%d claims lost in flight: those attempts expired and ran again, their handlers had not run)", lostClaims),
		Pickup:     "cut → next job start: " + pickup.String(),
	})

}
