package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// Environment of the randomized stress test.
const (
	// stressSeedEnv replays a run's workload (the interleaving with the
	// faults and the scheduler is never the same twice).
	stressSeedEnv = "BACKLOG_STRESS_SEED"
	// stressDurationEnv sets how long jobs are enqueued and faults
	// injected (a Go duration); the default keeps the test near 2 minutes.
	stressDurationEnv = "BACKLOG_STRESS_DURATION"
	stressDefault     = 100 * time.Second
)

// stress is one run of TestStress: the queues under test and what the
// workload and the faults did.
type stress struct {
	t      testing.TB
	e      *fenv
	seed   uint64
	dur    time.Duration
	qa, qb *backlog.Queue // in-process queues under fault (NOTIFY; poll-only)
	qaPool *pgxpool.Pool
	stop   chan struct{} // closed when the workload stops
	waitWG sync.WaitGroup
	// waitCtx bounds the Wait calls; cancelWaits ends them early when the
	// test fails.
	waitCtx     context.Context
	cancelWaits context.CancelFunc
	seq         atomic.Int64

	mu            sync.Mutex
	recs          []*enqRec
	recent        []uuid.UUID // acknowledged jobs that must finish: prerequisites, cancels, waits
	cancels       []cancelRec
	waits         []waitRec
	helds         []heldRec
	uniqueSamples int
	uniqueDups    []string
	// sampleErrs counts the unique-key samples that failed; they fail the
	// test unless tolerateSampleErrs (TestHAMixed: no primary for seconds
	// at each failover).
	sampleErrs         int
	tolerateSampleErrs bool
	// logDB and logTable hold the handlers' execution log (default: the
	// control pool and the scenario schema's stress_exec; TestHAMixed
	// keeps it on a server no failover touches).
	logDB    *pgxpool.Pool
	logTable string
	// The fault driver's (test goroutine only).
	kills []killRec
	terms []termRec
}

