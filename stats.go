package backlog

import (
	"context"
	"fmt"
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

// Stats returns counts by state and type, the age of the oldest waiting
// job, and running jobs per worker, in one query. The counts are exact, so
// the query reads every row of the jobs table: its cost grows with the rows
// kept for retention (see the README's operations section for a
// measurement).
func (q *Queue) Stats(ctx context.Context) (*Stats, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	rows, oldest, err := q.store.Stats(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading stats: %w", err))
	}
	return buildStats(rows, oldest), nil
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
