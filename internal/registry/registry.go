// Package registry keeps this process's row in the processes table
// (Queue.Processes reads them): it exists from the first Work call to
// Close, and the heartbeat writes it (carried in its lease renewal, or
// alone).
package registry

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// WorkRow is a Work call as stored in processes.works (the same fields, so
// that one converts to the other).
type WorkRow struct {
	Types       []string          `json:"types"`
	Tags        map[string]string `json:"tags,omitempty"`
	Concurrency int               `json:"concurrency"`
	Prefetch    int               `json:"prefetch"`
	Running     int               `json:"running"`
}

// Work is a Work call as the registry lists it.
type Work interface {
	WorkRow() WorkRow // the call's types, tags, limits and running handlers now
}

// unregisterTimeout bounds the deletion of the process's row in Close: a
// row left behind drops out once it is three leases old.
const unregisterTimeout = 5 * time.Second

// Registry is this process's row in the processes table, a service. The
// row exists from the first Work call to Close. Every write of it happens
// on the heartbeat's goroutine (the heartbeat carries it in its lease
// renewal, or writes it alone: see leases.heartbeat), except the deletion
// in stop, which the Queue runs after the heartbeat stopped.
type Registry struct {
	store  *store.Store
	log    *slog.Logger
	faults *outage.Tracker
	every  time.Duration // heartbeat interval
	row    store.Process // its constant part
	// kick asks the heartbeat to write the row now (Work calls came or
	// went); buffer of 1, so join and leave never block.
	kick chan struct{}

	mu      sync.Mutex
	works   []Work
	joined  bool      // a Work call started: the row should exist
	gen     uint64    // bumped by every change of works
	written uint64    // gen of the last row written
	tried   time.Time // when a write was last attempted
	// missed: the last write reached the database but found no row of
	// ours to refresh; write it whole at once.
	missed bool
	// foreign: another live process holds the worker ID (warned once).
	foreign bool
}

func New(st *store.Store, log *slog.Logger, faults *outage.Tracker, workerID, instance string, lease time.Duration) *Registry {
	host, _ := os.Hostname()
	return &Registry{store: st, log: log, faults: faults, every: lease / 3, kick: make(chan struct{}, 1),
		row: store.Process{Worker: workerID, Instance: instance, Host: host, PID: os.Getpid(), Lease: lease}}
}

// stop deletes the row. The Queue calls it after the heartbeat stopped and
// every Work call returned, so nothing writes the row again.
func (r *Registry) Stop() {
	r.mu.Lock()
	joined := r.joined
	r.joined = false
	r.mu.Unlock()
	if !joined {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unregisterTimeout)
	defer cancel()
	if err := r.store.Unregister(ctx, r.row.Worker, r.row.Instance); err != nil {
		r.log.Warn("backlog: removing this process from the processes table failed; it drops out after three leases",
			"worker", r.row.Worker, "err", err)
	}
}

// join adds a Work call to the row; leave removes it.
func (r *Registry) Join(w Work) {
	r.mu.Lock()
	r.works = append(r.works, w)
	r.joined = true
	r.gen++
	r.mu.Unlock()
	r.wake()
}

func (r *Registry) Leave(w Work) {
	r.mu.Lock()
	for i, x := range r.works {
		if x == w {
			r.works = append(r.works[:i], r.works[i+1:]...)
			break
		}
	}
	r.gen++
	r.mu.Unlock()
	r.wake()
}

// Kick tells when the row should be written now (Work calls came or
// went): the heartbeat's loop selects on it.
func (r *Registry) Kick() <-chan struct{} { return r.kick }

func (r *Registry) wake() {
	run.Wake(r.kick)
}

// Beat is one write of the row.
type Beat struct {
	Row store.Process
	gen uint64
}

// due returns the row to write now, or nil when no write is due: none is
// until a Work call starts; then one a heartbeat, one when Work calls come
// or go, and one right after a write that found no row to refresh. A
// write that failed is tried again at the next heartbeat, not sooner, so
// that an unreachable database never holds the heartbeat up more than
// once a beat. leased is how many leases the process holds.
func (r *Registry) Due(leased int) *Beat {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A little under the interval, so that the heartbeat's own timer
	// always finds it due.
	if !r.joined || (r.written == r.gen && !r.missed && time.Since(r.tried) < r.every*9/10) {
		return nil
	}
	r.tried, r.missed = time.Now(), false
	works := make([]WorkRow, len(r.works))
	running := 0
	for i, w := range r.works {
		works[i] = w.WorkRow()
		running += works[i].Running
		if len(works[i].Tags) == 0 {
			works[i].Tags = nil
		}
	}
	b := &Beat{Row: r.row, gen: r.gen}
	b.Row.Works, _ = json.Marshal(works) // strings, maps of strings and ints: cannot fail
	b.Row.Running, b.Row.Leased = running, leased
	return b
}

// carried records what a lease renewal that carried b did with it:
// wrote the row, or found none of ours to refresh (or failed for a reason
// that may be the row's): then the row is written alone at once.
func (r *Registry) Carried(b *Beat, wrote bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if wrote {
		r.written = b.gen
	} else {
		r.missed = true
	}
}

// write writes the row alone, if it is due (see due): the first write,
// a change of Work calls, a heartbeat that held no lease to carry it, or
// one whose renewal missed it. It gives up after a tenth of a lease, so
// that it never holds up the renewal of leases for long (the next
// heartbeat tries again).
func (r *Registry) Write(ctx context.Context, leased int) {
	b := r.Due(leased)
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(r.every*3/10, 100*time.Millisecond))
	defer cancel()
	ok, err := false, error(nil)
	if b.Row.StartedAt != nil {
		ok, err = r.store.Beat(ctx, b.Row)
	}
	if err == nil && !ok {
		// Not written yet, or the row is gone (cleaned as dead after a
		// stall), held by another transaction, or another process's.
		var at time.Time
		at, ok, err = r.store.Register(ctx, b.Row)
		r.mu.Lock()
		if ok && r.row.StartedAt == nil {
			r.row.StartedAt = &at
		}
		if !ok && err == nil && !r.foreign {
			r.log.Warn("backlog: another live process uses this worker ID; this one is not listed by Processes until that one stops (give every process its own WithWorkerID)",
				"worker", r.row.Worker)
		}
		r.foreign = !ok && err == nil
		r.mu.Unlock()
	}
	switch {
	case ok:
		r.faults.OK("process Registry")
		r.mu.Lock()
		r.written = b.gen
		r.mu.Unlock()
	case err != nil && ctx.Err() == nil && !pgerr.Transient(err):
		r.log.Warn("backlog: writing this process's row in the processes table failed", "worker", r.row.Worker, "err", err)
	case err != nil:
		if ctx.Err() == nil {
			r.faults.Failed("process Registry", err)
		}
		r.log.Debug("backlog: writing this process's row in the processes table failed", "worker", r.row.Worker, "err", err)
	}
}
