package faults_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// listenerPID waits until exactly one backend of the queue under test is
// LISTENing on the schema's channel and that backend's pid is not `not`, and
// returns the pid.
func (e *fenv) listenerPID(app string, not int32, within time.Duration) int32 {
	e.t.Helper()
	var pid int32
	eventually(e.t, within, 10*time.Millisecond, "a LISTEN connection", func() bool {
		rows, err := e.ctl.Query(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND query = $2`, app, `LISTEN "`+e.schema+`.backlog"`)
		require.NoError(e.t, err)
		var pids []int32
		for rows.Next() {
			var p int32
			require.NoError(e.t, rows.Scan(&p))
			pids = append(pids, p)
		}
		require.NoError(e.t, rows.Err())
		if len(pids) == 1 && pids[0] != not {
			pid = pids[0]
			return true
		}
		return false
	})
	return pid
}

// TestListenerLoss kills only the LISTEN connection, again and again.
func TestListenerLoss(t *testing.T) {
	requireFaults(t)

	// With a 500 ms backup poll, work continues under steady enqueues.
	t.Run("under-load", func(t *testing.T) {
		const kills = 6
		e := newFEnv(t)
		pool := e.pool("s4", 6, nil)
		q := e.queue(pool, "s4", backlog.WithPollInterval(500*time.Millisecond), backlog.WithPollJitter(50*time.Millisecond))
		work(t, q, e.recorder("s4"), backlog.Types("s4.work"), backlog.Concurrency(4))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var enqueued atomic.Int64
		for g := range 2 {
			wg.Go(func() {
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					_, err := q.Enqueue(context.Background(), "s4.work", map[string]int{"g": g, "i": i})
					if err != nil {
						t.Errorf("enqueue: %v", err)
						return
					}
					enqueued.Add(1)
				}
			})
		}
		var killAt []time.Time
		var back durations
		pid := e.listenerPID(e.app("s4"), 0, 10*time.Second)
		tick := time.NewTimer(500 * time.Millisecond)
		for range kills {
			<-tick.C
			at := e.dbNow()
			require.Equal(t, 1, e.count(`SELECT count(pg_terminate_backend($1))`, pid))
			killAt = append(killAt, at)
			pid = e.listenerPID(e.app("s4"), pid, 30*time.Second)
			back = append(back, e.dbNow().Sub(at))
			tick.Reset(700 * time.Millisecond)
		}
		tick.Stop()
		close(stop)
		wg.Wait()
		e.waitSettled(30 * time.Second)
		l := e.ledger()
		require.EqualValues(t, enqueued.Load(), len(l.jobs))
		l.requireCompletedOnceNoAttemptTwice(t, "s4.work")
		l.requireOneExecutionEach(t, "s4.work")
		var pickup durations
		for _, at := range killAt {
			if s, ok := l.firstStartAfter(at, ""); ok {
				pickup = append(pickup, s.Sub(at))
			}
		}
		t.Logf("%d jobs, %d LISTEN kills; listener back after %s; kill → next job start: %s", len(l.jobs), kills, back, pickup)
		report(t, summaryRow{
			Scenario:   "4a. LISTEN connection killed under steady enqueues (backup poll 500 ms)",
			Jobs:       len(l.jobs),
			Faults:     fmt.Sprintf("%d kills of the LISTEN backend, 700 ms apart (listener back: %s)", kills, back),
			Lost:       len(l.jobs) - l.states["completed"],
			Duplicates: "0",
			Pickup:     "kill → next job start: " + pickup.String(),
		})
	})

	// With an hour-long backup poll, only the reconnect's wake-up of every
	// domain can find a job inserted without NOTIFY right after the kill.
	t.Run("reconnect-wakes-idle-workers", func(t *testing.T) {
		const kills = 5
		e := newFEnv(t)
		q := e.queue(e.pool("s4", 6, nil), "s4", backlog.WithPollInterval(time.Hour))
		started := make(chan struct{}, 100)
		rec := e.recorder("s4")
		work(t, q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
			err := rec(ctx, job)
			started <- struct{}{}
			return err
		}), backlog.Types("s4.raw"), backlog.Concurrency(2))
		// Warm up: one job through NOTIFY, so the domain is parked.
		_, err := e.q.Enqueue(context.Background(), "s4.raw", nil)
		require.NoError(t, err)
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("warm-up job did not run")
		}
		e.waitSettled(10 * time.Second)

		var pickup durations
		pid := e.listenerPID(e.app("s4"), 0, 10*time.Second)
		for range kills {
			// Kill, then insert with raw SQL (no NOTIFY), on one control
			// connection, right after each other.
			var inserted time.Time
			conn, err := e.ctl.Acquire(context.Background())
			require.NoError(t, err)
			var terminated bool
			err = conn.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&terminated)
			require.NoError(t, err)
			require.True(t, terminated, "the LISTEN backend %d was not terminated", pid)
			err = conn.QueryRow(context.Background(), `INSERT INTO `+e.table("jobs")+` (id, type, args)
				VALUES (gen_random_uuid(), 's4.raw', '{}') RETURNING clock_timestamp()`).Scan(&inserted)
			conn.Release()
			require.NoError(t, err)
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("a job inserted without NOTIFY after the LISTEN connection was killed was not picked up (backup poll is 1 h)")
			}
			newPID := e.listenerPID(e.app("s4"), pid, 30*time.Second)
			// (The listener reuses a pooled connection: LISTEN's query_start,
			// not backend_start, is when it came back.)
			var listenStart time.Time
			require.NoError(t, e.ctl.QueryRow(context.Background(), `SELECT query_start FROM pg_stat_activity WHERE pid = $1`, newPID).Scan(&listenStart))
			require.True(t, listenStart.After(inserted), "LISTEN ran again before the job was inserted: the test did not test the wake-up")
			pid = newPID
			e.waitSettled(10 * time.Second)
			l := e.ledger()
			var first time.Time
			for _, j := range l.jobs {
				for _, x := range j.Execs {
					if x.Started.After(inserted) && (first.IsZero() || x.Started.Before(first)) {
						first = x.Started
					}
				}
			}
			pickup = append(pickup, first.Sub(inserted))
		}
		l := e.ledger()
		require.Len(t, l.jobs, kills+1)
		l.requireCompletedOnceNoAttemptTwice(t, "s4.raw")
		l.requireOneExecutionEach(t, "s4.raw")
		t.Logf("raw insert right after the LISTEN kill → picked up after: %s", pickup)
		report(t, summaryRow{
			Scenario:   "4b. LISTEN killed, job inserted without NOTIFY right after (backup poll 1 h)",
			Jobs:       len(l.jobs),
			Faults:     fmt.Sprintf("%d kills of the LISTEN backend", kills),
			Lost:       len(l.jobs) - l.states["completed"],
			Duplicates: "0",
			Pickup:     "insert after kill → job start (via the reconnect's wake-up): " + pickup.String(),
		})
	})
}

// TestListenerRetriesEverySecond: the listener's connection attempts fail
// (WithListenConn) eleven times in a row, as while no primary takes
// connections during a failover. The gaps between attempts stay within
// the bound (1 s, jittered up to 1.5 s) instead of growing to 5 s (7.5 s
// jittered: in TestHAFailover workers stayed idle for seconds after the
// new primary took writes), and once an attempt succeeds, a job another
// process enqueued meanwhile runs at once: the reconnect wakes every
// domain (the backup poll is an hour).
func TestListenerRetriesEverySecond(t *testing.T) {
	requireFaults(t)
	const failures = 11
	e := newFEnv(t)
	var mu sync.Mutex
	var attempts []time.Time
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		n := len(attempts)
		mu.Unlock()
		if n <= failures {
			return nil, fmt.Errorf("attempt %d: %w", n, syscall.ECONNREFUSED)
		}
		return pgx.Connect(ctx, testdb.URL())
	}
	nAttempts := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts)
	}
	q := e.queue(e.pool("lr", 4, nil), "lr", backlog.WithListenConn(connect), backlog.WithPollInterval(time.Hour))
	// A probe enqueued before Work starts runs on its first claim: once it
	// has, the worker is idle and only the reconnect's wake-up (or an hour's
	// poll) makes it claim again.
	_, err := e.q.Enqueue(context.Background(), "lr.work", nil)
	require.NoError(t, err)
	ran := make(chan time.Time, 2)
	work(t, q, backlog.HandlerFunc(func(ctx context.Context, j *backlog.Job) error {
		select {
		case ran <- time.Now():
		default:
		}
		return nil
	}), backlog.Types("lr.work"))
	select {
	case <-ran:
	case <-time.After(time.Minute):
		t.Fatal("the probe job never ran")
	}
	eventually(t, 10*time.Second, 10*time.Millisecond, "two failed LISTEN connects", func() bool { return nAttempts() >= 2 })
	_, err = e.q.Enqueue(context.Background(), "lr.work", nil) // its NOTIFY is lost: nobody listens
	require.NoError(t, err)
	var at time.Time
	select {
	case at = <-ran:
	case <-time.After(time.Minute):
		t.Fatalf("the job never ran (%d connect attempts)", nAttempts())
	}
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, len(attempts), failures)
	var gaps durations
	for i := 1; i <= failures; i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]))
	}
	t.Logf("gaps between LISTEN connect attempts: %v; the job ran %s after the attempt that connected",
		gaps, at.Sub(attempts[failures]).Round(time.Millisecond))
	// Bounds with room for a busy machine, still well under the old 7.5 s
	// gaps; and a floor, so that a backoff that spins fails too.
	for i, g := range gaps {
		require.LessOrEqual(t, g, 3*time.Second, "gap %d between connect attempts (1 s bound, 1.5 s jittered)", i+1)
	}
	require.GreaterOrEqual(t, attempts[failures].Sub(attempts[0]), 2*time.Second, "the attempts did not back off: %v", gaps)
	require.True(t, at.After(attempts[failures]), "the job ran before the listener connected: nothing was tested")
	require.Less(t, at.Sub(attempts[failures]), 5*time.Second, "the reconnect did not wake the idle worker")
}

// TestListenerBacksOffAFlappingServer: the server takes the listener's
// connection and its LISTEN, then drops it at once, again and again (a
// flapping server, or a proxy in front of a dead primary). Each reconnect
// wakes every domain (a claim each), so the reconnects must back off as
// for refused connections (to about a second), not start over at 100 ms
// after every LISTEN that succeeded: the backoff starts over only after a
// session that lasted.
func TestListenerBacksOffAFlappingServer(t *testing.T) {
	requireFaults(t)
	const flaps = 8
	e := newFEnv(t)
	var mu sync.Mutex
	var attempts []time.Time
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		n := len(attempts)
		mu.Unlock()
		conn, err := pgx.Connect(ctx, testdb.URL())
		if err != nil || n > flaps {
			return conn, err
		}
		// Dropped by the server once its LISTEN is in.
		pid := conn.PgConn().PID()
		go func() {
			deadline := time.Now().Add(30 * time.Second)
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for ; time.Now().Before(deadline); <-tick.C {
				var listening bool
				if err := e.ctl.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
					WHERE pid = $1 AND query LIKE 'LISTEN %')`, pid).Scan(&listening); err != nil {
					return
				}
				if listening {
					_, _ = e.ctl.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
					return
				}
			}
		}()
		return conn, nil
	}
	nAttempts := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts)
	}
	q := e.queue(e.pool("lf", 4, nil), "lf", backlog.WithListenConn(connect), backlog.WithPollInterval(time.Hour))
	work(t, q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("lf.work"))
	eventually(t, 2*time.Minute, 10*time.Millisecond, "the connect after the flaps", func() bool { return nAttempts() > flaps })
	mu.Lock()
	defer mu.Unlock()
	var gaps durations
	for i := 1; i <= flaps; i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]))
	}
	t.Logf("gaps between LISTEN connects while the server dropped each session: %v", gaps)
	// Restarting at 100 ms (±50 %) after each flap, 8 reconnects take
	// about 1 s plus the time to see each LISTEN; backing off (100, 150,
	// 225, 337, 506, 759 ms, then 1 s, jittered ±50 %) at least 1.6 s.
	require.GreaterOrEqual(t, attempts[flaps].Sub(attempts[0]), 1800*time.Millisecond,
		"reconnects to a flapping server did not back off: %v", gaps)
}
