package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Workloads 1, 5 and 6: burn-down of pre-inserted jobs, with its per-job
// database cost. The raw-SQL floor runs the same burn-down.

func defineBurndownRows(res *results) {
	res.define("burn.rate", "burn-down: jobs/s (workers start → last job completed)", fmtRate, true)
	res.define("burn.insert", "burn-down: bulk insert, jobs/s (not part of the above)", fmtRate, true)
	res.define("cost.wal", "per job: WAL bytes", fmtInt, true)
	res.define("cost.xact", "per job: transactions (pg_stat_database)", fmtDec, true)
	res.define("cost.stmt", "per job: statements sent (client-side count)", fmtDec, true)
	res.define("cost.pgcpu", "per job: PostgreSQL CPU µs", fmtDec, true)
	res.define("cost.self", "per job: client CPU µs (bench process; graphile-worker: + its Node process)", fmtDec, true)
}

type burnResult struct {
	rate, insertRate            float64
	wal, xact, stmt, pgCPU, cpu float64 // per job
	pgCPUok                     bool
	timeout                     string // set when the jobs did not drain in time
}

func runBurndown(ctx context.Context, env *benchEnv, k kind, res *results) {
	for run := range env.cfg.runs {
		if !burndownRun(ctx, env, k, res, run) {
			return
		}
	}
}

// burndownRun runs and records one burn-down; false: skip the other runs.
func burndownRun(ctx context.Context, env *benchEnv, k kind, res *results, run int) bool {
	logf("burn-down: %s, run %d/%d, %d jobs", k.label, run+1, env.cfg.runs, env.cfg.burnJobs)
	from := time.Now()
	defer func() { flagNoise(env, res, "burn-down", k, from, burnKeys...) }()
	r, err := burndownOnce(ctx, env, k, env.cfg.burnJobs, env.cfg.burnTimeout)
	if err != nil {
		logf("burn-down: %s: %v", k.label, err)
		res.fail("burn.rate", k.key, "error")
		failBurnCosts(res, k.key, "error")
		res.note("%s burn-down failed: %v", k.label, err)
		return true
	}
	logf("burn-down: %s: %.0f jobs/s", k.label, r.rate)
	if r.timeout != "" {
		res.fail("burn.rate", k.key, fmt.Sprintf("timeout (%s/s partial)", fmtRate(r.rate)))
		res.note("%s burn-down timed out: %s; its per-job costs are over the jobs completed until then", k.label, r.timeout)
	} else {
		res.add("burn.rate", k.key, r.rate)
	}
	res.add("burn.insert", k.key, r.insertRate)
	res.add("cost.wal", k.key, r.wal)
	res.add("cost.xact", k.key, r.xact)
	res.add("cost.stmt", k.key, r.stmt)
	if r.pgCPUok {
		res.add("cost.pgcpu", k.key, r.pgCPU)
	}
	res.add("cost.self", k.key, r.cpu)
	if r.timeout != "" {
		if run+1 < env.cfg.runs {
			res.note("%s burn-down: the remaining runs were skipped after the timeout", k.label)
		}
		return false
	}
	return true
}

var burnKeys = []string{"burn.rate", "burn.insert", "cost.wal", "cost.xact", "cost.stmt", "cost.pgcpu", "cost.self"}

func failBurnCosts(res *results, sys, status string) {
	for _, key := range burnKeys[2:] {
		res.fail(key, sys, status)
	}
}

// timeoutError is a phase that ran into its deadline.
type timeoutError struct{ what string }

func (e *timeoutError) Error() string { return e.what }

// statusOf is the table cell for a failed phase.
func statusOf(err error) string {
	var te *timeoutError
	if errors.As(err, &te) || errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "error"
}

// burndownOnce inserts jobs jobs, then times their burn-down, giving up
// after timeout.
func burndownOnce(ctx context.Context, env *benchEnv, k kind, jobs int, timeout time.Duration) (burnResult, error) {
	schema := env.newSchema(k.key)
	defer env.dropSchema(ctx, schema)
	return burndownIn(ctx, env, k.label, k.new(env, schema), jobs, timeout)
}