// TestStress runs a random mix of everything backlog does, under faults,
// then checks invariants from the database and an execution log written
// by the handlers.
//
// Queues on one schema, each with its own pool as separate processes
// would have: qa (NOTIFY), qb (poll-only), qh (runs the prerequisites of
// held-open transactions; never faulted), two schedule-only queues, and a
// child process (NOTIFY) that is SIGKILLed and restarted. The workload
// enqueues with Enqueue, EnqueueMany and EnqueueTx (committed, rolled
// back, held open) through faulted and unfaulted queues, with tags,
// dependencies (diamonds, failing prerequisites), ordering keys, unique
// keys, delays and run-at times; handlers complete (with results, some
// invalid), fail, fail permanently, snooze, panic, time out and ignore
// their context, or run past the lease. Jobs are cancelled as they arrive
// and waited for. One periodic schedule is registered on three queues.
func TestStress(t *testing.T) {
	requireFaults(t)
	s := &stress{t: t, seed: uint64(time.Now().UnixNano()), dur: stressDefault, stop: make(chan struct{})}
	s.waitCtx, s.cancelWaits = context.WithCancel(context.Background())
	defer s.cancelWaits()
	if v := os.Getenv(stressSeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "%s", stressSeedEnv)
		s.seed = seed
	}
	if v := os.Getenv(stressDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "%s", stressDurationEnv)
		s.dur = d
	}
	fmt.Fprintf(os.Stderr, "=== stress: seed %d, %s of workload and faults (%s=%d replays the workload; %s=10m runs longer)\n",
		s.seed, s.dur, stressSeedEnv, s.seed, stressDurationEnv)
	t.Logf("seed %d (%s=%d replays this workload), workload %s", s.seed, stressSeedEnv, s.seed, s.dur)

	ctx := context.Background()
	s.e = newFEnv(t)
	e := s.e
	require.NoError(t, createStressExec(ctx, e.ctl, e.schema))
	logPool := e.pool("log", 16, nil) // the handlers' execution log: no fault touches it
	s.qaPool = e.pool("qa", 12, nil)
	qbPool := e.pool("qb", 10, nil)
	opts := func(more ...backlog.Option) []backlog.Option { return append(stressQueueOpts(), more...) }
	s.qa = e.queue(s.qaPool, "qa", opts(backlog.WithPollInterval(time.Second))...)
	s.qb = e.queue(qbPool, "qb", opts(backlog.WithPollOnly(), backlog.WithPollInterval(200*time.Millisecond),
		backlog.WithPollJitter(50*time.Millisecond))...)
	qh := e.queue(e.pool("qh", 4, nil), "qh", opts(backlog.WithPollInterval(time.Second))...)
	// Schedule-only queues, closed first at the end to stop the schedule.
	qaSched := e.queue(s.qaPool, "qa-sched", opts()...)
	qbSched := e.queue(qbPool, "qb-sched", opts(backlog.WithPollOnly())...)
	periodic := stressArgs{Via: "periodic"}
	require.NoError(t, qaSched.Every(stressTick, time.Second, stressTick, periodic))
	require.NoError(t, qbSched.Cron(stressTick, "@every 1s", stressTick, periodic))

	// Every job's tags are matched by an in-process worker: untagged (qa,
	// qb), region=eu (qa), region=us and region=us,gpu=yes (qb).
	var stops []func() error
	for _, w := range []struct {
		q    *backlog.Queue
		who  string
		conc int
		tags backlog.WorkerTags
	}{
		{s.qa, "qa", 6, nil},
		{s.qa, "qa", 4, backlog.WorkerTags{"region": "eu"}},
		{s.qb, "qb", 4, backlog.WorkerTags{"region": "us", "gpu": "yes"}},
		{s.qb, "qb", 3, nil},
		{qh, "qh", 2, backlog.WorkerTags{"held": "yes"}},
	} {
		stops = append(stops, work(t, w.q, newStressMux(logPool, e.schema, w.who, w.tags), backlog.Concurrency(w.conc), w.tags))
	}
	sc := &stressChild{s: s}
	sc.start()
	t.Cleanup(func() {
		if sc.c != nil {
			sc.c.kill()
		}
	})

	// The workload, one random stream per goroutine.
	var wg sync.WaitGroup
	for i, f := range []func(*rand.Rand){s.enqueueSingles, s.enqueueSingles, s.enqueueBatches, s.enqueueTxs,
		s.enqueueOrdered, s.cancelJobs, s.waitJobs, s.holdTransactions} {
		r := rand.New(rand.NewPCG(s.seed, uint64(i+1)))
		wg.Go(func() { f(r) })
	}
	wg.Go(s.sampleUnique)
	var stopOnce sync.Once
	stopWorkload := func() {
		stopOnce.Do(func() { close(s.stop) })
		wg.Wait()
	}
	t.Cleanup(func() { // when the test fails early: before the queues close
		stopWorkload()
		s.cancelWaits()
		s.waitWG.Wait()
	})

	// The faults, from this goroutine (starting a child needs it).
	r := rand.New(rand.NewPCG(s.seed, 0))
	jitter := func(from, to time.Duration) time.Duration { return from + time.Duration(r.Int64N(int64(to-from))) }
	end := time.NewTimer(s.dur)
	nextKill := time.NewTimer(jitter(6*time.Second, 12*time.Second))
	nextTerm := time.NewTimer(jitter(2*time.Second, 5*time.Second))
	start := time.Now()
