package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Workload 3: pickup latency. One job at a time at a fixed rate while the
// workers are idle; latency is the handler's start minus the moment the
// insert call returned (the commit).

const (
	latProducers = 4               // producers sharing the schedule, so a slow insert does not delay the next
	latGrace     = 5 * time.Second // how long to wait for the last jobs to start
)

func latKey(rate int, p string) string { return fmt.Sprintf("lat.%d.%s", rate, p) }

var latPercentiles = []struct {
	name string
	p    float64
}{{"p50", 50}, {"p90", 90}, {"p99", 99}, {"max", 100}}

func defineLatencyRows(res *results, rates []int) {
	for _, r := range rates {
		for _, p := range latPercentiles {
			res.define(latKey(r, p.name), fmt.Sprintf("pickup latency @ %d/s: %s ms", r, p.name), fmtMs, true)
		}
	}
}

// latRecorder holds both timestamps of every job, as nanoseconds since base
// (0: not yet).
type latRecorder struct {
	base          time.Time
	commit, start []atomic.Int64
	dups          atomic.Int64
}

func newLatRecorder(n int) *latRecorder {
	return &latRecorder{base: time.Now(), commit: make([]atomic.Int64, n), start: make([]atomic.Int64, n)}
}

func (r *latRecorder) now() int64 { return int64(time.Since(r.base)) + 1 }

// hook is the handler's: it records the first start of each job. A started
// time with a monotonic reading (time.Now()) is placed on the monotonic clock;
// one without (a wall-clock time from another process) through the wall
// clock, which only a clock step during the run would skew.
func (r *latRecorder) hook(seq int64, started time.Time) {
	if seq < 0 || seq >= int64(len(r.start)) {
		return
	}
	if !r.start[seq].CompareAndSwap(0, int64(started.Sub(r.base))+1) {
		r.dups.Add(1)
	}
}

// runLatency measures pickup latency cfg.runs times, each run in a fresh
// schema with fresh workers, so every percentile is reported as the median
// of the runs with their range.
func runLatency(ctx context.Context, env *benchEnv, k kind, res *results) {
	for run := range env.cfg.runs {
		if ctx.Err() != nil {
			return
		}
		logf("latency: %s, run %d/%d", k.label, run+1, env.cfg.runs)
		latencyOnce(ctx, env, k, res)
	}
}

