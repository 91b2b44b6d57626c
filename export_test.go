package backlog

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// MigrateHint is the CLI command an ErrNotMigrated names.
var MigrateHint = migrateHint

// WithVacuumForTest lowers the dead rows of the jobs table past which the
// maintenance loop vacuums it, and the live rows it must hold.
func WithVacuumForTest(dead, live int64) Option {
	return queueOption(func(c *config) { c.vacuumDead, c.vacuumLive = dead, live })
}

// WithClock replaces the Queue's wall clock (tests skew it).
func WithClock(f func() time.Time) Option { return queueOption(func(c *config) { c.clock = f }) }

// FinishForTest writes one finish through the store, past every check the
// client makes first: the database's fence alone decides. graph picks the
// transactional finish (jobs with dependents) over the one-statement one.
func FinishForTest(ctx context.Context, q *Queue, id, token uuid.UUID, state string, graph bool) error {
	f := []store.Finish{{ID: id, Token: token, State: state}}
	var err error
	if graph {
		_, err = q.store.FinishGraph(ctx, f, true)
	} else {
		_, err = q.store.Finish(ctx, f)
	}
	return err
}

// ExtendForTest renews one lease through the store and reports whether the
// database renewed it.
func ExtendForTest(ctx context.Context, q *Queue, id, token uuid.UUID) (bool, error) {
	ext, err := q.store.Extend(ctx, []uuid.UUID{id}, []uuid.UUID{token}, time.Minute)
	for _, e := range ext {
		if e.ID == id && e.Renewed {
			return true, err
		}
	}
	return false, err
}

// SetScheduleConfirmForTest sets how often q confirms its schedules in the
// schedules table (and so when Schedules calls one stale: three times
// that). Call it before Every or Cron.
func SetScheduleConfirmForTest(q *Queue, d time.Duration) { q.sched.SetConfirmEvery(d) }

// Limits and defaults the API keeps unexported, for the external tests
// that probe them.
const (
	MaxLimit           = maxLimit
	MaxTypeBytes       = maxTypeBytes
	MaxTagBytes        = maxTagBytes
	MaxTags            = maxTags
	MaxTagsBytes       = maxTagsBytes
	MaxKeyBytes        = maxKeyBytes
	MaxDependsOn       = maxDependsOn
	MaxAttemptsLimit   = maxAttemptsLimit
	MaxGraphNeighbours = maxGraphNeighbours
	DefaultPrefetch    = defaultPrefetch
)
