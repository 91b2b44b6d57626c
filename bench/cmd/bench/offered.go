package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workload 2: offered load. For each rate of cfg.offeredRates, ascending,
// producers insert jobs on a fixed schedule (batches of offeredBatch, each
// system's bulk insert) while the workers run: a warm-up, then a measured
// window in which completed jobs are counted, the queue depth is sampled and
// every job's pickup latency (handler start − the moment its insert call
// returned, recorded as the latency workload does) is kept. A rate is
// sustained when the producers kept the schedule, the workers kept up, the
// queue did not grow and pickup p99 stayed within offeredP99. One ladder per
// system: -runs does not repeat it, so the workload keeps within
// cfg.offeredCap.

const (
	offeredBatch = 50                     // jobs per insert call, the same for every system
	offeredTick  = 2 * time.Millisecond   // the pacer's tick: it releases every batch that has fallen due
	offeredEvery = 250 * time.Millisecond // queue-depth sampling interval
	offeredP99   = 100.0                  // ms: the pickup p99 a sustained rate stays within
	offeredLate  = time.Second            // how long past its schedule the pacer may still release batches

	// A rate is sustained when:
	offeredKeep   = 0.95 // measured offered ≥ offeredKeep × nominal, completed ≥ offeredKeep × offered,
	offeredGrowth = 0.25 // depth at the end ≤ depth after the warm-up + offeredGrowth s × rate,
	offeredSlope  = 0.02 // and the depth's least-squares slope ≤ offeredSlope × rate (jobs/s per s).
	// Higher rates are not run once completed < offeredSat × offered, the
	// producers reached < offeredSat × nominal, or the jobs did not all start
	// within the drain time: the system is saturated.
	offeredSat = 0.9
)

func offKey(rate int, m string) string { return fmt.Sprintf("off.%d.%s", rate, m) }

var offMetrics = []struct {
	name, label string
	format      func(float64) string
	ratios      bool
}{
	{"offered", "offered jobs/s, measured", fmtRate, false},
	{"done", "completed jobs/s", fmtRate, false},
	{"dmed", "queue depth (available), median", fmtInt, false},
	{"dmax", "queue depth (available), max", fmtInt, false},
	{"p50", "pickup p50 ms", fmtMs, true},
	{"p99", "pickup p99 ms", fmtMs, true},
	{"ok", "sustained", fmtYesNo, false},
}

// peers are the systems backlog's highest sustained rate is compared with.
var offeredPeers = []string{"river", "river-tuned", "graphile"}

func defineOfferedRows(res *results, rates []int) {
	for _, r := range rates {
		for _, m := range offMetrics {
			res.define(offKey(r, m.name), fmt.Sprintf("offered %s/s: %s", fmtInt(float64(r)), m.label), m.format, m.ratios)
		}
	}
	res.define("off.max", "offered: highest rate sustained, jobs/s", fmtNone, true)
	res.define("off.peer", "offered: backlog's highest sustained rate ÷ best peer's (River default, River tuned, graphile-worker)", fmtTimes, false)
}

func fmtYesNo(v float64) string {
	if v == 1 {
		return "yes"
	}
	return "no"
}

func fmtNone(v float64) string {
	if v == 0 {
		return "none"
	}
	return fmtInt(v)
}

func fmtTimes(v float64) string { return "×" + fmtRatio(v) }

// offStep is one rate's measurement.
type offStep struct {
	offered, done, dmed, dmax, p50, p99 float64
	missing                             int      // jobs of the window that had not started within the drain time
	issued                              int64    // sequence numbers used
	saturated                           bool     // do not run higher rates
	why                                 []string // why the rate was not sustained
}

func (s *offStep) sustained() bool { return len(s.why) == 0 }

