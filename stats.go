package backlog

import (
	"context"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/maintain"
	"github.com/backlogq/backlog/internal/store"
)

// Stats is a snapshot of the queue.
type Stats struct {
	// ByState counts jobs per state: live jobs (blocked, scheduled,
	// available, running) as they are now, finished ones (completed,
	// failed, cancelled) that finished in the last 24 hours.
	ByState map[State]int64
	// ByType counts jobs per type and state, likewise.
	ByType map[string]map[State]int64
	// OldestAvailable is how long the oldest available job has been due
	// (0 when none is waiting), on the database clock.
	OldestAvailable time.Duration
	// RunningByWorker counts running jobs per worker (WithWorkerID).
	RunningByWorker map[string]int64
	// Paused lists the paused job types.
	Paused []string
	// OldestTransaction is the oldest open transaction in the database
	// (nil: none): while it stays open, PostgreSQL cannot clean up the
	// rows that jobs leave behind, and claims slow down as they pile up.
	// The maintenance loop logs a warning once it is older than
	// OldTransactionWarning.
	OldestTransaction *OldTransaction
	// DatabaseErrors counts the database errors this process's Queue met
	// in its background work (this process only, unlike the rest).
	DatabaseErrors DatabaseErrors
}

// StatsWindow is how far back Stats counts finished jobs.
const StatsWindow = 24 * time.Hour

// Stats returns counts of jobs by state and type (live jobs as they are,
// finished ones over the last StatsWindow), the age of the oldest waiting
// job, running jobs per worker, the paused types and the oldest open
// transaction. It reads the live table (only live jobs are there) and
// per-minute counters, never the finished jobs, so its cost does not grow
// with the history kept. With WithReadPool the counts come from the read
// pool (as old as its replay lag; from the primary when ctx comes from
// ReadPrimary); the oldest open transaction is asked of the primary,
// where transactions hold back the cleanup.
func (q *Queue) Stats(ctx context.Context) (*Stats, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	fail := func(what string, err error) (*Stats, error) {
		return nil, q.readErr(ctx, fmt.Errorf("reading stats (%s): %w", what, err))
	}
	reads := q.readsFor(ctx)
	live, oldest, err := reads.LiveCounts(ctx)
	if err != nil {
		return fail("live jobs", err)
	}
	now, err := reads.Now(ctx)
	if err != nil {
		return fail("clock", err)
	}
	finished, err := reads.FinishedCounts(ctx, now.Add(-StatsWindow))
	if err != nil {
		return fail("finished jobs", err)
	}
	st := buildStats(live, finished, oldest)
	paused, err := reads.PausedTypes(ctx)
	if err != nil {
		return fail("paused types", err)
	}
	for _, p := range paused {
		st.Paused = append(st.Paused, p.Type)
	}
	snap, err := q.store.OldestSnapshot(ctx)
	if err != nil {
		return fail("open transactions", err)
	}
	st.OldestTransaction = oldTransactionOf(snap)
	st.DatabaseErrors = DatabaseErrors(q.faults.Snapshot())
	return st, nil
}

func buildStats(live, finished []store.StatsRow, oldest time.Duration) *Stats {
	s := &Stats{ByState: map[State]int64{}, ByType: map[string]map[State]int64{}, RunningByWorker: map[string]int64{},
		OldestAvailable: oldest}
	for _, r := range live {
		if r.Worker != "" || r.Type == "" {
			s.RunningByWorker[r.Worker] += r.Count
			continue
		}
		if State(r.State).Terminal() {
			continue // not moved to job_history yet: counted there once it is
		}
		s.add(State(r.State), r.Type, r.Count)
	}
	for _, r := range finished {
		s.add(State(r.State), r.Type, r.Count)
	}
	return s
}

func (s *Stats) add(st State, typ string, n int64) {
	s.ByState[st] += n
	if s.ByType[typ] == nil {
		s.ByType[typ] = map[State]int64{}
	}
	s.ByType[typ][st] += n
}

// Throughput is the finished jobs of one type in one time bucket.
type Throughput struct {
	At        time.Time // start of the bucket
	Type      string
	Completed int64
	Failed    int64
	Cancelled int64
	// AvgWait is the mean time from due (run_at) to the last attempt's
	// start, and AvgRun the mean run time of the last attempt, over the
	// bucket's finished jobs that started.
	AvgWait, AvgRun time.Duration
}

// Throughput returns how many jobs finished, per type and bucket, since
// `since` (on the database clock): buckets of a minute or of an hour
// (bucket must be a whole number of minutes). Minute counts are kept for
// two hours, hour counts for 90 days; older buckets are empty.
func (q *Queue) Throughput(ctx context.Context, since time.Time, bucket time.Duration) ([]Throughput, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	if bucket < time.Minute || bucket%time.Minute != 0 {
		return nil, invalid("bucket", "must be a whole number of minutes, got %s", bucket)
	}
	points, err := q.readsFor(ctx).Series(ctx, since, bucket)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading throughput: %w", err))
	}
	var out []Throughput
	idx := map[string]int{}
	started := map[string]int64{}
	waits, runs := map[string]int64{}, map[string]int64{}
	for _, p := range points {
		k := p.At.String() + "\x00" + p.Type
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, Throughput{At: p.At, Type: p.Type})
		}
		switch State(p.State) {
		case StateCompleted:
			out[i].Completed += p.N
		case StateFailed:
			out[i].Failed += p.N
		case StateCancelled:
			out[i].Cancelled += p.N
		}
		started[k] += p.N
		waits[k] += p.WaitMS
		runs[k] += p.RunMS
	}
	for k, i := range idx {
		if n := started[k]; n > 0 {
			out[i].AvgWait = time.Duration(waits[k]/n) * time.Millisecond
			out[i].AvgRun = time.Duration(runs[k]/n) * time.Millisecond
		}
	}
	return out, nil
}

// OldTransactionWarning is the age past which an open transaction is
// reported in the log (every clean interval while it stays open): one
// minute.
const OldTransactionWarning = maintain.OldTransaction

// OldTransaction is an open transaction that holds back the cleanup of dead
// rows in the queue's database.
type OldTransaction struct {
	Kind        string        // "session" or "prepared transaction"
	PID         int           // the session's process ID (pg_stat_activity.pid); 0 for a prepared transaction
	Age         time.Duration // since the transaction began
	State       string        // the session's state, e.g. "idle in transaction"
	Application string        // the session's application_name, or the prepared transaction's GID
	Query       string        // the session's current or last statement (first 200 bytes), when visible to this role
}

func oldTransactionOf(s *store.Snapshot) *OldTransaction {
	if s == nil {
		return nil
	}
	return &OldTransaction{Kind: s.Kind, PID: s.PID, Age: s.Age, State: s.State, Application: s.Application, Query: s.Query}
}

// DatabaseErrors counts the transient database errors (unreachable,
// restarting, timeouts) this Queue's own background work met: claims,
// outcome writes, lease renewals, the sweep and the other maintenance,
// notifications, the listener. It describes this process, not the queue.
type DatabaseErrors struct {
	// Total is how many statements failed that way since New.
	Total int64
	// Outages is how many outages there were (one under way included): a
	// run of such errors that ends once every part that failed works again.
	Outages int64
	// FailingSince is when the outage under way began, nil when none is.
	FailingSince *time.Time
}