// burndownIn is burndownOnce on a system whose schema the caller made (and
// drops): it may hold tables of an earlier phase (history), which Migrate
// leaves as they are.
func burndownIn(ctx context.Context, env *benchEnv, label string, sys system, jobs int, timeout time.Duration) (burnResult, error) {
	cfg := env.cfg
	var r burnResult

	// Load with one pool, then close it: its backends exit and flush their
	// statistics before the measurement starts.
	setup, cancel := context.WithTimeout(ctx, cfg.setupTimeout)
	defer cancel()
	if err := sys.Open(setup); err != nil {
		return r, fmt.Errorf("open: %w", err)
	}
	if err := sys.Migrate(setup); err != nil {
		sys.Close(setup)
		return r, fmt.Errorf("migrate: %w", err)
	}
	t := time.Now()
	if err := sys.BulkInsert(setup, 0, jobs); err != nil {
		sys.Close(setup)
		return r, fmt.Errorf("bulk insert: %w", err)
	}
	r.insertRate = float64(jobs) / time.Since(t).Seconds()
	sys.Close(setup)
	if cfg.analyze {
		// Planner statistics, as a long-lived table has them: without them
		// the fetch query of some systems plans a sequential scan.
		if err := env.exec(setup, "ANALYZE "+sys.Tables().table); err != nil {
			return r, fmt.Errorf("analyze: %w", err)
		}
	}

	if err := sys.Open(setup); err != nil {
		return r, fmt.Errorf("reopen: %w", err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.stopTimeout)
		defer cancel()
		err := sys.Stop(sctx)
		sys.Close(sctx)
		return err
	}
	defer func() { _ = stop() }()
	mon, err := openMonitor(setup, env, sys.Tables())
	if err != nil {
		return r, err
	}
	defer mon.close(ctx)
	pause(ctx, 300*time.Millisecond)

	x0, err := mon.xacts(setup)
	if err != nil {
		return r, err
	}
	u0, err := takeUsage(setup, env, mon, sys)
	if err != nil {
		return r, err
	}
	sys.Counter().resetTexts()
	t0 := time.Now()
	phase, cancelPhase := context.WithDeadline(ctx, t0.Add(timeout+cfg.stopTimeout))
	defer cancelPhase()
	if err := sys.Start(phase, workSpec{}); err != nil {
		return r, fmt.Errorf("start: %w", err)
	}
	done, err := waitDrained(phase, mon, t0.Add(timeout))
	if err != nil {
		return r, err
	}
	elapsed := time.Since(t0)
	env.sqlStats("burn-down "+label, sys)
	u1, err := takeUsage(phase, env, mon, sys)
	if err != nil {
		return r, err
	}
	n, err := mon.completed(phase)
	if err != nil {
		return r, err
	}
	if !done {
		r.timeout = fmt.Sprintf("%d of %d jobs completed after %s", n, jobs, elapsed.Round(time.Millisecond))
	}
	if err := stop(); err != nil {
		return r, err
	}
	if done && n != int64(jobs) {
		return r, fmt.Errorf("drained, but only %d of %d jobs are completed", n, jobs)
	}
	if n == 0 {
		return r, fmt.Errorf("no job completed in %s", elapsed.Round(time.Millisecond))
	}
	monStmts := mon.sinceMark()
	mon.close(ctx)
	x1, err := settledXacts(ctx, env)
	if err != nil {
		return r, err
	}

	nj := float64(n)
	r.rate = nj / elapsed.Seconds()
	r.wal = float64(u1.wal-u0.wal) / nj
	r.xact = float64(x1-x0-monStmts) / nj
	r.stmt = float64(u1.queries-u0.queries) / nj
	r.cpu = float64((u1.client() - u0.client()).Microseconds()) / nj
	if d, ok := serverCPU(u0, u1); ok {
		r.pgCPU, r.pgCPUok = float64(d.Microseconds())/nj, true
	}
	if u1.child > 0 {
		logf("burn-down: %s: client CPU %.1f µs/job, of which the child process %.1f", label, r.cpu, float64((u1.child-u0.child).Microseconds())/nj)
	}
	return r, nil
}

// waitDrained polls until no job is available or running (true), or until
// the deadline (false).
func waitDrained(ctx context.Context, mon *monitor, deadline time.Time) (bool, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		p, err := mon.pending(ctx)
		if err != nil {
			return false, err
		}
		if !p {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-tick.C:
		}
	}
}

// settledXacts reads the transaction count after every connection of the
// phase has exited (so all of them have flushed their statistics), from a
// fresh connection whose own transaction is not yet counted.
func settledXacts(ctx context.Context, env *benchEnv) (int64, error) {
	pause(ctx, 300*time.Millisecond)
	m, err := openMonitor(ctx, env, jobTables{})
	if err != nil {
		return 0, err
	}
	defer m.close(ctx)
	x, err := m.xacts(ctx)
	// The monitor's first statement (its pid) was flushed at once: count it out.
	return x - m.mark, err
}

// The large burn-down: the same, with -large-jobs jobs (1,000,000 by
// default), where the tables outgrow shared_buffers; its rate and the
// server's cost per job.

func defineLargeRows(res *results, jobs int) {
	n := fmtInt(float64(jobs))
	res.define("large.rate", "burn-down of "+n+" jobs: jobs/s", fmtRate, true)
	res.define("large.pgcpu", "burn-down of "+n+" jobs: PostgreSQL CPU µs per job", fmtDec, true)
	res.define("large.wal", "burn-down of "+n+" jobs: WAL bytes per job", fmtInt, true)
}

func runLarge(ctx context.Context, env *benchEnv, k kind, res *results) {
	for run := range env.cfg.runs {
		logf("large burn-down: %s, run %d/%d, %d jobs", k.label, run+1, env.cfg.runs, env.cfg.largeJobs)
		from := time.Now()
		r, err := burndownOnce(ctx, env, k, env.cfg.largeJobs, env.cfg.largeTimeout)
		flagNoise(env, res, "large burn-down", k, from, "large.rate", "large.pgcpu", "large.wal")
		if err != nil {
			logf("large burn-down: %s: %v", k.label, err)
			for _, key := range []string{"large.rate", "large.pgcpu", "large.wal"} {
				res.fail(key, k.key, statusOf(err))
			}
			res.note("%s large burn-down failed: %v", k.label, err)
			return
		}
		logf("large burn-down: %s: %.0f jobs/s, %.1f µs/job, %.0f WAL bytes/job", k.label, r.rate, r.pgCPU, r.wal)
		if r.timeout != "" {
			res.fail("large.rate", k.key, fmt.Sprintf("timeout (%s/s partial)", fmtRate(r.rate)))
			res.note("%s large burn-down timed out: %s", k.label, r.timeout)
			return
		}
		res.add("large.rate", k.key, r.rate)
		if r.pgCPUok {
			res.add("large.pgcpu", k.key, r.pgCPU)
		}
		res.add("large.wal", k.key, r.wal)
	}
}
