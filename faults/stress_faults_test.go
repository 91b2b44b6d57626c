package faults_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// The stress test's faults: the SIGKILLable child process, backends
// terminated by application_name, and (in the workload) transactions held
// open on a running prerequisite.

// stressChildEnv makes a child process (see childMain) a stress worker.
const stressChildEnv = "BACKLOG_FAULTS_STRESS_CHILD"

// stressQueueOpts are the options every stress Queue shares:
// stressQuickOpts with the stress test's short lease.
func stressQueueOpts() []backlog.Option {
	return append(stressQuickOpts(), backlog.WithLease(stressLease))
}

// stressQuickOpts are a quick sweep and quick retries, so that a run's
// expired leases and failed attempts settle within seconds; TestHAMixed's
// queues use them with the default lease.
func stressQuickOpts() []backlog.Option {
	return []backlog.Option{backlog.WithSweepInterval(500 * time.Millisecond),
		backlog.WithRetryBackoff(backlog.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond})}
}

// stressChildMain is the child's life: a NOTIFY-mode Queue on its own pool
// (application_name bf_<schema>_child, a termination target) working every
// stress type (eu-tagged and untagged workers), with the periodic schedule
// registered as @every 1s, until stdin closes.
func stressChildMain() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "stress child:", err)
		return 1
	}
	schema, worker := os.Getenv(childSchemaEnv), os.Getenv(childWorkerEnv)
	open := func(app string, conns int32) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(testdb.URL())
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = conns
		cfg.ConnConfig.RuntimeParams["application_name"] = "bf_" + schema + "_" + app
		return pgxpool.NewWithConfig(context.Background(), cfg)
	}
	pool, err := open("child", 8)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	logPool, err := open("childlog", 6)
	if err != nil {
		return fail(err)
	}
	defer logPool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := append(stressQueueOpts(), backlog.WithSchema(schema), backlog.WithWorkerID(worker),
		backlog.WithPollInterval(time.Second), backlog.WithLogger(log))
	q, err := backlog.New(context.Background(), pool, opts...)
	if err != nil {
		return fail(err)
	}
	defer q.Close()
	if err := q.Cron(stressTick, "@every 1s", stressTick, stressArgs{Via: "periodic"}); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // stdin EOF: the parent asks for a graceful stop
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, w := range []struct {
		conc int
		tags backlog.WorkerTags
	}{{4, backlog.WorkerTags{"region": "eu"}}, {2, nil}} {
		mux := newStressMux(logPool, schema, worker, w.tags)
		wg.Go(func() {
			errs <- q.Work(ctx, mux, backlog.Concurrency(w.conc), w.tags, backlog.GracePeriod(5*time.Second))
		})
	}
	fmt.Println("ready")
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fail(err)
		}
	}
	return 0
}

// killRec is one SIGKILL of the child.
type killRec struct {
	worker          string
	held            int // running jobs it held just before
	killed, reaped  time.Time
	waitedForAJob   time.Duration
	restartedWorker string
}

// stressChild runs the child worker process and replaces it after a kill.
type stressChild struct {
	s   *stress
	gen int
	c   *child
}

func (sc *stressChild) start() {
	sc.gen++
	sc.c = startChild(sc.s.t, sc.s.e.schema, fmt.Sprintf("child.%d", sc.gen), stressLease, time.Second, 1, stressChildEnv+"=1")
}

// kill waits (a while) until the child holds a running job, so the kill
// lands mid-job, SIGKILLs it and starts the next one.
func (sc *stressChild) kill() killRec {
	s := sc.s
	k := killRec{worker: sc.c.worker}
	began := time.Now()
	deadline := began.Add(10 * time.Second)
	for {
		k.held = s.e.count(`SELECT count(*) FROM `+s.e.table("jobs")+` WHERE state = 'running' AND worker = $1`, k.worker)
		if k.held > 0 || time.Now().After(deadline) || !s.pause(20*time.Millisecond) {
			break
		}
	}
	k.waitedForAJob = time.Since(began)
	k.killed = s.e.dbNow()
	sc.c.kill()
	k.reaped = s.e.dbNow()
	sc.start()
	k.restartedWorker = sc.c.worker
	return k
}

// stop asks the child to stop gracefully.
func (sc *stressChild) stop(t *testing.T) {
	if sc.c != nil {
		require.NoError(t, sc.c.stop(time.Minute), "graceful stop of %s", sc.c.worker)
		sc.c = nil
	}
}

// termRec is one round of pg_terminate_backend.
type termRec struct {
	at       time.Time
	targets  []string
	backends int
	tries    int
}

// terminate ends the backends of a random non-empty subset of the queues
// under fault (in-process NOTIFY queue, poll-only queue, child), trying
// again for a moment when none had a connection open.
func (s *stress) terminate(r *rand.Rand) termRec {
	all := []string{"qa", "qb", "child"}
	var tr termRec
	for _, who := range all {
		if r.IntN(2) == 0 {
			tr.targets = append(tr.targets, who)
		}
	}
	if len(tr.targets) == 0 {
		tr.targets = []string{all[r.IntN(len(all))]}
	}
	apps := make([]string, len(tr.targets))
	for i, who := range tr.targets {
		apps[i] = s.e.app(who)
	}
	for tr.tries < 20 {
		tr.tries++
		tr.at = s.e.dbNow()
		tr.backends = s.e.count(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = ANY($1) AND pid <> pg_backend_pid()`, apps)
		if tr.backends > 0 || !s.pause(50*time.Millisecond) {
			break
		}
	}
	return tr
}
