package faults_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/hacluster"
	"github.com/backlogq/backlog/internal/testdb"
)

// haSeedEnv replays a TestHAMixed run's workload (the interleaving with
// the failovers is never the same twice).
const haSeedEnv = "BACKLOG_HA_SEED"

// haLimited is the job type TestHAMixed puts under a concurrency limit,
// and haLimit the limit.
const (
	haLimited = "st.c"
	haLimit   = 2
)

// TestHAMixed runs the stress test's mixed workload against a
// pg_auto_failover cluster (a primary and two standbys, one of them
// synchronous for every commit) through a multi-host URL with
// target_session_attrs=read-write, across two failovers: the primary's
// node killed with SIGKILL, and, once the killed node has rejoined, a
// controlled switchover.
//
// Three worker processes (goroutines of this process, each with a Queue
// and a pool of its own, as separate processes would have; all LISTEN)
// run every stress job type with the stress handler (plain jobs, retries,
// panics, timeouts, snoozes, long jobs); st.c is under a concurrency limit
// of 2. Producers enqueue with EnqueueTx (committed and rolled back, with
// dependencies on earlier jobs), Enqueue (unique keys, dependencies, jobs
// due in an hour), EnqueueMany (DAG diamonds, failing prerequisites) and
// Enqueue with ordering keys from one goroutine, recording every call and
// whether the database acknowledged it. Two schedule-only queues run a
// periodic schedule (every second). The handlers log every execution to
// a table on the test server (DATABASE_URL), which no failover touches.
//
// Afterwards the stress test's invariants are checked from the database
// and that log: every acknowledged job exists and is terminal (or
// legitimately waiting), no attempt ran twice or overlapped, every re-run
// has a reason, ordering keys never overlap and keep their order, never
// two live jobs of one unique key, dependents start only after their
// prerequisites completed, one periodic job per plan time; and the
// limited type never ran more than its limit at once.
func TestHAMixed(tt *testing.T) {
	requireHA(tt)
	t := recordFailures(tt) // first: its cleanup runs last
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(haSeedEnv); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "%s", haSeedEnv)
	}
	fmt.Fprintf(os.Stderr, "=== HA mixed workload: seed %d (%s=%d replays the workload)\n", seed, haSeedEnv, seed)
	t.Logf("seed %d (%s=%d replays this workload)", seed, haSeedEnv, seed)

	began := time.Now()
	cl := hacluster.Start(t, os.Getenv(ciEnv) == "1")
	t.Logf("cluster up in %s: %s", time.Since(began).Round(time.Millisecond), cl.URL())
	ssn, err := cl.SynchronousStandbyNames(ctx)
	require.NoError(t, err)
	t.Logf("synchronous_standby_names on the primary: %q", ssn)

	// The execution log, on the test server.
	logPool := testdb.Pool(t)
	logSchema := testdb.Schema(t) // a name, dropped at cleanup
	_, err = logPool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{logSchema}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, createStressExec(ctx, logPool, logSchema))

	logs := &logCollector{t: t, began: began}
	tr := &tracer{began: began, errs: map[string]*errCount{}}
	newPool := func(app string, maxConns int32) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(cl.URL())
		require.NoError(t, err)
		cfg.MaxConns = maxConns
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.ConnConfig.Tracer = tr.of(app)
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	newQueue := func(pool *pgxpool.Pool, who string, more ...backlog.Option) *backlog.Queue {
		// The stress test's quick sweep and retries, with the default
		// lease (30 s), which outlasts most failovers (10-27 s on the
		// 2-core machine), so that running jobs keep their leases across
		// the gap.
		opts := append(append(stressQuickOpts(), backlog.WithLogger(slog.New(logs.with(who))), backlog.WithWorkerID(who)), more...)
		q, err := backlog.New(ctx, pool, opts...)
		require.NoError(t, err)
		t.Cleanup(func() {
			if err := q.Close(); err != nil {
				t.Errorf("closing %s's queue: %v", who, err)
			}
		})
		return q
	}

	ctl := newPool("ha_control", 8)
	s := &stress{t: t, seed: seed, stop: make(chan struct{}), tolerateSampleErrs: true,
		logDB: logPool, logTable: pgx.Identifier{logSchema, stressExecTable}.Sanitize()}
	s.waitCtx, s.cancelWaits = context.WithCancel(ctx)
	defer s.cancelWaits()
	s.e = &fenv{t: t, schema: backlog.DefaultSchema, ctl: ctl}
	s.e.q = newQueue(newPool("ha_producer", 8), "producer")
	require.NoError(t, s.e.q.Migrate(ctx))
	require.NoError(t, s.e.q.SetLimit(ctx, haLimited, backlog.Limit{Concurrency: haLimit}))

	// Three worker processes; between them they match every tag set of
	// the workload.
	type proc struct {
		who  string
		pool *pgxpool.Pool
		q    *backlog.Queue
	}
	procs := make([]proc, 3)
	for i := range procs {
		who := fmt.Sprintf("w%d", i+1)
		pool := newPool("ha_"+who, 10)
		procs[i] = proc{who, pool, newQueue(pool, who)}
	}
	s.qa, s.qaPool, s.qb = procs[0].q, procs[0].pool, procs[1].q
	var stops []func() error
	for _, w := range []struct {
		p    proc
		conc int
		tags backlog.WorkerTags
	}{
		{procs[0], 4, nil},
		{procs[0], 3, backlog.WorkerTags{"region": "eu"}},
		{procs[1], 3, backlog.WorkerTags{"region": "us", "gpu": "yes"}},
		{procs[1], 4, nil},
		{procs[2], 4, nil},
		{procs[2], 2, backlog.WorkerTags{"region": "eu"}},
		{procs[2], 2, backlog.WorkerTags{"region": "us", "gpu": "yes"}},
	} {
		stops = append(stops, work(t, w.p.q, newStressMux(logPool, logSchema, w.p.who, w.tags), backlog.Concurrency(w.conc), w.tags))
	}
	// The periodic schedule, registered by two processes.
	periodic := stressArgs{Via: "periodic"}
	var scheds []*backlog.Queue
	for _, p := range []proc{procs[0], procs[2]} {
		q := newQueue(p.pool, p.who+"-sched")
		require.NoError(t, q.Every(stressTick, time.Second, stressTick, periodic))
		scheds = append(scheds, q)
	}

	// The workload, one random stream per goroutine.
	var wg sync.WaitGroup
	for i, f := range []func(*rand.Rand){s.enqueueTxs, s.enqueueTxs, s.enqueueSingles, s.enqueueBatches, s.enqueueOrdered} {
		r := rand.New(rand.NewPCG(seed, uint64(i+1)))
		wg.Go(func() { f(r) })
	}
	wg.Go(s.sampleUnique)
	var stopOnce sync.Once
	stopWorkload := func() {
		stopOnce.Do(func() { close(s.stop) })
		wg.Wait()
	}
	t.Cleanup(stopWorkload) // when the test fails early: before the queues close

	// The failovers, each from a settled formation, with the workload
	// running on each primary for a while in between.
	run := func(d time.Duration) {
		tm := time.NewTimer(d)
		defer tm.Stop()
		<-tm.C // load shaping: the workload runs meanwhile
	}
	const within = 90 * time.Second
	start := time.Now()
	run(10 * time.Second)
	victim, err := cl.KillPrimary(ctx)
	require.NoError(t, err)
	killAt := time.Now()
	wctx, cancel := context.WithTimeout(ctx, within)
	newPrimary, err := cl.WaitPrimary(wctx)
	cancel()
	require.NoError(t, err, "no new primary after killing %s", victim)
	killGap := time.Since(killAt)
	t.Logf("failover: killed %s; %s accepts writes %s after the kill", victim, newPrimary, killGap.Round(time.Millisecond))
	run(8 * time.Second)
	require.NoError(t, cl.Rejoin(victim))
	wctx, cancel = context.WithTimeout(ctx, 2*within)
	err = cl.WaitHealthy(wctx)
	cancel()
	require.NoError(t, err, "%s did not rejoin", victim)
	t.Logf("%s rejoined as a standby", victim)
	run(5 * time.Second)
	swAt := time.Now()
	wctx, cancel = context.WithTimeout(ctx, 2*within)
	err = cl.Switchover(wctx)
	cancel()
	require.NoError(t, err)
	wctx, cancel = context.WithTimeout(ctx, within)
	swPrimary, err := cl.WaitPrimary(wctx)
	cancel()
	require.NoError(t, err)
	swGap := time.Since(swAt)
	t.Logf("switchover: %s is primary %s after it was asked for", swPrimary, swGap.Round(time.Millisecond))
	wctx, cancel = context.WithTimeout(ctx, 2*within)
	err = cl.WaitHealthy(wctx)
	cancel()
	require.NoError(t, err, "the formation did not settle after the switchover")
	run(8 * time.Second)
	stopWorkload()
	// checkPeriodic wants a plan for at least every other second with a
	// primary to write them on.
	s.dur = time.Since(start) - killGap - swGap
	t.Logf("workload stopped after %s (%s of it with a writable primary); %d enqueue calls",
		time.Since(start).Round(time.Millisecond), s.dur.Round(time.Millisecond), len(s.recs))

	for _, q := range scheds {
		require.NoError(t, q.Close())
	}
	settleStart := time.Now()
	settled := s.settle(2 * time.Minute)
	settleTook := time.Since(settleStart)
	for _, stop := range stops {
		require.NoError(t, stop())
	}
	t.Logf("settled: %v after %s", settled, settleTook.Round(time.Millisecond))

	d := s.load()
	v := &violations{}
	d.checkInvariants(v)
	peak := d.checkLimit(v, haLimited, haLimit)
	v.report(t)

	// --- figures ---
	history := pgx.Identifier{backlog.DefaultSchema, "job_history"}.Sanitize()
	claim, pause := firstClaimAfterPause(t, ctl, history, killAt, 60)
	swClaim, swPause := firstClaimAfterPause(t, ctl, history, swAt, 60)
	acked, failed := 0, 0
	for _, rec := range s.recs {
		if rec.acked {
			acked += len(rec.ids)
		} else if rec.err != nil && !rec.rolledBack {
			failed++
		}
	}
	st := d.stats
	faultReruns := map[string]int{}
	for why, n := range st.reruns {
		if !strings.HasPrefix(why, "planned ") {
			faultReruns[why] = n
		}
	}
	tr.mu.Lock()
	lostAnswers := len(tr.xids)
	tr.mu.Unlock()
	// Outcomes in flight: executions that ended while no primary took
	// writes (their outcomes held by the completer and written after),
	// and how many of those jobs ran again; jobs whose lease expired (a
	// claim whose answer was lost, or an outcome not written in time).
	// A lease is renewed every third of it, so when a gap began the
	// lease of a job running then had at least two thirds of it left. An
	// outcome held across the gap may be refused (and its job run again)
	// only if the sweep found its lease expired no sooner than that after
	// the gap began (less a heartbeat's slack on a loaded machine), and
	// before the outcome could have been written: no later than a
	// recovery allowance after the primary took writes again (the queues
	// reconnect and the completer's backoff ends within seconds; on the
	// CI machine the last part of a queue worked again 2.8 s after). A
	// rerun of a held outcome whose lease expired sooner, later, or not
	// at all is an error (heldRerun): the lease was cut short, or the
	// outcome was not written once it could be.
	const lease = 30 * time.Second
	const slack, recovery = 3 * time.Second, 8 * time.Second
	gaps := [][2]time.Time{{killAt, killAt.Add(killGap)}, {swAt, swAt.Add(swGap)}}
	held, heldRerun, heldLong, leaseExpired := 0, 0, 0, 0
	for _, j := range d.jobs {
		for i, x := range j.Execs {
			for _, g := range gaps {
				if x.Ended == nil || !x.Ended.After(g[0]) || !x.Ended.Before(g[1]) {
					continue
				}
				held++
				if i == len(j.Execs)-1 || strings.HasPrefix(d.justifiedRerun(j, x), "planned ") {
					continue
				}
				expired := time.Time{}
				for _, ae := range j.Errors {
					if ae.Attempt == x.Attempt && strings.Contains(ae.Error, "lease") {
						expired = ae.At
					}
				}
				if !expired.IsZero() && expired.Sub(g[0]) >= lease*2/3-slack && expired.Before(g[1].Add(recovery)) {
					heldLong++
				} else {
					heldRerun++
					t.Logf("job %s: outcome %q of attempt %d held across the gap %s-%s ran again; its lease was found expired at %v",
						j.ID, x.Outcome, x.Attempt, g[0].Format(time.StampMilli), g[1].Format(time.StampMilli), expired)
				}
			}
		}
		for _, ae := range j.Errors {
			if strings.Contains(ae.Error, "lease expired") {
				leaseExpired++
			}
		}
	}
	t.Logf("kill -> first job claimed on the new primary %s (no claim for %s before it); switchover asked -> first claimed on the new primary %s (no claim for %s before it)",
		secs(claim), pause.Round(time.Millisecond), secs(swClaim), swPause.Round(time.Millisecond))
	t.Logf("%d jobs (%v), %d executions (%v), %d periodic plans, %s at most %d running at once (limit %d)",
		len(d.jobs), counts(d.states), d.execs, counts(d.planned), st.plans, haLimited, peak, haLimit)
	t.Logf("enqueue calls: %d, %d jobs acknowledged, %d calls failed with an unknown outcome; unique-key samples %d (%d failed during the failovers)",
		len(s.recs), acked, failed, s.uniqueSamples, s.sampleErrs)
	t.Logf("re-runs: %d in all (%v); of them caused by the failovers: %v", st.rerunTotal, counts(st.reruns), counts(faultReruns))
	t.Logf("outcomes in flight: %d executions ended while no primary took writes (their outcomes held, then written); %d of them ran again for a reason other than their plan (%d because their leases expired during the gap or as it ended, as a lease renewed before the gap may)",
		held, heldRerun+heldLong, heldLong)
	// What the settling waited for: the last jobs to finish.
	var last []*stJob
	for _, j := range d.jobs {
		if j.FinishedAt != nil {
			last = append(last, j)
		}
	}
	sort.Slice(last, func(a, b int) bool { return last[a].FinishedAt.After(*last[b].FinishedAt) })
	for _, j := range last[:min(len(last), 5)] {
		t.Logf("finished late: job %s %s %s at %s (+%s after the workload stopped), attempt %d, key %q, deps %d, errors %+v",
			j.ID, j.Type, j.State, j.FinishedAt.Format(time.StampMilli), j.FinishedAt.Sub(settleStart).Round(time.Millisecond),
			j.Attempt, j.OrderKey, len(j.Args.Deps), j.Errors)
	}
	if heldRerun > 0 {
		t.Errorf("%d jobs whose outcome was held across a gap ran again, their leases found expired less than two thirds of the lease (%s, less %s) after the gap began, more than %s after it ended, or not at all", heldRerun, lease*2/3, slack, recovery)
	}
	t.Logf("attempts ended by an expired lease (a claim whose answer was lost, or an outcome not written in time): %d; "+
		"commits whose answer was lost and that the library checked with txid_status: %d", leaseExpired, lostAnswers)
	t.Logf("library warnings and errors:\n%s", logs.report())
	t.Logf("failed statements and connects, by pool (pgx tracer):\n%s", tr.report())
	report(t, summaryRow{
		Scenario: fmt.Sprintf("HA: mixed workload (seed %d) on pg_auto_failover, 3 worker processes, a kill -9 of the primary's node and a switchover", seed),
		Jobs:     len(d.jobs),
		Faults: fmt.Sprintf("kill: writable again after %s, first claim on the new primary after %s; switchover: %s, first claim after %s",
			killGap.Round(time.Millisecond), secs(claim), swGap.Round(time.Millisecond), secs(swClaim)),
		Lost:       st.lost,
		Duplicates: fmt.Sprintf("%d re-executions caused by the failovers (%s); none of one (job, attempt) overlapped", len(faultReruns), counts(faultReruns)),
		Pickup:     fmt.Sprintf("workload stopped → every job settled: %s", settleTook.Round(time.Millisecond)),
	})
}

