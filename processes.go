package backlog

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/store"
)

// ProcessInfo is a live worker process: a Queue running at least one Work
// call (or that has run one and is not closed), as it last reported itself.
type ProcessInfo struct {
	// WorkerID is the process's worker ID (WithWorkerID), also written
	// into the jobs it holds (JobInfo.Worker).
	WorkerID string
	// Host and PID are the process's host name and process ID.
	Host string
	PID  int
	// StartedAt is when its first Work call registered it, and
	// HeartbeatAt its last heartbeat (every lease/3), both on the database
	// clock.
	StartedAt   time.Time
	HeartbeatAt time.Time
	// Lease is the process's lease (WithLease). The process counts as dead
	// once its last heartbeat is three leases old.
	Lease time.Duration
	// Running is how many handlers were running at the last heartbeat.
	Running int
	// Leased is how many jobs the process held leases on at the last
	// heartbeat: its running handlers, jobs it claimed ahead (Prefetch)
	// and jobs whose outcome was still being written. Stats counts these
	// as running.
	Leased int
	// Works are the process's Work calls, in the order they started.
	Works []WorkInfo
}

// WorkInfo is one Work call of a process.
type WorkInfo struct {
	// Types are the job types it claims, sorted.
	Types []string
	// Tags are its WorkerTags (nil: none).
	Tags map[string]string
	// Concurrency and Prefetch are its settings (Concurrency, Prefetch).
	Concurrency int
	Prefetch    int
	// Running is how many of its handlers were running at the last
	// heartbeat.
	Running int
}

// workRow is WorkInfo as stored in processes.works (the same fields, so
// that one converts to the other).
type workRow struct {
	Types       []string          `json:"types"`
	Tags        map[string]string `json:"tags,omitempty"`
	Concurrency int               `json:"concurrency"`
	Prefetch    int               `json:"prefetch"`
	Running     int               `json:"running"`
}

// Processes lists the live worker processes of the queue's schema, oldest
// first, from the processes table, which every process running Work keeps
// up to date: it registers when its first Work call starts, rewrites its
// row when Work calls start or return and with its heartbeat (every
// lease/3, in the statement that renews its leases), and deletes the row
// in Close. A process whose last heartbeat is older than three of its
// leases (90 seconds at the default lease) is dead: it is not listed, and
// the cleaner of any process deletes its row. Counts are as of each
// process's last heartbeat. Any Queue can call it, one that runs no Work
// too.
func (q *Queue) Processes(ctx context.Context) ([]ProcessInfo, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	rows, err := q.store.Processes(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("listing processes: %w", err))
	}
	out := make([]ProcessInfo, 0, len(rows))
	for _, r := range rows {
		var works []workRow
		if err := json.Unmarshal(r.Works, &works); err != nil {
			return nil, fmt.Errorf("decoding the Work calls of process %s: %w", r.Worker, err)
		}
		p := ProcessInfo{WorkerID: r.Worker, Host: r.Host, PID: r.PID, StartedAt: r.StartedAt, HeartbeatAt: r.HeartbeatAt,
			Lease: r.Lease, Running: r.Running, Leased: r.Leased, Works: make([]WorkInfo, len(works))}
		for i, w := range works {
			p.Works[i] = WorkInfo(w)
		}
		out = append(out, p)
	}
	return out, nil
}

// unregisterTimeout bounds the deletion of the process's row in Close: a
// row left behind drops out once it is three leases old.
const unregisterTimeout = 5 * time.Second

