package main

import (
	"math"
	"time"
)

// Tolerances of the issue: throughput within 10 %, sizes at most doubling.
const (
	flatTolerance = 0.10
	sizeGrowthMax = 2.0
	// recoveryRun is how many windows in a row must be back for the
	// throughput to count as recovered.
	recoveryRun = 3
)

// window returns the samples whose scheduled end falls in (from, to].
func window(ss []sample, from, to time.Duration) []sample {
	var out []sample
	for _, s := range ss {
		if s.mark > from && s.mark <= to {
			out = append(out, s)
		}
	}
	return out
}

// perSecond is the count per second over samples (false: none).
func perSecond(ss []sample, count func(sample) int64) (float64, bool) {
	var n int64
	var secs float64
	for _, s := range ss {
		n += count(s)
		secs += s.span.Seconds()
	}
	if secs == 0 {
		return 0, false
	}
	return float64(n) / secs, true
}

func completedOf(s sample) int64 { return s.completed }
func enqueuedOf(s sample) int64  { return s.enqueued }

// flatCheck compares the throughput of the first and last windows.
type flatCheck struct {
	ok                  bool // both windows have samples
	first, last         float64
	firstEnq, lastEnq   float64
	ratio               float64
	pass                bool
	from2, to1, w, span time.Duration
}

func checkFlat(ss []sample, w, d time.Duration) flatCheck {
	c := flatCheck{w: w, span: d, to1: w, from2: d - w}
	a, b := window(ss, 0, w), window(ss, d-w, d)
	var ok1, ok2 bool
	c.first, ok1 = perSecond(a, completedOf)
	c.last, ok2 = perSecond(b, completedOf)
	c.firstEnq, _ = perSecond(a, enqueuedOf)
	c.lastEnq, _ = perSecond(b, enqueuedOf)
	// The last window must be complete: an interrupted phase has no verdict.
	c.ok = ok1 && ok2 && c.first > 0 && len(b) > 0 && b[len(b)-1].mark == d
	if c.ok {
		c.ratio = c.last / c.first
		c.pass = math.Abs(c.ratio-1) <= flatTolerance
	}
	return c
}

// sizeRow is one relation's size over a phase.
type sizeRow struct {
	name                   string
	atW, atLastW, end, max int64
	checked, bounded       bool
}

// checkSizes reports each size at the end of the first window, at the end
// and at most, and whether the end is at most sizeGrowthMax times the
// first.
func checkSizes(res *phaseResult, w time.Duration) []sizeRow {
	ss := res.samples
	if len(ss) == 0 {
		return nil
	}
	var early, lastW *sample
	for i := range ss {
		if ss[i].mark <= w {
			early = &ss[i]
		}
		if ss[i].mark <= res.planned-w {
			lastW = &ss[i]
		}
	}
	last := ss[len(ss)-1]
	row := func(name string, f func(dbSample) int64, checked bool) sizeRow {
		r := sizeRow{name: name, end: f(last.db), checked: checked && early != nil && last.mark > w}
		for _, s := range ss {
			r.max = max(r.max, f(s.db))
		}
		if early != nil {
			r.atW = f(early.db)
		}
		if lastW != nil {
			r.atLastW = f(lastW.db)
		}
		if r.checked {
			r.bounded = float64(r.end) <= sizeGrowthMax*float64(r.atW)
		}
		return r
	}
	rows := []sizeRow{
		row("jobs: table (main fork)", func(d dbSample) int64 { return d.heap }, true),
	}
	for i, n := range res.indexNames {
		rows = append(rows, row("index "+n, func(d dbSample) int64 {
			if i < len(d.idx) {
				return d.idx[i]
			}
			return 0
		}, true))
	}
	rows = append(rows,
		row("jobs: all indexes", dbSample.indexTotal, true),
		row("jobs: total (pg_total_relation_size)", func(d dbSample) int64 { return d.total }, true),
		row("job_history: all partitions (grows by design: completed jobs are kept 24 h)", func(d dbSample) int64 { return d.history }, false),
	)
	return rows
}

