package main

import (
	"context"
	"fmt"
	"time"
)

// Workload 4: idle cost. 200 workers in 20 domains (backlog: 20 Work calls
// with a job type each; River: 20 queues) wait for jobs that never come.

func defineIdleRows(res *results, pgss bool) {
	if pgss {
		res.define("idle.pgss", "idle: queries/s (pg_stat_statements)", fmtDec, true)
	}
	res.define("idle.xact", "idle: transactions/s (pg_stat_database)", fmtDec, true)
	res.define("idle.stmt", "idle: statements/s (client-side count)", fmtDec, true)
	res.define("idle.pgcpu", "idle: PostgreSQL CPU ms/s", fmtDec, true)
	res.define("idle.self", "idle: client CPU ms/s (bench process; graphile-worker: + its Node process)", fmtDec, true)
}

// idleReading is one end of the idle window, read on a fresh connection.
type idleReading struct {
	u       usage
	x, pgss int64
	// Statements of the reading connection the server counts inside the
	// window: for the opening reading, those from the transaction count on
	// (flushed when it exits); for the closing one, those before it (its
	// first statement is flushed at once).
	xOwn, pgssOwn int64
}

func readIdle(ctx context.Context, env *benchEnv, sys system, closing bool) (idleReading, error) {
	var r idleReading
	m, err := openMonitor(ctx, env, sys.Tables())
	if err != nil {
		return r, err
	}
	defer m.close(ctx)
	if r.x, err = m.xacts(ctx); err != nil {
		return r, err
	}
	// pg_stat_statements counts a statement as it ends: the reading sees
	// the monitor's statements before it, not itself or later ones.
	beforePGSS := m.stmts
	if env.pgss {
		if r.pgss, err = m.pgssCalls(ctx); err != nil {
			return r, err
		}
	}
	if r.u, err = takeUsage(ctx, env, m, sys); err != nil {
		return r, err
	}
	if closing {
		r.xOwn, r.pgssOwn = m.mark, beforePGSS
	} else {
		r.xOwn, r.pgssOwn = m.sinceMark(), m.stmts-beforePGSS
	}
	return r, nil
}

// runIdle measures the idle load cfg.runs times, each run in a fresh
// schema with fresh workers; each row is the median of the runs.
func runIdle(ctx context.Context, env *benchEnv, k kind, res *results) {
	for run := range env.cfg.runs {
		if ctx.Err() != nil {
			return
		}
		if env.cfg.runs > 1 {
			logf("idle: %s, run %d/%d", k.label, run+1, env.cfg.runs)
		}
		idleRun(ctx, env, k, res)
	}
}

func idleRun(ctx context.Context, env *benchEnv, k kind, res *results) {
	cfg := env.cfg
	keys := []string{"idle.xact", "idle.stmt", "idle.pgcpu", "idle.self"}
	if env.pgss {
		keys = append(keys, "idle.pgss")
	}
	logf("idle: %s, %d domains × %d workers, %s", k.label, cfg.idleDomains, cfg.idleWorkers, cfg.idleDur)
	from := time.Now()
	defer func() { flagNoise(env, res, "idle", k, from, keys...) }()
	vals, err := idleOnce(ctx, env, k)
	if err != nil {
		logf("idle: %s: %v", k.label, err)
		res.note("%s idle: %v", k.label, err)
		for _, key := range keys {
			res.fail(key, k.key, statusOf(err))
		}
		return
	}
	for _, key := range keys {
		if v, ok := vals[key]; ok {
			res.add(key, k.key, v)
		}
	}
	logf("idle: %s: %.2f statements/s, %.2f transactions/s", k.label, vals["idle.stmt"], vals["idle.xact"])
}

func idleOnce(ctx context.Context, env *benchEnv, k kind) (map[string]float64, error) {
	cfg := env.cfg
	schema := env.newSchema(k.key)
	defer env.dropSchema(ctx, schema)
	sys := k.new(env, schema)
	phase, cancel := context.WithTimeout(ctx, cfg.setupTimeout+cfg.idleWarmup+cfg.idleDur+cfg.stopTimeout)
	defer cancel()
	if err := sys.Open(phase); err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.stopTimeout)
		defer cancel()
		if err := sys.Stop(sctx); err != nil {
			logf("idle: %s: stop: %v", k.label, err)
		}
		sys.Close(sctx)
	}()
	if err := sys.Migrate(phase); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if err := sys.Start(phase, workSpec{domains: cfg.idleDomains, perDomain: cfg.idleWorkers}); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	pause(phase, cfg.idleWarmup)
	a, err := readIdle(phase, env, sys, false)
	if err != nil {
		return nil, err
	}
	sys.Counter().resetTexts()
	pause(phase, cfg.idleDur)
	env.sqlStats("idle "+k.label, sys)
	b, err := readIdle(phase, env, sys, true)
	if err != nil {
		return nil, err
	}
	if phase.Err() != nil {
		return nil, &timeoutError{what: "idle: phase deadline passed"}
	}
	secs := b.u.at.Sub(a.u.at).Seconds()
	v := map[string]float64{
		"idle.xact": float64(b.x-a.x-a.xOwn-b.xOwn) / secs,
		"idle.stmt": float64(b.u.queries-a.u.queries) / secs,
		"idle.self": float64((b.u.client() - a.u.client()).Microseconds()) / 1000 / secs,
	}
	if env.pgss {
		v["idle.pgss"] = float64(b.pgss-a.pgss-a.pgssOwn-b.pgssOwn) / secs
	}
	if d, ok := serverCPU(a.u, b.u); ok {
		v["idle.pgcpu"] = float64(d.Microseconds()) / 1000 / secs
	}
	return v, nil
}
