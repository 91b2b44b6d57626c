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
