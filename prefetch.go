package backlog

import (
	"math"
	"time"
)

// prefetch is a domain's buffer of jobs claimed ahead of demand, and the
// demand it is sized by. All of it is guarded by the acquirer's mutex.
//
// Why: one claim runs per domain at a time, and a claim of a few hundred
// jobs takes milliseconds. Without a buffer, workers whose handlers are
// quick wait out every claim, and a claim takes at most as many jobs as
// workers wait; so throughput would be capped by Concurrency.
//
// Sizing: the buffer aims at what the domain's workers would take during
// two claims if jobs were always there, and at most max (the largest
// Prefetch of the Work calls that joined). That demand comes from moving
// averages of the hand-out rate, of how many workers are busy rather than
// waiting, and of the claim time (Little's law: a worker's time per job is
// busy/rate, so all workers together could take rate*workers/busy).
// Handlers that take a second each need about nothing in stock, and keep
// nothing back from other processes; no-op handlers, whose workers mostly
// wait, get the whole max.
type prefetch struct {
	buf     []*claimed // claimed, not yet handed out; FIFO
	at      time.Time  // when the jobs in buf were claimed (the last put)
	max     int        // largest size (0: no prefetch)
	workers int        // worker goroutines of the Work calls that joined

	rate     float64       // jobs handed out per second, moving average
	busy     float64       // workers busy (not waiting for a job), moving average
	claimDur time.Duration // claim time, moving average
	handed   int           // handed out since windowAt
	waited   float64       // worker-seconds spent waiting for a job since windowAt
	waitedAt time.Time     // when waited was last brought up to date
	windowAt time.Time
}

// tickLocked brings the waiting time up to now, with waiting workers
// waiting since the last tick. Call it before the number of waiting
// waiting workers changes.
func (p *prefetch) tickLocked(now time.Time, waiting int) {
	if !p.waitedAt.IsZero() {
		p.waited += now.Sub(p.waitedAt).Seconds() * float64(waiting)
	}
	p.waitedAt = now
}

// rateWindow is the shortest window a rate sample is taken over.
const rateWindow = 20 * time.Millisecond

// targetLocked is how many jobs the buffer aims at.
func (p *prefetch) targetLocked() int {
	if p.max <= 0 || p.rate <= 0 {
		return 0
	}
	demand := p.rate * float64(p.workers) / max(p.busy, 1)
	return min(p.max, int(math.Ceil(demand*2*p.claimDur.Seconds())))
}

// lowLocked reports whether the buffer should be refilled without a
// waiting waiting worker: it is below half its target.
func (p *prefetch) lowLocked() bool {
	t := p.targetLocked()
	return t > 0 && len(p.buf) < (t+1)/2
}

// deficitLocked is how many jobs a claim adds for the buffer, besides
// those for the waiting waiting workers.
func (p *prefetch) deficitLocked() int {
	return max(0, p.targetLocked()-len(p.buf))
}

// takeLocked hands out the oldest buffered job, or nil.
func (p *prefetch) takeLocked(now time.Time) *claimed {
	if len(p.buf) == 0 {
		return nil
	}
	j := p.buf[0]
	p.buf[0] = nil
	p.buf = p.buf[1:]
	if len(p.buf) == 0 {
		p.buf = nil
	}
	j.Waited += now.Sub(p.at) // the time in the buffer is queue latency too
	p.handed++
	return j
}

// handLocked counts a job handed straight from a claim.
func (p *prefetch) handLocked(*claimed, time.Time) { p.handed++ }

// putLocked adds claimed jobs no waiting worker took.
func (p *prefetch) putLocked(jobs []*claimed) {
	if len(jobs) == 0 {
		return
	}
	p.buf = append(p.buf, jobs...)
	p.at = time.Now()
}

// drainLocked empties the buffer and returns its jobs.
func (p *prefetch) drainLocked() []*claimed {
	jobs := p.buf
	p.buf = nil
	return jobs
}

// startClaimLocked samples, at the start of a claim, the hand-out rate and
// how many workers were busy rather than waiting, on average, since the
// last sample.
func (p *prefetch) startClaimLocked(now time.Time, waiting int) {
	p.tickLocked(now, waiting)
	if p.windowAt.IsZero() {
		p.windowAt, p.waited = now, 0
		return
	}
	window := now.Sub(p.windowAt)
	if window < rateWindow {
		return
	}
	busy := max(float64(p.workers)-p.waited/window.Seconds(), 0)
	p.busy += 0.3 * (busy - p.busy)
	p.waited = 0
	sample := float64(p.handed) / window.Seconds()
	switch {
	case p.rate == 0:
		p.rate = sample
	case sample > p.rate:
		p.rate += 0.5 * (sample - p.rate)
	default:
		p.rate += 0.2 * (sample - p.rate)
	}
	p.handed, p.windowAt = 0, now
}

// claimedLocked records how long a claim took.
func (p *prefetch) claimedLocked(d time.Duration) {
	if p.claimDur == 0 {
		p.claimDur = d
	} else {
		p.claimDur += (d - p.claimDur) * 3 / 10
	}
}