func runOffered(ctx context.Context, env *benchEnv, k kind, res *results) {
	cfg := env.cfg
	rates := cfg.offeredRates
	var keys []string
	for _, r := range rates {
		for _, m := range offMetrics {
			keys = append(keys, offKey(r, m.name))
		}
	}
	failFrom := func(i int, status string) {
		for _, r := range rates[i:] {
			for _, m := range offMetrics {
				res.fail(offKey(r, m.name), k.key, status)
			}
		}
	}
	if ctx.Err() != nil {
		failFrom(0, "timeout")
		res.note("%s offered load: not run: the workload's cap of %s was reached", k.label, cfg.offeredCap)
		return
	}
	from := time.Now()
	defer func() { flagNoise(env, res, "offered load", k, from, keys...) }()

	total := 0
	budget := cfg.setupTimeout + cfg.latSettle
	for _, r := range rates {
		total += int(float64(r)*(cfg.offeredWarmup+cfg.offeredDur).Seconds()) + offeredBatch
		budget += cfg.offeredWarmup + cfg.offeredDur + cfg.offeredDrain + 5*time.Second
	}
	rec := newLatRecorder(total)
	schema := env.newSchema(k.key)
	defer env.dropSchema(ctx, schema)
	sys := k.new(env, schema)
	phase, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	setup, cancelSetup := context.WithTimeout(phase, cfg.setupTimeout)
	defer cancelSetup()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.stopTimeout)
		defer cancel()
		if err := sys.Stop(sctx); err != nil {
			logf("offered: %s: stop: %v", k.label, err)
		}
		sys.Close(sctx)
	}()
	err := sys.Open(setup)
	if err == nil {
		err = sys.Migrate(setup)
	}
	var mon *monitor
	if err == nil {
		mon, err = openMonitor(setup, env, sys.Tables())
	}
	if mon != nil {
		defer mon.close(ctx)
	}
	if err == nil {
		err = sys.Start(setup, workSpec{hook: rec.hook})
	}
	if err != nil {
		logf("offered: %s: %v", k.label, err)
		res.note("%s offered load: %v", k.label, err)
		failFrom(0, "error")
		return
	}
	pause(phase, cfg.latSettle)

	next := int64(0)
	for i, rate := range rates {
		logf("offered: %s, %d/s: %s warm-up, %s measured", k.label, rate, cfg.offeredWarmup, cfg.offeredDur)
		sys.Counter().resetTexts()
		st, err := offeredOnce(phase, env, sys, mon, rec, next, rate)
		env.sqlStats(fmt.Sprintf("offered @ %d/s %s", rate, k.label), sys)
		next += st.issued
		if err != nil {
			logf("offered: %s @ %d/s: %v", k.label, rate, err)
			res.note("%s offered load @ %d/s: %v", k.label, rate, err)
			failFrom(i, statusOf(err))
			return
		}
		res.add(offKey(rate, "offered"), k.key, st.offered)
		res.add(offKey(rate, "done"), k.key, st.done)
		res.add(offKey(rate, "dmed"), k.key, st.dmed)
		res.add(offKey(rate, "dmax"), k.key, st.dmax)
		if st.missing > 0 {
			// A job that never started has no latency: the percentiles
			// would be made up.
			res.fail(offKey(rate, "p50"), k.key, "timeout")
			res.fail(offKey(rate, "p99"), k.key, "timeout")
		} else {
			res.add(offKey(rate, "p50"), k.key, st.p50)
			res.add(offKey(rate, "p99"), k.key, st.p99)
		}
		ok := 0.0
		if st.sustained() {
			ok = 1
		} else {
			res.note("%s @ %s/s not sustained: %s", k.label, fmtInt(float64(rate)), strings.Join(st.why, "; "))
		}
		res.add(offKey(rate, "ok"), k.key, ok)
		logf("offered: %s @ %d/s: offered %.0f/s, completed %.0f/s, depth median %.0f max %.0f, p50 %.2f ms, p99 %.2f ms, sustained %v %v",
			k.label, rate, st.offered, st.done, st.dmed, st.dmax, st.p50, st.p99, st.sustained(), st.why)
		if st.saturated {
			if i+1 < len(rates) {
				failFrom(i+1, "not run")
				res.note("%s offered load: rates above %s/s not run: saturated at %s/s", k.label, fmtInt(float64(rate)), fmtInt(float64(rate)))
			}
			return
		}
		pause(phase, cfg.latSettle)
	}
	if d := rec.dups.Load(); d > 0 {
		res.note("%s offered load: %d job(s) started twice", k.label, d)
	}
}

