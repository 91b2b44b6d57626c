package backlog_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// waitProcesses polls q.Processes until cond holds or the deadline passes,
// and returns the last list.
func waitProcesses(t *testing.T, q *backlog.Queue, within time.Duration, what string, cond func([]backlog.ProcessInfo) bool) []backlog.ProcessInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ps, err := q.Processes(context.Background())
		require.NoError(t, err)
		if cond(ps) {
			return ps
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes: %s: not within %s; last: %+v", what, within, ps)
		}
		<-tick.C
	}
}

func process(ps []backlog.ProcessInfo, worker string) *backlog.ProcessInfo {
	for i := range ps {
		if ps[i].WorkerID == worker {
			return &ps[i]
		}
	}
	return nil
}

// Two processes (separate pools), each running Work calls, are listed with
// their Work calls and running counts, seen from a Queue that runs none; a
// Work call that returns drops out of its process's row, and Close removes
// the row.
func TestProcessesListsWorkCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	lease := 3 * time.Second // a heartbeat a second
	q1 := e.queue(testdb.NewPool(t, 4), backlog.WithWorkerID("proc-1"), backlog.WithLease(lease))
	q2 := e.queue(testdb.NewPool(t, 4), backlog.WithWorkerID("proc-2"), backlog.WithLease(lease))

	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	started := make(chan struct{}, 10)
	mux := backlog.NewMux()
	block := func(ctx context.Context, job *backlog.Job) error {
		started <- struct{}{}
		<-release
		return nil
	}
	mux.HandleFunc("proc.b", block)
	mux.HandleFunc("proc.a", block)
	work(t, q1, mux, backlog.Concurrency(3), backlog.Prefetch(5), backlog.WorkerTags{"region": "eu"})
	stopC := work(t, q1, backlog.HandlerFunc(block), backlog.Types("proc.c"), backlog.Concurrency(1), backlog.Prefetch(0))
	work(t, q2, backlog.HandlerFunc(block), backlog.Types("proc.d"), backlog.Concurrency(2))
	t.Cleanup(done) // before the Work calls stop, should the test fail

	for range 2 {
		_, err := e.q.Enqueue(ctx, "proc.a", nil, backlog.Tags{"region": "eu"})
		require.NoError(t, err)
	}
	for range 2 {
		<-started
	}

	// e.q runs no Work call: it lists the others, and not itself.
	ps := waitProcesses(t, e.q, 10*time.Second, "both listed, proc-1 running 2", func(ps []backlog.ProcessInfo) bool {
		p1 := process(ps, "proc-1")
		return len(ps) == 2 && p1 != nil && len(p1.Works) == 2 && p1.Running == 2 && process(ps, "proc-2") != nil
	})
	host, _ := os.Hostname()
	p1, p2 := process(ps, "proc-1"), process(ps, "proc-2")
	require.Equal(t, host, p1.Host)
	require.Equal(t, os.Getpid(), p1.PID)
	require.Equal(t, lease, p1.Lease)
	require.False(t, p1.StartedAt.After(p1.HeartbeatAt))
	require.Equal(t, 2, p1.Leased, "its two running jobs, nothing prefetched")
	require.ElementsMatch(t, []backlog.WorkInfo{ // in the order they started, which is the goroutines'
		{Types: []string{"proc.a", "proc.b"}, Tags: map[string]string{"region": "eu"}, Concurrency: 3, Prefetch: 5, Running: 2},
		{Types: []string{"proc.c"}, Concurrency: 1, Prefetch: 0},
	}, p1.Works)
	require.Equal(t, []backlog.WorkInfo{{Types: []string{"proc.d"}, Concurrency: 2, Prefetch: backlog.DefaultPrefetch}}, p2.Works)
	require.Equal(t, 0, p2.Running)

	// A row deleted under a busy process (as the cleaner would after a
	// stall longer than three leases) is written again by its next
	// heartbeat, with the same start time.
	_, err := e.pool.Exec(ctx, `DELETE FROM "`+e.schema+`".processes WHERE worker = 'proc-1'`)
	require.NoError(t, err)
	ps = waitProcesses(t, e.q, 10*time.Second, "proc-1 back", func(ps []backlog.ProcessInfo) bool {
		return process(ps, "proc-1") != nil
	})
	require.True(t, process(ps, "proc-1").StartedAt.Equal(p1.StartedAt))
	require.Equal(t, 2, process(ps, "proc-1").Running)

	// A Work call that returns leaves the row at once (no heartbeat needed).
	require.NoError(t, stopC())
	ps = waitProcesses(t, e.q, 5*time.Second, "proc.c gone", func(ps []backlog.ProcessInfo) bool {
		p := process(ps, "proc-1")
		return p != nil && len(p.Works) == 1
	})
	require.Equal(t, []string{"proc.a", "proc.b"}, process(ps, "proc-1").Works[0].Types)
	startedAt := process(ps, "proc-1").StartedAt
	require.True(t, startedAt.Equal(p1.StartedAt), "started_at stays")

	// Handlers done: the next heartbeat reports none running.
	done()
	waitProcesses(t, e.q, 5*time.Second, "proc-1 idle", func(ps []backlog.ProcessInfo) bool {
		p := process(ps, "proc-1")
		return p != nil && p.Running == 0 && p.Works[0].Running == 0 && p.Leased == 0
	})

	// Close removes the row before it returns.
	require.NoError(t, q2.Close())
	ps, err = e.q.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, "proc-1", ps[0].WorkerID)
	require.NoError(t, q1.Close())
	require.Zero(t, e.countTable("processes"))
}

