package backlog

import (
	"context"
	"time"
)

// Hooks are callbacks around enqueueing and running jobs, to feed metrics
// (Prometheus, OpenTelemetry) and tracing without the core depending on
// them. Every field is optional. Callbacks run synchronously on the
// enqueue and job paths: keep them fast, and safe for concurrent use.
type Hooks struct {
	// Enqueuing is called at the start of every Enqueue*, InsertMany and
	// periodic enqueue call, before anything is validated or written (ev
	// has Type and Jobs; Duplicates, Duration and Err are zero). The map
	// it returns is merged into the metadata of every job of the call
	// (see Metadata; the jobs' own Metadata options win for the same key),
	// and is validated with it: a map too large fails the call with an
	// *InputError naming "metadata". A nil or empty map adds nothing. The
	// context it returns is the one Enqueued gets for the same call (so a
	// span can start here and end there); nil keeps ctx. The enqueue
	// itself runs on the caller's ctx.
	Enqueuing func(ctx context.Context, ev EnqueueEvent) (context.Context, map[string]string)
	// Enqueued is called after every Enqueue*, InsertMany and periodic
	// enqueue call, successful or not.
	Enqueued func(ctx context.Context, ev EnqueueEvent)
	// Started is called just before a handler runs. The context it
	// returns becomes the handler's (e.g. carrying a span); nil keeps ctx.
	Started func(ctx context.Context, job *Job) context.Context
	// Finished is called after the handler returned, with the outcome that
	// will be recorded.
	Finished func(ctx context.Context, job *Job, ev JobEvent)
}

// EnqueueEvent describes one enqueue call.
type EnqueueEvent struct {
	Type       string // the job type, or "" when a batch mixes types
	Jobs       int    // jobs in the call
	Duplicates int    // unique jobs that already existed
	Duration   time.Duration
	Err        error
}

// Outcome is what became of one attempt.
type Outcome string

// The outcomes of an attempt.
const (
	OutcomeCompleted Outcome = "completed"
	OutcomeRetried   Outcome = "retried"    // failed; will run again after a backoff
	OutcomeFailed    Outcome = "failed"     // attempts used up, or a permanent error
	OutcomeSnoozed   Outcome = "snoozed"    // Snooze: runs again later, attempt not spent
	OutcomeCancelled Outcome = "cancelled"  // cancelled with Queue.Cancel
	OutcomeReleased  Outcome = "released"   // stopped by shutdown; available again at once
	OutcomeLeaseLost Outcome = "lease_lost" // the lease was lost; nothing recorded
)

// JobEvent describes one finished attempt.
type JobEvent struct {
	Outcome Outcome
	// Duration is how long the handler ran.
	Duration time.Duration
	// QueueLatency is how long the job waited between becoming due
	// (run_at) and being claimed, on the database clock.
	QueueLatency time.Duration
	// Err is what the handler returned (nil when it succeeded).
	Err error
}
