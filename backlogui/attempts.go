package backlogui

import (
	"time"

	"github.com/backlogq/backlog"
)

// attemptRow is one attempt on the job page: those that did not succeed
// from the job's error history (with their worker, start, duration and
// outcome since schema version 23), the last one from the job's own
// record when it completed or is running.
type attemptRow struct {
	N           int
	Outcome     string // error, timeout, panic, lease lost, lease expired, cancelled, completed, running; "failed" when not recorded
	Worker      string
	Started     time.Time // zero: not recorded
	Ended       time.Time // zero: running
	Duration    time.Duration
	HasDuration bool
	Error       string
}

// Class is the row's CSS class.
func (a attemptRow) Class() string {
	switch a.Outcome {
	case "completed":
		return "att-ok"
	case "running":
		return "att-now"
	case "cancelled":
		return "att-cancelled"
	}
	return "att-bad"
}

// attemptRows lists info's attempts, oldest first. now is the clock the
// running attempt's duration is read against.
func attemptRows(info *backlog.JobInfo, now time.Time) []attemptRow {
	var rows []attemptRow
	for _, e := range info.Errors {
		r := attemptRow{N: e.Attempt, Outcome: e.Outcome, Worker: e.Worker, Ended: e.At, Error: e.Error}
		if r.Outcome == "" {
			r.Outcome = "failed"
		}
		if e.StartedAt != nil {
			r.Started, r.Duration, r.HasDuration = *e.StartedAt, e.Duration, true
		}
		rows = append(rows, r)
	}
	last := attemptRow{N: info.Attempt, Worker: info.Worker}
	if info.StartedAt != nil {
		last.Started = *info.StartedAt
	}
	switch info.State {
	case backlog.StateRunning:
		last.Outcome = "running"
		if !last.Started.IsZero() {
			last.Duration, last.HasDuration = max(0, now.Sub(last.Started)), true
		}
	case backlog.StateCompleted:
		last.Outcome = "completed"
		if info.FinishedAt != nil {
			last.Ended = *info.FinishedAt
			if !last.Started.IsZero() {
				last.Duration, last.HasDuration = info.FinishedAt.Sub(last.Started), true
			}
		}
	case backlog.StateFailed, backlog.StateCancelled:
		// Its last attempt is in the history already, unless the job
		// ended without one running (cancelled while queued) or the
		// history was cut.
		if len(rows) == 0 && info.LastError != "" {
			rows = append(rows, attemptRow{N: info.Attempt, Outcome: string(info.State), Error: info.LastError,
				Ended: derefTime(info.FinishedAt)})
		}
		return rows
	default:
		return rows
	}
	return append(rows, last)
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