// holdAnalysis is what the held transaction did to the queue.
type holdAnalysis struct {
	ok                      bool
	at, end                 time.Duration // nominal start and end of the hold
	pre, during, after      float64       // completed/s before (one window), during, after the hold
	preFrom                 time.Duration
	minRate                 float64 // the slowest window from the hold's start on
	minMark                 time.Duration
	fell                    bool          // some window from the hold's start on was below 90 % of pre
	floorBack, bandBack     time.Duration // after the hold's end: back ≥ 90 % / within ±10 % (recoveryRun windows in a row); -1: never
	preDepthMax             int64
	depthMax                int64         // from the hold's start on
	depthLimit              int64         // preDepthMax plus one second of arrivals
	depthBack               time.Duration // after the hold's end: available back ≤ depthLimit; -1: never
	preClaimP99, claimP99   time.Duration // the worst 10-s p99 before / from the hold's start on
	preHeap, preIdx         int64
	maxHeap, maxIdx         int64
	endHeap, endIdx         int64
	holdEndHeap, holdEndIdx int64
	preDead, maxDead        int64
}

func analyzeHold(ss []sample, at, length, w, d time.Duration, rate float64) holdAnalysis {
	h := holdAnalysis{at: at, end: at + length, floorBack: -1, bandBack: -1, depthBack: -1, preFrom: max(at-w, 0)}
	pre := window(ss, h.preFrom, at)
	var ok bool
	if h.pre, ok = perSecond(pre, completedOf); !ok || h.pre == 0 {
		return h
	}
	h.ok = true
	h.during, _ = perSecond(window(ss, at, h.end), completedOf)
	h.after, _ = perSecond(window(ss, h.end, d), completedOf)
	for _, s := range pre {
		h.preDepthMax = max(h.preDepthMax, s.db.available)
		h.preClaimP99 = max(h.preClaimP99, s.claim.p99)
		h.preHeap, h.preIdx, h.preDead = s.db.heap, s.db.indexTotal(), max(h.preDead, s.db.dead)
	}
	from := window(ss, at, d)
	h.minRate = math.Inf(1)
	for _, s := range from {
		if r := s.rate(); r < h.minRate {
			h.minRate, h.minMark = r, s.mark
		}
		h.fell = h.fell || s.rate() < (1-flatTolerance)*h.pre
		h.depthMax = max(h.depthMax, s.db.available)
		h.claimP99 = max(h.claimP99, s.claim.p99)
		h.maxHeap, h.maxIdx, h.maxDead = max(h.maxHeap, s.db.heap), max(h.maxIdx, s.db.indexTotal()), max(h.maxDead, s.db.dead)
		h.endHeap, h.endIdx = s.db.heap, s.db.indexTotal()
		if s.mark <= h.end {
			h.holdEndHeap, h.holdEndIdx = s.db.heap, s.db.indexTotal()
		}
	}
	after := window(ss, h.end, d)
	h.floorBack = backAfter(after, h.end, func(s sample) bool { return s.rate() >= (1-flatTolerance)*h.pre })
	h.bandBack = backAfter(after, h.end, func(s sample) bool { return math.Abs(s.rate()/h.pre-1) <= flatTolerance })
	h.depthLimit = h.preDepthMax + int64(rate)
	for _, s := range after {
		if s.db.available <= h.depthLimit {
			h.depthBack = s.mark - h.end
			break
		}
	}
	return h
}

// backAfter returns how long after end the first window of recoveryRun in a
// row (or of all that are left, when fewer) that satisfy good ends; -1 when
// none does.
func backAfter(after []sample, end time.Duration, good func(sample) bool) time.Duration {
	for i := range after {
		run := after[i:min(i+recoveryRun, len(after))]
		all := true
		for _, s := range run {
			all = all && good(s)
		}
		if all {
			return after[i].mark - end
		}
	}
	return -1
}
