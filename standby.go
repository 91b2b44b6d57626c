package backlog

import (
	"math"
	"slices"
	"time"
)

// Standby jobs (migration 0029) keep the handlers of a binding
// concurrency limit running back to back.
//
// Since migration 0028 a slot is free for its process's next claim once
// its handler ends, but the next handler still waits for that claim (the
// type's claim lock, the count, a synchronous commit). So while a limit
// binds, a domain's claims also take a few standby jobs beyond it: jobs
// claimed and leased like any other, that hold no slot and run no handler.
// When a handler of the type ends, its worker takes the oldest standby job
// of the type (takeStandby) and runs it in the ended job's slot at once,
// with no round trip; the claims that follow, in the background, refill
// the standby jobs.
//
// Why the limit still holds across processes: a standby job's token is
// passed with the ended jobs' (leases.Ended), so the process's own claims
// leave it out of the count until it is handed a slot; other processes
// count it as running (fewer slots for them, never more). A hand-over
// takes the standby job out of those tokens and puts the ended job's in,
// as for any ended job. A claim in flight read the tokens before: for it
// the ended job's row, still running, stands for the slot, so the ended
// job's outcome is written only once every such claim has ended
// (leases.afterReaders). The database gives standby jobs only to
// a claim that leaves no slot free under a limit not exceeded, of a type
// with neither a key limit nor a rate, whose jobs have no concurrency
// keys, from a process that holds a slot of the type and no more than its
// share of the slots (the limit over the live processes that work the
// type): a process hands its slots to its own standby jobs, so beyond its
// share they would stay with it while other processes wait. A hand-over
// reads no limit: a limit lowered by another process binds them once the
// process hears of it (drop: its NOTIFY, or within flowWatch), as it
// binds a prefetch buffer.
//
// The standby jobs are few: about the slot ends of four claims' time, at
// most half the domain's workers (and maxStandby), and none for handlers
// that end seldom (standbySizer.target). They go back when the limit
// stops binding, when one has waited a second (idleStandbyLocked), with
// the domain's buffer when its last Work call leaves or the acquirer
// closes, and on a pause or a tightened limit of their type (drop).

// maxStandby bounds a domain's standby jobs.
const maxStandby = 64

// standbySizer measures what sizes a domain's standby jobs: how often a
// handler of a binding limit ends in it (a hand-over's chance) and how
// long its claims take.
type standbySizer struct {
	ends     int       // slot ends since at
	at       time.Time // the start of the current sample's window
	rate     float64   // slot ends per second, moving average
	claimDur time.Duration
}

// sample takes a rate sample at a claim's start (windows of at least
// rateWindow).
func (z *standbySizer) sample(now time.Time) {
	if z.at.IsZero() {
		z.at, z.ends = now, 0
		return
	}
	window := now.Sub(z.at)
	if window < 20*time.Millisecond {
		return
	}
	sample := float64(z.ends) / window.Seconds()
	if sample > z.rate {
		z.rate += 0.5 * (sample - z.rate)
	} else {
		z.rate += 0.2 * (sample - z.rate)
	}
	z.at, z.ends = now, 0
}

// claimed records how long a claim took.
func (z *standbySizer) claimed(d time.Duration) {
	if z.claimDur == 0 {
		z.claimDur = d
	} else {
		z.claimDur += (d - z.claimDur) * 3 / 10
	}
}

// target is how many standby jobs a domain of workers worker goroutines
// aims at: the slot ends of four claims' time (a claim to refill them
// starts once they are below it, and may wait for the claim in flight),
// rounded, and at most half the workers. Handlers that end seldom get none
// (a limit of 50 with 4 ms claims: under about 30 ends a second, a
// second-long handler each): a claim's round trip is a small part of
// their slots' time, and no job waits in standby for them.
func (z *standbySizer) target(workers int) int {
	return min(int(math.Round(z.rate*4*z.claimDur.Seconds())), workers/2, maxStandby)
}

// standbyDeficitLocked is how many standby jobs the domain's next claim
// asks for: none unless its limit binds.
func (d *domain) standbyDeficitLocked() int {
	if !d.saturated {
		return 0
	}
	return max(0, d.sb.target(d.pre.Workers)-len(d.standby))
}