// offeredOnce offers rate jobs/s for the warm-up and the measured window,
// with sequence numbers from on, then waits up to the drain time for every
// inserted job to start.
func offeredOnce(ctx context.Context, env *benchEnv, sys system, mon *monitor, rec *latRecorder, from int64, rate int) (offStep, error) {
	cfg := env.cfg
	var st offStep
	n := int(float64(rate) * (cfg.offeredWarmup + cfg.offeredDur).Seconds())
	p := startPacer(ctx, sys, rec, from, n, rate, cfg.producers)
	st.issued = int64(n)
	defer p.stop()

	pause(ctx, time.Until(p.start.Add(cfg.offeredWarmup)))
	c0, err := mon.completed(ctx)
	if err != nil {
		return st, err
	}
	i0, tA := p.inserted.Load(), time.Now()
	var ts, depth []float64
	tick := time.NewTicker(offeredEvery)
	defer tick.Stop()
	for {
		d, err := mon.ready(ctx)
		if err != nil {
			return st, err
		}
		ts, depth = append(ts, time.Since(tA).Seconds()), append(depth, float64(d))
		if time.Since(tA) >= cfg.offeredDur-offeredEvery/2 {
			break
		}
		select {
		case <-ctx.Done():
			return st, &timeoutError{what: "offered load: phase deadline passed"}
		case <-tick.C:
		}
	}
	c1, err := mon.completed(ctx)
	if err != nil {
		return st, err
	}
	i1, tB := p.inserted.Load(), time.Now()
	secs := tB.Sub(tA).Seconds()
	st.offered, st.done = float64(i1-i0)/secs, float64(c1-c0)/secs

	// The rest of the schedule (at most a tick or two) and the drain.
	p.stop()
	if err := p.firstErr(); err != nil {
		return st, fmt.Errorf("insert (%d failed): %w", p.errs.Load(), err)
	}
	st.missing = waitStarted(ctx, rec, int(from), n, cfg.offeredDrain)
	if err := ctx.Err(); err != nil {
		return st, err
	}
	lo, hi := int64(tA.Sub(rec.base))+1, int64(tB.Sub(rec.base))+1
	var lats []float64
	for s := from; s < from+int64(n); s++ {
		c := rec.commit[s].Load()
		if c < lo || c > hi {
			continue
		}
		if started := rec.start[s].Load(); started != 0 {
			lats = append(lats, float64(started-c)/1e6)
		}
	}
	slices.Sort(lats)
	st.p50, st.p99 = percentile(lats, 50), percentile(lats, 99)
	d0, d1 := depth[0], depth[len(depth)-1]
	slope := lsSlope(ts, depth)
	slices.Sort(depth)
	st.dmed, st.dmax = median(depth), depth[len(depth)-1]

	nominal := float64(rate)
	if st.offered < offeredKeep*nominal {
		st.why = append(st.why, fmt.Sprintf("the producers reached only %s jobs/s", fmtInt(st.offered)))
	}
	if st.done < offeredKeep*st.offered {
		st.why = append(st.why, fmt.Sprintf("completed %s jobs/s of %s offered", fmtInt(st.done), fmtInt(st.offered)))
	}
	if d1 > d0+offeredGrowth*nominal {
		st.why = append(st.why, fmt.Sprintf("queue depth grew from %s to %s", fmtInt(d0), fmtInt(d1)))
	}
	if slope > offeredSlope*nominal {
		st.why = append(st.why, fmt.Sprintf("queue depth rising by %s jobs/s", fmtInt(slope)))
	}
	switch {
	case st.missing > 0:
		st.why = append(st.why, fmt.Sprintf("%d jobs had not started %s after the last insert", st.missing, cfg.offeredDrain))
	case len(lats) == 0:
		st.why = append(st.why, "no job inserted in the window started")
	case st.p99 > offeredP99:
		st.why = append(st.why, fmt.Sprintf("pickup p99 %s ms > %.0f ms", fmtMs(st.p99), offeredP99))
	}
	st.saturated = st.missing > 0 || st.done < offeredSat*st.offered || st.offered < offeredSat*nominal
	return st, nil
}

