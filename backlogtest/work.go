package backlogtest

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testbridge"
)

// Result is what one run of a handler on a job did.
type Result struct {
	// Job is the value the handler got, as under Queue.Work (its
	// Attempt counts this attempt).
	Job *backlog.Job
	// Outcome is what was recorded: completed, retried, failed,
	// snoozed, cancelled, released (the context given to Work or
	// DrainUntilIdle ended while the handler ran), or lease_lost
	// (nothing was recorded: the job's lease was no longer this run's).
	Outcome backlog.Outcome
	// Err is what the handler returned: nil when it succeeded; a
	// recovered panic is an error whose text holds the panic value and
	// the stack.
	Err error
	// Info is the job's record once the outcome was written: state,
	// attempt, errors, result (decode it with Info.DecodeResult), run_at
	// of the next attempt for a retried or snoozed job.
	Info *backlog.JobInfo
}

// Work runs h on the job id in the calling goroutine, as a Queue.Work
// call's worker would: the job is claimed by the same claim statement
// (under a fresh lease token, its attempt counted; the lease is renewed by
// the Queue's heartbeat while the handler runs) and h gets the same *Job;
// the handler's context carries the job's Timeout (cause
// backlog.ErrJobTimeout) and is cancelled by Queue.Cancel (cause
// backlog.ErrCancelled) and by the end of ctx (cause backlog.ErrShutdown,
// after which the job is released as at the end of Work's grace period);
// the outcome (nil, an error, backlog.Permanent, backlog.Snooze, a panic,
// Job.SetResult) is mapped and written by the same fenced finish, which
// releases the job's dependents and its ordering key's next job. Hooks of
// the Queue (WithHooks) are called as under Work. Work returns once the
// outcome is written.
//
// opts are Work options: RetryBackoff sets the backoff of a retry (else
// the Mux's for the type, else the Queue's); Concurrency, Prefetch,
// WorkerTags and Types play no part; GracePeriod bounds the wait for the
// outcome's write once ctx has ended (at least a second). When h is a
// *backlog.Mux, the job's type must be one it handles.
//
// The job must be available (enqueued, due, not blocked, committed): a
// job due later can be made due with DrainUntilIdle's RunScheduled.
// Work fails t when the job cannot be claimed (saying why: its state, a
// paused type, a limit holding it back) or the outcome cannot be written;
// an outcome other than completed is not a failure of t: check
// Result.Outcome.
func Work(ctx context.Context, t TB, q *backlog.Queue, h backlog.Handler, id uuid.UUID, opts ...backlog.WorkOption) *Result {
	t.Helper()
	in, err := testbridge.NewInline(ctx, q, h, opts)
	if err != nil {
		fatalf(t, "Work(%s): %v", id, err)
	}
	defer in.Close()
	r, err := in.Work(ctx, id)
	if err != nil {
		fatalf(t, "Work: %v", err)
	}
	return result(ctx, t, q, r)
}

func result(ctx context.Context, t TB, q *backlog.Queue, r testbridge.Run) *Result {
	t.Helper()
	job := r.Job.(*backlog.Job)
	// The primary's record: a read pool (WithReadPool) may not have the
	// outcome just written yet.
	info, err := q.Job(backlog.ReadPrimary(context.WithoutCancel(ctx)), job.ID)
	if err != nil {
		fatalf(t, "reading job %s after its run: %v", job.ID, err)
	}
	return &Result{Job: job, Outcome: backlog.Outcome(r.Outcome), Err: r.Err, Info: info}
}

// DrainOptions tune DrainUntilIdle. The zero value (and nil) is the
// default of every field.
type DrainOptions struct {
	// Work are Work options: Types (default: the types of a *backlog.Mux
	// handler; required otherwise), WorkerTags (default none: only
	// untagged jobs are taken, as under Queue.Work) and RetryBackoff.
	// Concurrency and Prefetch play no part: one job runs at a time.
	Work []backlog.WorkOption
	// RunScheduled makes every scheduled job of the types due at once
	// (their run_at set to now) before each claim, so that delayed jobs,
	// retries after their backoff and snoozed jobs run too. Default
	// false: they are left alone.
	RunScheduled bool
	// MaxRuns bounds the handler runs (default 1,000): a drain that has
	// run that many jobs fails t without looking further, which stops a
	// job that keeps enqueueing another, or keeps snoozing under
	// RunScheduled. Set it above the runs a drain needs.
	MaxRuns int
}

// DefaultMaxRuns is DrainOptions.MaxRuns's default.
const DefaultMaxRuns = 1000

// Summary is what DrainUntilIdle did.
type Summary struct {
	Runs     []*Result               // in the order they ran
	Outcomes map[backlog.Outcome]int // runs by outcome
}

// Count returns how many runs ended with outcome o.
func (s *Summary) Count(o backlog.Outcome) int { return s.Outcomes[o] }

// pollBusy is how often DrainUntilIdle looks again while jobs it must wait
// for are running elsewhere or locked.
const pollBusy = 10 * time.Millisecond

// DrainUntilIdle runs h, one job at a time in the calling goroutine as
// Work does, on every due job of its types, until none is left: it
// promotes the scheduled jobs that are due, claims the next job (by the
// claim statement's order: priority, run_at, then ID; under the types'
// limits) and runs it, and so on. Jobs that handlers enqueue, dependents
// that a completion makes available and an ordering key's next job are
// run in turn. It returns when a claim finds no job while none of the
// types is running elsewhere and no due job is locked by another
// transaction or held back by a limit (until then it looks again every
// 10 ms, never sleeping when nothing runs elsewhere).
//
// Jobs due later are left alone, unless opts.RunScheduled: a job enqueued
// with a Delay, a retry waiting for its backoff, a snoozed job. So is a
// blocked job whose prerequisite did not complete. It fails t when a claim
// or a write fails, when ctx ends, or after opts.MaxRuns runs.
func DrainUntilIdle(ctx context.Context, t TB, q *backlog.Queue, h backlog.Handler, opts *DrainOptions) *Summary {
	t.Helper()
	var o DrainOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxRuns == 0 {
		o.MaxRuns = DefaultMaxRuns
	}
	if o.MaxRuns < 0 {
		fatalf(t, "DrainUntilIdle: MaxRuns must not be negative, got %d", o.MaxRuns)
	}
	in, err := testbridge.NewInline(ctx, q, h, o.Work)
	if err != nil {
		fatalf(t, "DrainUntilIdle: %v", err)
	}
	defer in.Close()
	s := &Summary{Outcomes: map[backlog.Outcome]int{}}
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			fatalf(t, "DrainUntilIdle: stopped after %d run(s): %v", len(s.Runs), context.Cause(ctx))
		}
		r, ok, busy, err := in.Next(ctx, o.RunScheduled)
		if err != nil {
			fatalf(t, "DrainUntilIdle: after %d run(s): %v", len(s.Runs), err)
		}
		switch {
		case ok:
			res := result(ctx, t, q, r)
			s.Runs = append(s.Runs, res)
			s.Outcomes[res.Outcome]++
			if len(s.Runs) >= o.MaxRuns {
				fatalf(t, "DrainUntilIdle: %d runs (MaxRuns) without reaching idle; the last: job %s (%s) %s",
					len(s.Runs), res.Job.ID, res.Job.Type, res.Outcome)
			}
		case busy:
			if tick == nil {
				tick = time.NewTicker(pollBusy)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		default:
			return s
		}
	}
}
