// Package outage turns a database outage into a few log lines and
// counts its errors, for every background loop of a Queue.
package outage

import (
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backlogq/backlog/internal/pgerr"
)

// Tracker turns a database outage into a few log lines: when the
// database stops answering, every background loop of a Queue (claims, the
// completer, the heartbeat, the sweep, the notifier, the listener, …)
// fails at its own pace, and a line per failed statement made 230 to 300
// warnings of one outage. Instead, the first transient failure logs that
// an outage began (what failed, and why), later ones are only counted
// (a reminder with the counts once a minute while it lasts), and the
// outage ends, with one line giving its length and the counts, once every
// loop that failed has succeeded again. Errors tied to one job's row are
// not transient: they are still logged where they happen.
//
// The counts are kept for Stats (DatabaseErrors). A nil *Tracker logs
// nothing and counts nothing: its callers log their own errors.
type Tracker struct {
	log    *slog.Logger
	active atomic.Bool  // an outage is under way (read without the lock by ok)
	errors atomic.Int64 // every transient failure since New
	ended  atomic.Int64 // outages that began and ended

	mu       sync.Mutex
	since    time.Time
	failing  map[string]bool  // loops that failed and have not succeeded since
	counts   map[string]int64 // failures of the current outage, by loop
	reminded time.Time
}

// outageReminder is how often a long outage is logged again, with its
// counts so far.
const outageReminder = time.Minute

func New(log *slog.Logger) *Tracker {
	return &Tracker{log: log, failing: map[string]bool{}, counts: map[string]int64{}}
}

// Failed records a failure of the loop named what. For a transient error
// (the database unreachable, restarting, a timeout) it logs the outage's
// start, or only counts it, and reports true; for any other error it does
// nothing and reports false, and the caller logs it.
func (o *Tracker) Failed(what string, err error) bool {
	if o == nil || !pgerr.Transient(err) {
		return false
	}
	o.errors.Add(1)
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failing[what] = true
	o.counts[what]++
	if !o.active.Load() {
		o.active.Store(true)
		o.since, o.reminded = now, now
		o.log.Warn("backlog: database errors began; retrying (further errors are counted, not logged, until every part of the queue works again)",
			"failing", what, "err", err)
		return true
	}
	if now.Sub(o.reminded) >= outageReminder {
		o.reminded = now
		o.log.Warn("backlog: database errors go on", "for", now.Sub(o.since).Round(time.Millisecond),
			"errors", o.total(), "by", o.byLoop(), "err", err)
	}
	return true
}

// OK records a success of the loop named what: the outage ends when no
// loop that failed during it is still failing. Without an outage it costs
// one atomic load.
func (o *Tracker) OK(what string) {
	if o == nil || !o.active.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.failing[what] {
		return
	}
	delete(o.failing, what)
	if len(o.failing) > 0 {
		return
	}
	o.log.Warn("backlog: database errors ended", "after", time.Since(o.since).Round(time.Millisecond),
		"errors", o.total(), "by", o.byLoop())
	o.active.Store(false)
	o.ended.Add(1)
	o.counts = map[string]int64{}
}

// total counts the current outage's failures (o.mu held).
func (o *Tracker) total() int64 {
	var n int64
	for _, c := range o.counts {
		n += c
	}
	return n
}

// byLoop lists the current outage's failures by loop, as "name=n" (o.mu
// held).
func (o *Tracker) byLoop() []string {
	out := make([]string, 0, len(o.counts))
	for k, n := range o.counts {
		out = append(out, k+"="+strconv.FormatInt(n, 10))
	}
	sort.Strings(out)
	return out
}

// Snapshot returns the counts Stats reports.
func (o *Tracker) Snapshot() Counts {
	if o == nil {
		return Counts{}
	}
	d := Counts{Total: o.errors.Load(), Outages: o.ended.Load()}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.active.Load() {
		since := o.since
		d.FailingSince = &since
		d.Outages++
	}
	return d
}

// Counts are a Tracker's counts (the Queue's Stats reports them as
// DatabaseErrors, which has the same fields).
type Counts struct {
	// Total is how many statements failed that way since New.
	Total int64
	// Outages is how many outages there were (one under way included).
	Outages int64
	// FailingSince is when the outage under way began, nil when none is.
	FailingSince *time.Time
}
