// Package prefetch is a domain's buffer of jobs claimed ahead of demand,
// and the demand it is sized by. It is not safe for concurrent use: its
// owner (the acquirer) guards it with its mutex.
package prefetch

import (
	"math"
	"time"
)

// Buffer is a domain's buffer of jobs (of type T) claimed ahead of
// demand, and the demand it is sized by.
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
type Buffer[T any] struct {
	buf   []T       // claimed, not yet handed out; FIFO
	at    time.Time // when the jobs in buf were claimed (the last put)
	taken time.Time // the last hand-out from buf (Take)
	// Max is the largest size (0: no prefetch).
	Max int
	// Workers counts the worker goroutines of the Work calls that joined.
	Workers int

	rate     float64       // jobs handed out per second, moving average
	busy     float64       // workers busy (not waiting for a job), moving average
	claimDur time.Duration // claim time, moving average
	handed   int           // handed out since windowAt
	waited   float64       // worker-seconds spent waiting for a job since windowAt
	waitedAt time.Time     // when waited was last brought up to date
	windowAt time.Time
}

// Tick brings the waiting time up to now, with waiting workers waiting
// since the last tick. Call it before the number of waiting workers
// changes.
func (p *Buffer[T]) Tick(now time.Time, waiting int) {
	if !p.waitedAt.IsZero() {
		p.waited += now.Sub(p.waitedAt).Seconds() * float64(waiting)
	}
	p.waitedAt = now
}

// rateWindow is the shortest window a rate sample is taken over.
const rateWindow = 20 * time.Millisecond

// Target is how many jobs the buffer aims at.
func (p *Buffer[T]) Target() int {
	if p.Max <= 0 || p.rate <= 0 {
		return 0
	}
	demand := p.rate * float64(p.Workers) / max(p.busy, 1)
	// Rounded, not up: workers that take less than half a job during two
	// claims (slow handlers, or few workers: with claims of 2 ms, a domain
	// taking under 125 jobs a second) are not stocked a job that would
	// wait for one of them, held from other processes.
	return min(p.Max, int(math.Round(demand*2*p.claimDur.Seconds())))
}

// Low reports whether the buffer should be refilled without a
// waiting worker: it is below half its target.
func (p *Buffer[T]) Low() bool {
	t := p.Target()
	return t > 0 && len(p.buf) < (t+1)/2
}

// Deficit is how many jobs a claim adds for the buffer, besides
// those for the waiting workers.
func (p *Buffer[T]) Deficit() int {
	return max(0, p.Target()-len(p.buf))
}

// Take hands out the oldest buffered job with the time it spent in the
// buffer (queue latency too); ok is false when the buffer is empty.
func (p *Buffer[T]) Take(now time.Time) (j T, buffered time.Duration, ok bool) {
	if len(p.buf) == 0 {
		return j, 0, false
	}
	var zero T
	j = p.buf[0]
	p.buf[0] = zero
	p.buf = p.buf[1:]
	if len(p.buf) == 0 {
		p.buf = nil
	}
	p.handed++
	p.taken = now
	return j, now.Sub(p.at), true
}

// Idle reports whether the buffer holds jobs of which none was handed out
// for at least d: since its last hand-out, or since the jobs came when
// none was handed out after them.
func (p *Buffer[T]) Idle(now time.Time, d time.Duration) bool {
	return len(p.buf) > 0 && now.Sub(p.taken) >= d && now.Sub(p.at) >= d
}

// Forget drops the demand measured so far (the buffer aims at nothing
// until a claim for waiting workers measures it again).
func (p *Buffer[T]) Forget() {
	p.rate, p.busy, p.handed, p.waited = 0, 0, 0, 0
	p.windowAt = time.Time{}
}

// Hand counts a job handed straight from a claim.
func (p *Buffer[T]) Hand() { p.handed++ }

// Put adds claimed jobs no waiting worker took.
func (p *Buffer[T]) Put(jobs []T) {
	if len(jobs) == 0 {
		return
	}
	p.buf = append(p.buf, jobs...)
	p.at = time.Now()
}

// Drain empties the buffer and returns its jobs.
func (p *Buffer[T]) Drain() []T {
	jobs := p.buf
	p.buf = nil
	return jobs
}

// StartClaim samples, at the start of a claim, the hand-out rate and
// how many workers were busy rather than waiting, on average, since the
// last sample.
func (p *Buffer[T]) StartClaim(now time.Time, waiting int) {
	p.Tick(now, waiting)
	if p.windowAt.IsZero() {
		p.windowAt, p.waited = now, 0
		return
	}
	window := now.Sub(p.windowAt)
	if window < rateWindow {
		return
	}
	busy := max(float64(p.Workers)-p.waited/window.Seconds(), 0)
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

// Claimed records how long a claim took.
func (p *Buffer[T]) Claimed(d time.Duration) {
	if p.claimDur == 0 {
		p.claimDur = d
	} else {
		p.claimDur += (d - p.claimDur) * 3 / 10
	}
}

// Len is how many jobs the buffer holds.
func (p *Buffer[T]) Len() int { return len(p.buf) }

// Remove takes the jobs for which out reports true out of the buffer,
// keeping the others' order, and returns them.
func (p *Buffer[T]) Remove(out func(T) bool) []T {
	var gone []T
	keep := p.buf[:0]
	for _, j := range p.buf {
		if out(j) {
			gone = append(gone, j)
		} else {
			keep = append(keep, j)
		}
	}
	clear(p.buf[len(keep):])
	p.buf = keep
	return gone
}

// Jobs returns a copy of the buffered jobs, oldest first.
func (p *Buffer[T]) Jobs() []T { return append([]T(nil), p.buf...) }
