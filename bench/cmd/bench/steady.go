package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Workload 2: steady state. Inserters enqueue batches of steadyBatch jobs
// (each system's bulk insert) in a loop while the workers run, so the
// producers can outpace the workers and the completed rate measures the
// working side; the queue depth is sampled every second.

func defineSteadyRows(res *results) {
	res.define("steady.done", "steady: completed jobs/s", fmtRate, true)
	res.define("steady.ins", fmt.Sprintf("steady: inserted jobs/s (bulk inserts of %d)", steadyBatch), fmtRate, true)
	res.define("steady.dmin", "steady: queue depth (available), min", fmtInt, false)
	res.define("steady.dmed", "steady: queue depth (available), median", fmtInt, false)
	res.define("steady.dmax", "steady: queue depth (available), max", fmtInt, false)
}

var steadyKeys = []string{"steady.done", "steady.ins", "steady.dmin", "steady.dmed", "steady.dmax"}

func runSteady(ctx context.Context, env *benchEnv, k kind, res *results) {
	for run := range env.cfg.runs {
		logf("steady: %s, run %d/%d, %s", k.label, run+1, env.cfg.runs, env.cfg.steadyDur)
		from := time.Now()
		vals, err := steadyOnce(ctx, env, k)
		if err != nil {
			status := statusOf(err)
			logf("steady: %s: %v", k.label, err)
			res.note("%s steady state: %v", k.label, err)
			for _, key := range steadyKeys {
				res.fail(key, k.key, status)
			}
			flagNoise(env, res, "steady state", k, from, steadyKeys...)
			continue
		}
		logf("steady: %s: %.0f completed/s, %.0f inserted/s, depth %.0f/%.0f/%.0f", k.label, vals[0], vals[1], vals[2], vals[3], vals[4])
		for i, key := range steadyKeys {
			res.add(key, k.key, vals[i])
		}
		flagNoise(env, res, "steady state", k, from, steadyKeys...)
	}
}

// steadyOnce returns completed/s, inserted/s and depth min, median, max.
func steadyOnce(ctx context.Context, env *benchEnv, k kind) ([]float64, error) {
	cfg := env.cfg
	schema := env.newSchema(k.key)
	defer env.dropSchema(ctx, schema)
	sys := k.new(env, schema)
	phase, cancel := context.WithTimeout(ctx, cfg.setupTimeout+cfg.steadyWarmup+cfg.steadyDur+cfg.stopTimeout)
	defer cancel()

	if err := sys.Open(phase); err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.stopTimeout)
		defer cancel()
		if err := sys.Stop(sctx); err != nil {
			logf("steady: %s: stop: %v", k.label, err)
		}
		sys.Close(sctx)
	}()
	if err := sys.Migrate(phase); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	mon, err := openMonitor(phase, env, sys.Tables())
	if err != nil {
		return nil, err
	}
	defer mon.close(ctx)
	if err := sys.Start(phase, workSpec{}); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}

	ins := startInserters(phase, sys, cfg.inserters)
	defer ins.stop()
	pause(phase, cfg.steadyWarmup)

	c0, err := mon.completed(phase)
	if err != nil {
		return nil, err
	}
	i0, tA := ins.n.Load(), time.Now()
	sys.Counter().resetTexts()
	var depth []float64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for time.Since(tA) < cfg.steadyDur-100*time.Millisecond {
		select {
		case <-phase.Done():
			return nil, &timeoutError{what: "steady state: phase deadline passed"}
		case <-tick.C:
		}
		d, err := mon.ready(phase)
		if err != nil {
			return nil, err
		}
		depth = append(depth, float64(d))
	}
	c1, err := mon.completed(phase)
	if err != nil {
		return nil, err
	}
	i1, tB := ins.n.Load(), time.Now()
	env.sqlStats("steady "+k.label, sys)
	ins.stop()
	if err := ins.firstErr(); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	secs := tB.Sub(tA).Seconds()
	slices.Sort(depth)
	return []float64{float64(c1-c0) / secs, float64(i1-i0) / secs,
		depth[0], median(depth), depth[len(depth)-1]}, nil
}

// inserters run bulk inserts in a loop until stopped.
type inserters struct {
	n      atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// steadyBatch is the size of each steady-state insert.
const steadyBatch = 50

func startInserters(ctx context.Context, sys system, count int) *inserters {
	ins := &inserters{}
	ctx, ins.cancel = context.WithCancel(ctx)
	for range count {
		ins.wg.Go(func() {
			for ctx.Err() == nil {
				if err := sys.BulkInsert(ctx, steadyBatch); err != nil {
					if ctx.Err() == nil {
						ins.mu.Lock()
						ins.err = cmpOr(ins.err, err)
						ins.mu.Unlock()
						pause(ctx, 10*time.Millisecond)
					}
					continue
				}
				ins.n.Add(steadyBatch)
			}
		})
	}
	return ins
}

func (ins *inserters) stop() {
	ins.cancel()
	ins.wg.Wait()
}

func (ins *inserters) firstErr() error {
	ins.mu.Lock()
	defer ins.mu.Unlock()
	return ins.err
}

// cmpOr returns a unless it is nil, else b.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
