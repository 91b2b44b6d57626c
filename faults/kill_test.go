package faults_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// Worker child processes: this test binary re-executed with childEnv set.
const (
	childEnv       = "BACKLOG_FAULTS_CHILD"
	childSchemaEnv = "BACKLOG_FAULTS_CHILD_SCHEMA"
	childWorkerEnv = "BACKLOG_FAULTS_CHILD_WORKER"
	childLeaseEnv  = "BACKLOG_FAULTS_CHILD_LEASE"
	childSweepEnv  = "BACKLOG_FAULTS_CHILD_SWEEP"
	childConcEnv   = "BACKLOG_FAULTS_CHILD_CONCURRENCY"
	childHoldEnv   = "BACKLOG_FAULTS_CHILD_HOLD" // optional: each job runs this long (a duration)
	childEndsEnv   = "BACKLOG_FAULTS_CHILD_ENDS" // optional, "1": each handler records its end (stopped_at)
	childType      = "s1.work"
)

// childMain works childType jobs (each inserts its execution row) until
// its stdin closes, then stops gracefully and exits 0. The parent SIGKILLs
// it at random moments instead.
func childMain() int {
	if os.Getenv(stressChildEnv) == "1" {
		return stressChildMain()
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	schema, worker := os.Getenv(childSchemaEnv), os.Getenv(childWorkerEnv)
	lease, err := time.ParseDuration(os.Getenv(childLeaseEnv))
	if err != nil {
		return fail(err)
	}
	sweep, err := time.ParseDuration(os.Getenv(childSweepEnv))
	if err != nil {
		return fail(err)
	}
	conc, err := strconv.Atoi(os.Getenv(childConcEnv))
	if err != nil {
		return fail(err)
	}
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	if err != nil {
		return fail(err)
	}
	cfg.MaxConns = 6 // the handlers (4) use the pool too; leave room for claims, outcomes and heartbeats
	cfg.ConnConfig.RuntimeParams["application_name"] = "bf_" + schema + "_" + worker
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("worker", worker)
	q, err := backlog.New(context.Background(), pool, backlog.WithSchema(schema), backlog.WithWorkerID(worker),
		backlog.WithLease(lease), backlog.WithSweepInterval(sweep), backlog.WithPollInterval(time.Second),
		backlog.WithLogger(log))
	if err != nil {
		return fail(err)
	}
	defer q.Close()
	insert := `INSERT INTO ` + pgx.Identifier{schema, "executions"}.Sanitize() + ` (job_id, attempt, worker) VALUES ($1, $2, $3)`
	stopped := `UPDATE ` + pgx.Identifier{schema, "executions"}.Sanitize() + ` SET stopped_at = clock_timestamp()
		WHERE job_id = $1 AND attempt = $2 AND worker = $3`
	ends := os.Getenv(childEndsEnv) == "1"
	mux := backlog.NewMux()
	var hold time.Duration
	if h := os.Getenv(childHoldEnv); h != "" {
		if hold, err = time.ParseDuration(h); err != nil {
			return fail(err)
		}
	}
	mux.HandleFunc(childType, func(ctx context.Context, job *backlog.Job) error {
		if _, err := pool.Exec(ctx, insert, job.ID, job.Attempt, worker); err != nil {
			return err
		}
		if hold > 0 { // the job's work: it holds its slot this long
			select {
			case <-time.After(hold):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if ends { // the last thing the handler does
			if _, err := pool.Exec(context.WithoutCancel(ctx), stopped, job.ID, job.Attempt, worker); err != nil {
				return err
			}
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // stdin EOF: the parent asks for a graceful stop
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	fmt.Println("ready")
	if err := q.Work(ctx, mux, backlog.Concurrency(conc), backlog.GracePeriod(5*time.Second)); err != nil {
		return fail(err)
	}
	return 0
}

// child is one running worker process.
type child struct {
	worker string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{} // closed when the process has exited and been reaped
	err    error         // Wait's result, once done
}

// startChild starts a worker process; extraEnv (NAME=value) is added to
// its environment.
func startChild(t testing.TB, schema, worker string, lease, sweep time.Duration, conc int, extraEnv ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childSchemaEnv+"="+schema, childWorkerEnv+"="+worker,
		childLeaseEnv+"="+lease.String(), childSweepEnv+"="+sweep.String(), childConcEnv+"="+strconv.Itoa(conc),
		"DATABASE_URL="+testdb.URL())
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stderr = prefixWriter{t: t, prefix: worker + ": "}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{worker: worker, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() && sc.Text() == "ready" {
			close(ready)
		}
		_, _ = io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.done)
	}()
	select {
	case <-ready:
	case <-c.done:
		t.Fatalf("worker %s exited before it was ready: %v", worker, c.err)
	case <-time.After(30 * time.Second):
		t.Fatalf("worker %s not ready within 30s", worker)
	}
	return c
}

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop asks for a graceful stop and waits for the exit status.
func (c *child) stop(within time.Duration) error {
	_ = c.stdin.Close()
	select {
	case <-c.done:
		return c.err
	case <-time.After(within):
		c.kill()
		return fmt.Errorf("worker %s did not stop within %s", c.worker, within)
	}
}

// prefixWriter passes a child's stderr lines to t.Log.
type prefixWriter struct {
	t      testing.TB
	prefix string
}

func (w prefixWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(p), nil
}

// TestWorkerProcessesKilled: three worker processes work 20,000 jobs; every
// 1-2 s a random one is SIGKILLed and replaced. Every job completes; a job
// runs again only when a killed process had run it, and only after the
// kill.
func TestWorkerProcessesKilled(t *testing.T) {
	requireFaults(t)
	const (
		jobs    = 20000
		workers = 3
		lease   = 2 * time.Second
		sweep   = 5 * time.Second // WithSweepInterval's default; the sweep times itself to the earliest lease expiry
		conc    = 4
	)
	e := newFEnv(t)
	ctx := context.Background()
	for i := 0; i < jobs; i += 1000 {
		specs := make([]backlog.JobSpec, 1000)
		for k := range specs {
			specs[k] = backlog.JobSpec{Type: childType, Args: map[string]int{"n": i + k}}
		}
		_, err := e.q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
	}

	// worker -> database clock just before SIGKILL and just after it was reaped
	killedAt, reapedAt := map[string]time.Time{}, map[string]time.Time{}
	gen := 0
	slots := make([]*child, workers)
	spawn := func(slot int) {
		gen++
		slots[slot] = startChild(t, e.schema, fmt.Sprintf("w%d.%d", slot, gen), lease, sweep, conc)
	}
	for i := range slots {
		spawn(i)
	}
	t.Cleanup(func() {
		for _, c := range slots {
			if c != nil {
				c.kill()
			}
		}
	})

	completed := func() int {
		return e.count(`SELECT count(*) FROM ` + e.table("all_jobs") + ` WHERE state = 'completed'`)
	}
	start := time.Now()
	deadline := time.NewTimer(4 * time.Minute)
	defer deadline.Stop()
	check := time.NewTicker(100 * time.Millisecond)
	defer check.Stop()
	nextKill := time.NewTimer(time.Second + rand.N(time.Second))
	defer nextKill.Stop()
	kills := 0
	midJob := 0 // kills of a process that held a running job at that moment
loop:
	for {
		select {
		case <-deadline.C:
			t.Fatalf("only %d of %d jobs completed within 4m (%d kills)", completed(), jobs, kills)
		case <-check.C:
			if completed() == jobs {
				break loop
			}
		case <-nextKill.C:
			slot := rand.N(workers)
			c := slots[slot]
			killedAt[c.worker] = e.dbNow()
			held := e.count(`SELECT count(*) FROM `+e.table("jobs")+` WHERE state = 'running' AND worker = $1`, c.worker)
			c.kill()
			reapedAt[c.worker] = e.dbNow()
			kills++
			if held > 0 {
				midJob++
			}
			t.Logf("killed %s holding %d running jobs (%d/%d jobs completed)", c.worker, held, completed(), jobs)
			spawn(slot)
			nextKill.Reset(time.Second + rand.N(time.Second))
		}
	}
	elapsed := time.Since(start)
	require.Positive(t, kills, "no worker process was killed")
	require.Positive(t, midJob, "none of the %d kills hit a process holding a running job", kills)
	for i, c := range slots {
		require.NoError(t, c.stop(30*time.Second), "graceful stop of %s", c.worker)
		slots[i] = nil
	}

	l := e.ledger()
	require.Len(t, l.jobs, jobs)
	l.requireCompletedOnceNoAttemptTwice(t, childType)

	// Re-executions only for jobs a killed process had run, after its kill.
	// A killed process's last statements may still be executed by its
	// server backend after the process died (they were already sent), so an
	// execution row of a killed worker may carry a time shortly after the
	// kill: that slack is measured and bounded, and never reaches the
	// re-execution, which needs the lease to expire first.
	var slack time.Duration
	dups := l.duplicates()
	for _, j := range dups {
		for i, x := range j.Execs[:len(j.Execs)-1] {
			k, killed := killedAt[x.Worker]
			require.True(t, killed, "job %s ran again although its earlier executor %s was never killed: %+v", j.ID, x.Worker, j.Execs)
			slack = max(slack, x.Started.Sub(reapedAt[x.Worker]))
			require.Less(t, x.Started.Sub(reapedAt[x.Worker]), lease/2,
				"job %s: execution by %s long after its kill (%s, reaped %s): %+v", j.ID, x.Worker, k, reapedAt[x.Worker], j.Execs)
			require.Contains(t, j.errorOf(x.Attempt), "lease expired: worker "+x.Worker, "job %s: attempt %d", j.ID, x.Attempt)
			// The lease was set at the claim, which may precede the kill by
			// up to a lease, so the kill time bounds nothing; what must hold
			// is that the next attempt began only after the sweep found this
			// attempt's lease expired (both on the database clock).
			sweptAt := j.errorAtOf(x.Attempt)
			require.True(t, j.Execs[i+1].Started.After(sweptAt),
				"job %s ran again (%s) before the sweep expired %s's lease (%s): %+v", j.ID, j.Execs[i+1].Started, x.Worker, sweptAt, j.Execs)
		}
	}
	// Every expired lease belonged to a killed process. Recovery delay: from
	// the kill to the sweep that made its job available again (the error's
	// time), and to the job's next execution (which also waits its turn
	// behind the backlog: the sweep sets run_at = now()).
	var released, rerun durations
	expired := 0
	for _, j := range l.jobs {
		for _, ae := range j.Errors {
			w, ok := strings.CutPrefix(ae.Error, "lease expired: worker ")
			require.True(t, ok, "job %s: unexpected error %q", j.ID, ae.Error)
			w = strings.TrimSuffix(w, " stopped renewing it")
			k, killed := killedAt[w]
			require.True(t, killed, "job %s: the lease of live worker %s expired", j.ID, w)
			expired++
			released = append(released, ae.At.Sub(k))
			for _, x := range j.Execs {
				if x.Attempt > ae.Attempt {
					rerun = append(rerun, x.Started.Sub(k))
					break
				}
			}
		}
	}
	require.Positive(t, expired, "no lease of a killed process expired: the sweep recovered nothing")
	t.Logf("%d jobs in %s, %d kills, %d executions, %d re-executed jobs, %d expired leases (claimed by a killed process); "+
		"kill → swept (available again): %s; kill → orphaned job runs again: %s; killed process's statements landed up to %s after it was reaped",
		jobs, elapsed.Round(time.Millisecond), kills, l.execs, len(dups), expired, released, rerun, slack.Round(time.Millisecond))
	report(t, summaryRow{
		Scenario: fmt.Sprintf("1. worker processes SIGKILLed (3 procs, lease %s, sweep at most every %s, else timed to the earliest lease expiry)", lease, sweep),
		Jobs:     jobs,
		Faults:   fmt.Sprintf("%d SIGKILLs (every 1-2 s; %d of a process holding running jobs), each replaced", kills, midJob),
		Lost:     jobs - l.states["completed"],
		Duplicates: fmt.Sprintf("%d jobs ran twice (%d executions for %d jobs): each had run on a process that was then killed before its outcome was written; %d leases expired, all of killed processes",
			len(dups), l.execs, jobs, expired),
		Pickup: fmt.Sprintf("kill → orphaned jobs available again (lease + the sweep after it): %s; → running again (behind the backlog): %s", released, rerun),
	})
}