loop:
	for {
		select {
		case <-end.C:
			break loop
		case <-nextKill.C:
			k := sc.kill()
			s.kills = append(s.kills, k)
			t.Logf("SIGKILLed %s holding %d running jobs (waited %s for one), started %s",
				k.worker, k.held, k.waitedForAJob.Round(time.Millisecond), k.restartedWorker)
			nextKill.Reset(jitter(6*time.Second, 12*time.Second))
		case <-nextTerm.C:
			tr := s.terminate(r)
			s.terms = append(s.terms, tr)
			t.Logf("terminated %d backends of %v (try %d)", tr.backends, tr.targets, tr.tries)
			nextTerm.Reset(jitter(2*time.Second, 5*time.Second))
		}
	}
	nextKill.Stop()
	nextTerm.Stop()
	stopWorkload()
	t.Logf("workload stopped after %s; %d enqueue calls", time.Since(start).Round(time.Millisecond), len(s.recs))

	// Quiesce: stop the schedule and the child, let everything settle.
	require.NoError(t, qaSched.Close())
	require.NoError(t, qbSched.Close())
	sc.stop(t)
	settleStart := time.Now()
	settled := s.settle(3 * time.Minute)
	settleTook := time.Since(settleStart)
	s.waitWG.Wait()
	for _, stop := range stops {
		require.NoError(t, stop())
	}
	t.Logf("settled: %v after %s", settled, settleTook.Round(time.Millisecond))

	d := s.load()
	v := &violations{}
	d.check(v)
	v.report(t)
	st := d.stats
	waitRetries := 0
	for _, w := range s.waits {
		waitRetries += len(w.retried)
	}
	require.Zero(t, waitRetries, "Wait returned a transient error instead of polling through it")
	t.Logf("%d jobs (%v), %d executions (%v), %d periodic plans; re-runs: %v; a killed child held an outcome unwritten for up to %s",
		len(d.jobs), counts(d.states), d.execs, counts(d.planned), st.plans, counts(st.reruns), st.unwrittenAtKill.Round(time.Millisecond))
	report(t, summaryRow{
		Scenario: fmt.Sprintf("7. randomized stress (seed %d, %s): NOTIFY + poll-only queues and a SIGKILLed child; "+
			"every enqueue path, outcome and option; cancels, waits, a schedule on 3 queues", s.seed, s.dur),
		Jobs: len(d.jobs),
		Faults: fmt.Sprintf("%d pg_terminate_backend rounds (%d backends), %d SIGKILLs (%d mid-job), %d transactions held open on a running prerequisite (%d finished meanwhile), %d cancels, %d waits",
			len(s.terms), st.terminated, len(s.kills), st.midJobKills, len(s.helds), st.heldWaited, len(s.cancels), len(s.waits)),
		Lost:       st.lost,
		Duplicates: fmt.Sprintf("%d re-executions, each justified (%s); none of one (job, attempt) overlapped", st.rerunTotal, counts(st.reruns)),
		Pickup: fmt.Sprintf("workload stopped → every job settled: %s (%d legitimately still waiting: due in an hour, or blocked behind one)",
			settleTook.Round(time.Millisecond), st.legitLive),
	})
}

// counts formats a tally, largest first.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return m[keys[a]] > m[keys[b]] || m[keys[a]] == m[keys[b]] && keys[a] < keys[b] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}

// settle waits until every live job is legitimately waiting (due far in
// the future, or blocked behind such a job) and reports whether that
// happened in time.
func (s *stress) settle(within time.Duration) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		n := s.e.count(`WITH RECURSIVE legit AS (
			SELECT id FROM ` + s.e.table("jobs") + ` WHERE state IN ('scheduled', 'available') AND run_at > now() + interval '10 minutes'
			UNION SELECT e.job FROM ` + s.e.table("job_edges") + ` e JOIN legit l ON e.prereq = l.id)
		SELECT count(*) FROM ` + s.e.table("jobs") + ` WHERE state IN ('blocked', 'scheduled', 'available', 'running')
			AND id NOT IN (SELECT id FROM legit)`)
		if n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			s.t.Errorf("%d jobs still live (not legitimately) %s after the workload stopped", n, within)
			return false
		}
		<-tick.C
	}
}
