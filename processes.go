package backlog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/registry"
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
	rows, err := q.readsFor(ctx).Processes(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("listing processes: %w", err))
	}
	out := make([]ProcessInfo, 0, len(rows))
	for _, r := range rows {
		var works []registry.WorkRow
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