// lsSlope is the least-squares slope of y over x.
func lsSlope(x, y []float64) float64 {
	if len(x) < 2 {
		return 0
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= float64(len(x))
	my /= float64(len(y))
	var num, den float64
	for i := range x {
		num += (x[i] - mx) * (y[i] - my)
		den += (x[i] - mx) * (x[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

// pacer releases jobs from..from+n-1 at rate jobs/s from its start: every
// offeredTick it hands each batch of offeredBatch jobs that has fallen due
// (job i is due at start + i/rate) to producers goroutines, which insert it
// with the system's bulk insert and record when the call returned. When the
// producers fall behind, batches wait for them (the measured offered rate
// shows it); what is still unreleased offeredLate after the schedule's end
// is dropped, so a saturated insert path cannot stretch the phase.
type pacer struct {
	start    time.Time
	inserted atomic.Int64 // jobs whose insert call returned
	errs     atomic.Int64 // failed insert calls
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	err      error
}

func startPacer(ctx context.Context, sys system, rec *latRecorder, from int64, n, rate, producers int) *pacer {
	p := &pacer{start: time.Now(), done: make(chan struct{})}
	ctx, p.cancel = context.WithCancel(ctx)
	batches := make(chan [2]int64, producers) // first seq, count
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for b := range batches {
				if err := sys.BulkInsert(ctx, b[0], int(b[1])); err != nil {
					if ctx.Err() == nil {
						p.errs.Add(1)
						p.mu.Lock()
						p.err = cmpOr(p.err, err)
						p.mu.Unlock()
					}
					continue
				}
				now := rec.now()
				for s := b[0]; s < b[0]+b[1]; s++ {
					rec.commit[s].Store(now)
				}
				p.inserted.Add(b[1])
			}
		})
	}
	go func() {
		defer close(p.done)
		defer wg.Wait()
		defer close(batches)
		tick := time.NewTicker(offeredTick)
		defer tick.Stop()
		issued := 0
		end := p.start.Add(time.Duration(float64(n)/float64(rate)*float64(time.Second)) + offeredLate)
		for issued < n && time.Now().Before(end) {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			due := min(n, int(float64(rate)*time.Since(p.start).Seconds()))
			for due-issued >= offeredBatch || (due == n && issued < n) {
				k := min(offeredBatch, n-issued)
				select {
				case batches <- [2]int64{from + int64(issued), int64(k)}:
				case <-ctx.Done():
					return
				}
				issued += k
			}
		}
	}()
	return p
}

// stop waits for the schedule to finish (or the context to end), then for
// the producers.
func (p *pacer) stop() {
	<-p.done
	p.cancel()
}

func (p *pacer) firstErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// cmpOr returns a unless it is nil, else b.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// offeredSummary adds each system's highest sustained rate and backlog's
// ratio to the best peer's.
func offeredSummary(cfg *config, kinds []kind, res *results) {
	best := map[string]float64{}
	for _, k := range kinds {
		if !k.workloads["offered"] || k.skip != "" {
			continue
		}
		ran := false
		for _, r := range cfg.offeredRates {
			c := res.byKey[offKey(r, "ok")].cells[k.key]
			if c.ok() {
				ran = true
				if c.median() == 1 {
					best[k.key] = float64(r)
				}
			}
		}
		if ran {
			res.add("off.max", k.key, best[k.key])
		} else {
			res.fail("off.max", k.key, "–")
		}
	}
	if _, ok := best["backlog"]; !ok {
		return
	}
	peer, peerRate := "", -1.0
	for _, k := range kinds {
		if slices.Contains(offeredPeers, k.key) && res.byKey["off.max"].cells[k.key].ok() && best[k.key] > peerRate {
			peer, peerRate = k.label, best[k.key]
		}
	}
	switch {
	case peer == "":
	case peerRate == 0:
		res.note("offered load: no peer sustained any rate offered, so backlog's ratio to the best peer is undefined (backlog sustained %s jobs/s)", fmtNone(best["backlog"]))
	default:
		res.add("off.peer", "backlog", best["backlog"]/peerRate)
		res.note("offered load: backlog sustained %s jobs/s, the best peer (%s) %s jobs/s: ×%s; a rate counts only as one of those offered (%s), so the ratio is as coarse as that list",
			fmtNone(best["backlog"]), peer, fmtInt(peerRate), fmtRatio(best["backlog"]/peerRate), ratesText(cfg.offeredRates))
	}
}

func ratesText(rates []int) string {
	var s []string
	for _, r := range rates {
		s = append(s, fmtInt(float64(r)))
	}
	return strings.Join(s, ", ") + " jobs/s"
}

// offeredDescription explains the offered-load rows.
func offeredDescription(c *config) string {
	return fmt.Sprintf("offered load: one ladder per system (not repeated by -runs; the whole workload is capped at %s), in one schema with its workers running throughout. At each rate (%s) %d producer goroutines insert on a fixed schedule: a pacer ticking every %s releases each batch of %d jobs that has fallen due (job i due at start + i/rate) to the producers, which insert it with the system's bulk insert (backlog EnqueueMany, River InsertManyFast, graphile-worker add_jobs; the same batches of %d for every system); batches that the producers cannot take yet wait (up to %s past the schedule's end, then the rest is dropped). After %s of warm-up, for %s: offered = jobs whose insert call returned ÷ window (measured, beside the nominal rate), completed = jobs completed in the window ÷ window, queue depth = the available count sampled every %s, pickup latency = handler start − the moment the insert call of the job's batch returned (as the pickup-latency rows; percentiles over the jobs inserted in the window, after waiting up to %s for them to start). Sustained = all of: offered ≥ %.0f %% of the nominal rate, completed ≥ %.0f %% of offered, depth at the end ≤ depth after the warm-up + %.2f s × rate, the depth's least-squares slope over the window ≤ %.0f %% of the rate per second (no steady growth), every job started and pickup p99 ≤ %.0f ms. Higher rates are not run once a system completes < %.0f %% of what was offered, its producers reach < %.0f %% of the rate, or its jobs do not all start within %s. Highest rate sustained: the highest of the rates offered that the system sustained; the ratio compares backlog's with the best of River default, River tuned and graphile-worker. graphile-worker's available count leaves out the jobs locked into its local queue.",
		c.offeredCap, ratesText(c.offeredRates), c.producers, offeredTick, offeredBatch, offeredBatch, offeredLate,
		c.offeredWarmup, c.offeredDur, offeredEvery, c.offeredDrain,
		100*offeredKeep, 100*offeredKeep, offeredGrowth, 100*offeredSlope, offeredP99, 100*offeredSat, 100*offeredSat, c.offeredDrain)
}