// standbyLowLocked reports whether the domain's limit binds and it holds
// fewer standby jobs than it aims at: it claims without a waiting worker.
func (d *domain) standbyLowLocked() bool {
	return d.saturated && len(d.standby) < d.sb.target(d.pre.Workers)
}

// putStandbyLocked adds standby jobs claimed at now, and has the flow
// epoch watched while the domain holds them.
func (a *acquirer) putStandbyLocked(d *domain, jobs []*claimed, now time.Time) {
	for _, j := range jobs {
		d.standby = append(d.standby, j)
		d.standbyAt = append(d.standbyAt, now)
	}
	if len(jobs) > 0 && a.flow.watch == nil && !a.flow.watching {
		a.flow.watch = a.afterFuncLocked(flowWatch, a.watchFlowLocked)
	}
}

// dropStandbyLocked takes the domain's standby jobs of the given types
// (nil: all) out of it and returns them, for the caller to give back.
func (d *domain) dropStandbyLocked(types []string) []*claimed {
	var out []*claimed
	keep, keepAt := d.standby[:0], d.standbyAt[:0]
	for i, j := range d.standby {
		if types == nil || slices.Contains(types, j.Type) {
			out = append(out, j)
			continue
		}
		keep, keepAt = append(keep, j), append(keepAt, d.standbyAt[i])
	}
	clear(d.standby[len(keep):])
	d.standby, d.standbyAt = keep, keepAt
	return out
}

// takeStandby is called by a worker of spec's domain whose handler of a
// job of type typ holding a slot of a concurrency limit has ended: it
// returns the domain's oldest standby job of typ, to run in that slot
// (leases.end hands it the slot), or nil. The time the job spent standing
// by counts as queue latency. Standby jobs are claimed only for domains
// whose limit binds (and given back when it stops binding), and their
// sizing counts the ends only then: without such a domain it returns at
// once, without a.mu, as slotEnded does (the end of every job of a limited
// type calls it).
func (a *acquirer) takeStandby(spec *domainSpec, typ string) *claimed {
	if a.saturated.Load() == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.domains[spec.key]
	if d == nil || a.closed {
		return nil
	}
	d.sb.ends++
	i := slices.IndexFunc(d.standby, func(j *claimed) bool { return j.Type == typ })
	if i < 0 {
		return nil
	}
	j := d.standby[i]
	j.Waited += time.Since(d.standbyAt[i])
	d.standby = slices.Delete(d.standby, i, i+1)
	d.standbyAt = slices.Delete(d.standbyAt, i, i+1)
	if d.standbyLowLocked() {
		a.wakeLocked(d)
	}
	return j
}

// idleStandbyLocked takes the domain's standby jobs that have waited for a
// flowWatch or longer out of it, and drops the rate they were sized by:
// the process holds no slot of their type to hand them any more (a Work
// call of several types may be busy with the others), or its handlers now
// end seldom. The caller gives them back.
func (d *domain) idleStandbyLocked(now time.Time) []*claimed {
	var out []*claimed
	keep, keepAt := d.standby[:0], d.standbyAt[:0]
	for i, j := range d.standby {
		if now.Sub(d.standbyAt[i]) >= flowWatch {
			out = append(out, j)
			continue
		}
		keep, keepAt = append(keep, j), append(keepAt, d.standbyAt[i])
	}
	clear(d.standby[len(keep):])
	d.standby, d.standbyAt = keep, keepAt
	if len(out) > 0 {
		d.sb.rate = 0
	}
	return out
}

// returnStandby puts back a standby job takeStandby returned that was
// not handed the slot (leases.end): first in line again, or given back
// when its domain is gone or it cannot run (gone: its lease is lost, or it
// was held back or cancelled).
func (a *acquirer) returnStandby(spec *domainSpec, j *claimed, gone bool) {
	a.mu.Lock()
	d := a.domains[spec.key]
	if d != nil && !a.closed && !gone {
		d.standby = slices.Insert(d.standby, 0, j)
		d.standbyAt = slices.Insert(d.standbyAt, 0, time.Now())
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	a.store.release([]*claimed{j})
}
