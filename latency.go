package backlog

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// Latency is the spread of one type's wait and run times over the jobs
// that finished in a window, read from the per-minute and per-hour
// counters (never from job_history): what Queue.Latency returns.
//
// The counters keep a histogram per minute (then per hour) with four
// slots per doubling of milliseconds, so each percentile is exact to
// within about 9 %, and reading it costs the same however many jobs
// finished. Jobs finished before schema version 23, or counted by a
// previous version's roll-up during a rolling upgrade, are not in it.
type Latency struct {
	Type string
	// Waited is the number of jobs in Wait: those that started.
	Waited int64
	// Wait is the time from a job's due time (run_at) to the start of
	// its last attempt.
	Wait Percentiles
	// Ran is the number of jobs in Run.
	Ran int64
	// Run is the run time of a job's last attempt.
	Run Percentiles
}

// Percentiles of a duration; zero when no job was counted.
type Percentiles struct {
	P50, P95, P99 time.Duration
}

// Latency returns, by type (in type order), the percentiles of the wait
// and run times of the jobs that finished since `since` (on the database
// clock; to the whole hour when `since` is more than two hours ago, as
// Throughput). Minute counts are kept for two hours, hour counts for 90
// days.
func (q *Queue) Latency(ctx context.Context, since time.Time) ([]Latency, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	hs, err := q.readsFor(ctx).Latency(ctx, since)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading latencies: %w", err))
	}
	out := make([]Latency, 0, len(hs))
	for _, h := range hs {
		l := Latency{Type: h.Type}
		l.Waited, l.Wait = percentilesOf(h.Wait)
		l.Ran, l.Run = percentilesOf(h.Run)
		out = append(out, l)
	}
	return out, nil
}

// percentilesOf reads the 50th, 95th and 99th percentiles from a
// histogram of store.LatencyHists, and returns how many values it holds.
func percentilesOf(h []int64) (int64, Percentiles) {
	var n int64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0, Percentiles{}
	}
	return n, Percentiles{P50: histQuantile(h, n, 0.50), P95: histQuantile(h, n, 0.95), P99: histQuantile(h, n, 0.99)}
}

// histQuantile is the q-quantile of the n values counted in h: the value
// of rank ceil(q*n), placed linearly within its slot.
func histQuantile(h []int64, n int64, q float64) time.Duration {
	rank := int64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var seen int64
	for i, c := range h {
		if c == 0 || seen+c < rank {
			seen += c
			continue
		}
		lo, hi := latencySlotBounds(i)
		ms := lo + (hi-lo)*(float64(rank-seen)-0.5)/float64(c)
		return time.Duration(ms * float64(time.Millisecond))
	}
	lo, _ := latencySlotBounds(len(h) - 1)
	return time.Duration(lo * float64(time.Millisecond))
}

// latencySlotBounds are the milliseconds slot i of a latency histogram
// covers, [lo, hi), as finish() of migration 23 fills it.
func latencySlotBounds(i int) (lo, hi float64) {
	return math.Exp2(float64(i)/store.LatencySlotsPerDoubling) - 1, math.Exp2(float64(i+1)/store.LatencySlotsPerDoubling) - 1
}