// registry is this process's row in the processes table, a service. The
// row exists from the first Work call to Close. Every write of it happens
// on the heartbeat's goroutine (the heartbeat carries it in its lease
// renewal, or writes it alone: see leases.heartbeat), except the deletion
// in stop, which the Queue runs after the heartbeat stopped.
type registry struct {
	store  *store.Store
	log    *slog.Logger
	faults *outages
	every  time.Duration // heartbeat interval
	row    store.Process // its constant part
	// kick asks the heartbeat to write the row now (Work calls came or
	// went); buffer of 1, so join and leave never block.
	kick chan struct{}

	mu      sync.Mutex
	works   []*workCall
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

func newRegistry(st *store.Store, log *slog.Logger, faults *outages, workerID string, lease time.Duration) *registry {
	host, _ := os.Hostname()
	return &registry{store: st, log: log, faults: faults, every: lease / 3, kick: make(chan struct{}, 1),
		row: store.Process{Worker: workerID, Instance: randomHex(8), Host: host, PID: os.Getpid(), Lease: lease}}
}

func (r *registry) start() {}

// stop deletes the row. The Queue calls it after the heartbeat stopped and
// every Work call returned, so nothing writes the row again.
func (r *registry) stop() {
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
			"worker", r.row.Worker, "err", classify(err))
	}
}

// join adds a Work call to the row; leave removes it.
func (r *registry) join(w *workCall) {
	r.mu.Lock()
	r.works = append(r.works, w)
	r.joined = true
	r.gen++
	r.mu.Unlock()
	r.wake()
}

func (r *registry) leave(w *workCall) {
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

func (r *registry) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// procBeat is one write of the row.
type procBeat struct {
	row store.Process
	gen uint64
}

// due returns the row to write now, or nil when no write is due: none is
// until a Work call starts; then one a heartbeat, one when Work calls come
// or go, and one right after a write that found no row to refresh. A
// write that failed is tried again at the next heartbeat, not sooner, so
// that an unreachable database never holds the heartbeat up more than
// once a beat. leased is how many leases the process holds.
func (r *registry) due(leased int) *procBeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A little under the interval, so that the heartbeat's own timer
	// always finds it due.
	if !r.joined || (r.written == r.gen && !r.missed && time.Since(r.tried) < r.every*9/10) {
		return nil
	}
	r.tried, r.missed = time.Now(), false
	works := make([]workRow, len(r.works))
	running := 0
	for i, w := range r.works {
		n := int(w.running.Load())
		running += n
		works[i] = workRow{Types: w.spec.types, Tags: w.spec.tags, Concurrency: w.cfg.concurrency, Prefetch: w.cfg.prefetch, Running: n}
		if len(works[i].Tags) == 0 {
			works[i].Tags = nil
		}
	}
	b := &procBeat{row: r.row, gen: r.gen}
	b.row.Works, _ = json.Marshal(works) // strings, maps of strings and ints: cannot fail
	b.row.Running, b.row.Leased = running, leased
	return b
}

// carried records what a lease renewal that carried b did with it:
// wrote the row, or found none of ours to refresh (or failed for a reason
// that may be the row's): then the row is written alone at once.
func (r *registry) carried(b *procBeat, wrote bool) {
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
func (r *registry) write(ctx context.Context, leased int) {
	b := r.due(leased)
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(r.every*3/10, 100*time.Millisecond))
	defer cancel()
	ok, err := false, error(nil)
	if b.row.StartedAt != nil {
		ok, err = r.store.Beat(ctx, b.row)
	}
	if err == nil && !ok {
		// Not written yet, or the row is gone (cleaned as dead after a
		// stall), held by another transaction, or another process's.
		var at time.Time
		at, ok, err = r.store.Register(ctx, b.row)
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
		r.faults.ok("process registry")
		r.mu.Lock()
		r.written = b.gen
		r.mu.Unlock()
	case err != nil && ctx.Err() == nil && !pgerr.Transient(err):
		r.log.Warn("backlog: writing this process's row in the processes table failed", "worker", r.row.Worker, "err", err)
	case err != nil:
		if ctx.Err() == nil {
			r.faults.failed("process registry", err)
		}
		r.log.Debug("backlog: writing this process's row in the processes table failed", "worker", r.row.Worker, "err", err)
	}
}