func latencyOnce(ctx context.Context, env *benchEnv, k kind, res *results) {
	cfg := env.cfg
	total := 0
	for _, rate := range cfg.latRates {
		total += rate * int(cfg.latDur(rate).Seconds())
	}
	rec := newLatRecorder(total)
	from := time.Now()
	var keys []string
	for _, rate := range cfg.latRates {
		for _, p := range latPercentiles {
			keys = append(keys, latKey(rate, p.name))
		}
	}
	defer func() { flagNoise(env, res, "pickup latency", k, from, keys...) }()
	failAll := func(status string, from int) {
		for _, rate := range cfg.latRates[from:] {
			for _, p := range latPercentiles {
				res.fail(latKey(rate, p.name), k.key, status)
			}
		}
	}

	schema := env.newSchema(k.key)
	defer env.dropSchema(ctx, schema)
	sys := k.new(env, schema)
	setup, cancel := context.WithTimeout(ctx, cfg.setupTimeout)
	defer cancel()
	budget := cfg.setupTimeout + cfg.latSettle
	for _, rate := range cfg.latRates {
		budget += cfg.latDur(rate) + latGrace + cfg.latSettle + 5*time.Second
	}
	phase, cancelPhase := context.WithTimeout(ctx, budget)
	defer cancelPhase()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.stopTimeout)
		defer cancel()
		if err := sys.Stop(sctx); err != nil {
			logf("latency: %s: stop: %v", k.label, err)
		}
		sys.Close(sctx)
	}()
	err := sys.Open(setup)
	if err == nil {
		err = sys.Migrate(setup)
	}
	if err == nil {
		err = sys.Start(setup, workSpec{hook: rec.hook})
	}
	if err != nil {
		logf("latency: %s: %v", k.label, err)
		res.note("%s latency: %v", k.label, err)
		failAll("error", 0)
		return
	}
	pause(phase, cfg.latSettle) // let the workers go idle

	next := 0
	for i, rate := range cfg.latRates {
		n := rate * int(cfg.latDur(rate).Seconds())
		logf("latency: %s, %d/s for %s", k.label, rate, cfg.latDur(rate))
		sys.Counter().resetTexts()
		sent, errs := paceInserts(phase, sys, rec, next, n, rate)
		missing := waitStarted(phase, rec, next, n, latGrace)
		env.sqlStats(fmt.Sprintf("latency @ %d/s %s", rate, k.label), sys)
		if err := phase.Err(); err != nil {
			failAll(statusOf(err), i)
			res.note("%s latency: %v", k.label, err)
			return
		}
		var lats []float64
		for s := next; s < next+n; s++ {
			c, st := rec.commit[s].Load(), rec.start[s].Load()
			if c != 0 && st != 0 {
				lats = append(lats, float64(st-c)/1e6)
			}
		}
		slices.Sort(lats)
		if len(lats) == 0 {
			failAll("timeout", i)
			res.note("%s latency @ %d/s: no job started", k.label, rate)
			return
		}
		for _, p := range latPercentiles {
			res.add(latKey(rate, p.name), k.key, percentile(lats, p.p))
		}
		if missing > 0 {
			res.fail(latKey(rate, "max"), k.key, "timeout")
			res.note("%s latency @ %d/s: %d of %d jobs did not start within %s after the last insert", k.label, rate, missing, n, latGrace)
		}
		if errs > 0 {
			res.note("%s latency @ %d/s: %d inserts failed", k.label, rate, errs)
		}
		if sent < 0.9*float64(rate) {
			res.note("%s latency @ %d/s: the producers reached only %.0f inserts/s", k.label, rate, sent)
		}
		if neg := countBelow(lats, 0); neg > 0 {
			res.note("%s latency @ %d/s: %d of %d handlers started before their insert call had returned (min %.2f ms; kept as measured): NOTIFY goes out at commit, and on a busy machine the producer goroutine may run only later",
				k.label, rate, neg, len(lats), lats[0])
		}
		logf("latency: %s @ %d/s: p50 %.2f ms, p99 %.2f ms, max %.2f ms", k.label, rate, percentile(lats, 50), percentile(lats, 99), lats[len(lats)-1])
		next += n
		pause(phase, cfg.latSettle)
	}
	if d := rec.dups.Load(); d > 0 {
		res.note("%s latency: %d job(s) started twice", k.label, d)
	}
}

// paceInserts inserts jobs seq from..from+n-1, job i due at start + i/rate,
// and records when each insert call returned. It returns the achieved rate
// and the number of failed inserts.
func paceInserts(ctx context.Context, sys system, rec *latRecorder, from, n, rate int) (float64, int64) {
	interval := time.Second / time.Duration(rate)
	start := time.Now().Add(10 * time.Millisecond)
	var wg sync.WaitGroup
	var errs atomic.Int64
	for p := range latProducers {
		wg.Go(func() {
			for i := p; i < n && ctx.Err() == nil; i += latProducers {
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
				seq := from + i
				if err := sys.Insert(ctx, int64(seq)); err != nil {
					errs.Add(1)
					continue
				}
				rec.commit[seq].Store(rec.now())
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds(), errs.Load()
}

// waitStarted waits until every job of the range whose insert returned has
// started, or for grace; it returns how many have not. (A failed insert is
// reported by its caller, not waited for.)
func waitStarted(ctx context.Context, rec *latRecorder, from, n int, grace time.Duration) int {
	deadline := time.Now().Add(grace)
	for {
		missing := 0
		for s := from; s < from+n; s++ {
			if rec.commit[s].Load() != 0 && rec.start[s].Load() == 0 {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return missing
		}
		pause(ctx, 10*time.Millisecond)
	}
}

// countBelow returns how many of sorted are below x.
func countBelow(sorted []float64, x float64) int {
	n, _ := slices.BinarySearch(sorted, x)
	return n
}
