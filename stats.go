package backlog

import (
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// Stats is a snapshot of the queue.
type Stats struct {
	// ByState counts jobs per state.
	ByState map[State]int64
	// ByType counts jobs per type and state.
	ByType map[string]map[State]int64
	// OldestAvailable is how long the oldest due available job has been
	// waiting (0 when none is waiting), on the database clock.
	OldestAvailable time.Duration
	// RunningByWorker counts running jobs per worker (WithWorkerID).
	RunningByWorker map[string]int64
	// OldestTransaction is the oldest open transaction in the database
	// (nil: none): while it stays open, PostgreSQL cannot clean up the
	// rows that jobs leave behind, and claims slow down as they pile up.
	// The maintenance loop logs a warning once it is older than
	// OldTransactionWarning.
	OldestTransaction *OldTransaction
}

// OldTransactionWarning is the age past which an open transaction is
// reported in the log (every clean interval while it stays open).
const OldTransactionWarning = time.Minute

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

func buildStats(rows []store.StatsRow, oldest time.Duration) *Stats {
	s := &Stats{ByState: map[State]int64{}, ByType: map[string]map[State]int64{}, RunningByWorker: map[string]int64{},
		OldestAvailable: oldest}
	for _, r := range rows {
		if r.Worker != "" || r.Type == "" {
			s.RunningByWorker[r.Worker] += r.Count
			continue
		}
		st := State(r.State)
		s.ByState[st] += r.Count
		if s.ByType[r.Type] == nil {
			s.ByType[r.Type] = map[State]int64{}
		}
		s.ByType[r.Type][st] += r.Count
	}
	return s
}