// checkLimit: the executions of typ (the handlers' log, from inside each
// handler's start to inside its end; a slot is held from the claim to the
// handler's end, for its own process, and to the outcome's write for
// others) never overlapped more than limit at once. It returns the peak.
func (d *stressData) checkLimit(v *violations, typ string, limit int) int {
	type edge struct {
		at    time.Time
		delta int
		id    string
	}
	var es []edge
	for _, j := range d.jobs {
		if j.Type != typ {
			continue
		}
		for _, x := range j.Execs {
			end, _ := d.end(x)
			es = append(es, edge{x.Started, 1, j.ID.String()}, edge{end, -1, j.ID.String()})
		}
	}
	// At one instant an end comes before a start.
	sort.Slice(es, func(a, b int) bool {
		return es[a].at.Before(es[b].at) || es[a].at.Equal(es[b].at) && es[a].delta < es[b].delta
	})
	running, peak := 0, 0
	for _, e := range es {
		running += e.delta
		peak = max(peak, running)
		if running > limit && e.delta > 0 {
			v.add("limit", "%d jobs of %s running at %s (limit %d), the last started %s", running, typ,
				e.at.Format(time.StampMicro), limit, e.id)
		}
	}
	if len(es) == 0 {
		v.add("limit", "no job of the limited type %s ran", typ)
	}
	return peak
}