// countTable counts the rows of one of the schema's tables.
func (e *env) countTable(table string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+e.schema+`".`+table).Scan(&n))
	return n
}

// A process killed with SIGKILL stops heartbeating: it drops out of the
// list three of its leases after its last heartbeat, and the cleaner
// deletes its row.
func TestDeadProcessDropsOutAndIsCleaned(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	e := newEnv(t)
	ctx := context.Background()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childSchemaEnv+"="+e.schema, "DATABASE_URL="+testdb.URL())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() { // drains the child's output; ends when it dies
		sc := bufio.NewScanner(out)
		for sc.Scan() {
		}
	}()

	ps := waitProcesses(t, e.q, 30*time.Second, "the child listed", func(ps []backlog.ProcessInfo) bool {
		return process(ps, "child") != nil
	})
	child := process(ps, "child")
	require.Equal(t, cmd.Process.Pid, child.PID)
	require.Equal(t, time.Second, child.Lease)
	require.Equal(t, []backlog.WorkInfo{{Types: []string{"crash.block"}, Concurrency: 1, Prefetch: backlog.DefaultPrefetch}}, child.Works)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	var last time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT heartbeat_at FROM "`+e.schema+`".processes WHERE worker = 'child'`).Scan(&last))
	waitProcesses(t, e.q, 15*time.Second, "the child gone", func(ps []backlog.ProcessInfo) bool {
		return process(ps, "child") == nil
	})
	var now time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT now()`).Scan(&now))
	require.GreaterOrEqual(t, now.Sub(last), 3*time.Second, "listed until three leases after its last heartbeat")
	require.Equal(t, 1, e.countTable("processes"), "not listed, but not yet cleaned")

	res, err := e.q.Clean(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Processes)
	require.Zero(t, e.countTable("processes"))
}

// The dead-process rule uses each process's own lease, and the
// maintenance loop of any Work process cleans dead rows.
func TestDeadProcessRuleUsesItsOwnLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO "`+e.schema+`".processes
		(worker, instance, host, pid, started_at, heartbeat_at, lease_ms, works, running, leased) VALUES
		('short', 'x', 'h', 1, now() - interval '1 hour', now() - interval '10 seconds', 1000, '[]', 0, 0),
		('long',  'y', 'h', 2, now() - interval '1 hour', now() - interval '10 seconds', 30000, '[]', 0, 0)`)
	require.NoError(t, err)
	ps, err := e.q.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, ps, 1, "10 s without a heartbeat: dead with a 1 s lease, alive with 30 s")
	require.Equal(t, "long", ps[0].WorkerID)
	require.Empty(t, ps[0].Works)

	q := e.queue(e.pool, backlog.WithCleanInterval(50*time.Millisecond))
	work(t, q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("noop"))
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for e.countTable(`processes WHERE worker = 'short'`) > 0 {
		require.True(t, time.Now().Before(deadline), "the maintenance loop cleans the dead row")
		<-tick.C
	}
	require.Equal(t, 1, e.countTable(`processes WHERE worker = 'long'`))
}

// Two live processes given one worker ID do not overwrite each other's
// row: the first keeps it until it closes, then the second takes over.
func TestProcessWorkerIDClash(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lease := 3 * time.Second
	q1 := e.queue(testdb.NewPool(t, 3), backlog.WithWorkerID("same"), backlog.WithLease(lease))
	q2 := e.queue(testdb.NewPool(t, 3), backlog.WithWorkerID("same"), backlog.WithLease(lease))
	noop := backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil })
	work(t, q1, noop, backlog.Types("first"))
	waitProcesses(t, e.q, 10*time.Second, "the first listed", func(ps []backlog.ProcessInfo) bool {
		return len(ps) == 1 && ps[0].Works[0].Types[0] == "first"
	})
	work(t, q2, noop, backlog.Types("second"))
	// Two heartbeats of the second later, the row is still the first's.
	var hb time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT heartbeat_at + interval '2.2 seconds' FROM "`+e.schema+`".processes`).Scan(&hb))
	waitProcesses(t, e.q, 10*time.Second, "the first heartbeats on", func(ps []backlog.ProcessInfo) bool {
		require.Len(t, ps, 1)
		require.Equal(t, "first", ps[0].Works[0].Types[0])
		return ps[0].HeartbeatAt.After(hb)
	})
	require.NoError(t, q1.Close())
	waitProcesses(t, e.q, 10*time.Second, "the second takes over", func(ps []backlog.ProcessInfo) bool {
		return len(ps) == 1 && ps[0].Works[0].Types[0] == "second"
	})
}

func TestProcessesAfterCloseAndUnmigrated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := e.queue(e.pool)
	require.NoError(t, q.Close())
	_, err := q.Processes(context.Background())
	require.ErrorIs(t, err, backlog.ErrClosed)

	fresh, err := backlog.New(context.Background(), e.pool, backlog.WithSchema(testdb.Schema(t)), backlog.WithLogger(logger(t)))
	require.NoError(t, err)
	defer fresh.Close()
	_, err = fresh.Processes(context.Background())
	require.ErrorIs(t, err, backlog.ErrNotMigrated)
}
