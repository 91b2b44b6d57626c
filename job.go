package backlog

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
)

// State is where a job is in its life.
type State string

// The states of a job. A job moves blocked → scheduled → available →
// running → completed | failed | cancelled, skipping blocked when it has no
// unfinished prerequisite and scheduled when it is due at once; a retry or
// a snooze moves it from running back to scheduled (or available, when due
// at once). Finished jobs are kept for the retention of their state (see
// WithRetention).
const (
	StateBlocked   State = "blocked"   // waiting for prerequisites
	StateScheduled State = "scheduled" // due later: becomes available at run_at
	StateAvailable State = "available" // due: may be claimed
	StateRunning   State = "running"   // claimed under a lease
	StateCompleted State = "completed" // the handler succeeded
	StateFailed    State = "failed"    // attempts exhausted or a permanent error
	StateCancelled State = "cancelled" // cancelled before it completed
)

// Terminal reports whether s is a final state.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateFailed || s == StateCancelled
}

// NewID returns a new job ID (a UUIDv7, ordered by creation time). Set it on
// a JobSpec when other jobs of the same batch must refer to it.
func NewID() uuid.UUID { return uuid.Must(uuid.NewV7()) }

// Job is what a handler receives: one attempt of one job. The handler gets
// it as an argument, never through the context.
type Job struct {
	ID          uuid.UUID
	Type        string
	Args        json.RawMessage
	Tags        map[string]string // nil when untagged
	Attempt     int               // 1 for the first attempt
	MaxAttempts int
	Priority    int
	Timeout     time.Duration // 0: none
	CreatedAt   time.Time
	RunAt       time.Time // when the job was due
	// Metadata is what the job was enqueued with (Metadata, and the
	// Enqueuing hook's): trace context, for one. nil when it has none.
	Metadata map[string]string

	token  uuid.UUID
	lease  *heldLease
	waited time.Duration // run_at → claim, database clock
	slot   bool          // holds a slot of a concurrency limit: its finish announces it freed
	mu     sync.Mutex
	res    json.RawMessage
	resE   error
}

// SetResult records a small JSON result, stored with the job when the
// handler returns nil. json.RawMessage and []byte are taken as JSON text.
// When v does not marshal, is larger than MaxResultBytes, or holds what
// PostgreSQL cannot store (a \u0000 character, an unpaired surrogate), it
// returns a permanent error (matching ErrInvalid), and the job fails with
// it whatever the handler returns.
func (j *Job) SetResult(v any) error {
	b, err := encodeJSON("result", v, MaxResultBytes)
	// A retry would produce the same result: the error is permanent.
	err = Permanent(err)
	j.mu.Lock()
	defer j.mu.Unlock()
	j.res, j.resE = b, err
	if err != nil {
		j.res = nil
	}
	return err
}

func (j *Job) result() (json.RawMessage, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.res, j.resE
}

// AttemptError is one failed attempt in a job's error history.
type AttemptError struct {
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	Error   string    `json:"error"`
}

// JobInfo is a job's full record, as Queue.Job returns it.
type JobInfo struct {
	ID          uuid.UUID
	Type        string
	Args        json.RawMessage
	Tags        map[string]string
	State       State
	Priority    int
	Attempt     int // attempts started so far
	MaxAttempts int
	Timeout     time.Duration
	Worker      string          // the worker holding it while running
	Result      json.RawMessage // set when completed with a result
	LastError   string
	Errors      []AttemptError // oldest first, at most the last 20
	CreatedAt   time.Time
	RunAt       time.Time
	StartedAt   *time.Time // start of the latest attempt
	FinishedAt  *time.Time // when it reached a terminal state
	// The job's keys ("" when it has none): OrderingKey, UniqueKey and
	// ConcurrencyKey.
	OrderingKey, UniqueKey, ConcurrencyKey string
	// Metadata is the job's metadata (nil when it has none).
	Metadata map[string]string
}

// Err is nil when the job completed. Otherwise it says why not: for a
// failed job an error matching ErrJobFailed with its last error, for a
// cancelled one an error matching ErrCancelled, and for a job that has not
// finished yet one matching ErrNotFinished.
func (i *JobInfo) Err() error {
	switch i.State {
	case StateCompleted:
		return nil
	case StateFailed:
		return fmt.Errorf("job %s (%s) failed after %d attempt(s): %w: %s", i.ID, i.Type, i.Attempt, ErrJobFailed, i.LastError)
	case StateCancelled:
		return fmt.Errorf("job %s (%s): %w: %s", i.ID, i.Type, ErrCancelled, i.LastError)
	default:
		return fmt.Errorf("job %s (%s) is %s: %w", i.ID, i.Type, i.State, ErrNotFinished)
	}
}

// DecodeResult decodes the job's JSON result (Job.SetResult) into v. It
// fails when the job has no result.
func (i *JobInfo) DecodeResult(v any) error {
	if len(i.Result) == 0 || string(i.Result) == "null" && i.State != StateCompleted {
		return fmt.Errorf("job %s (%s, %s) has no result", i.ID, i.Type, i.State)
	}
	if err := json.Unmarshal(i.Result, v); err != nil {
		return fmt.Errorf("decoding the result of job %s into %T: %w", i.ID, v, err)
	}
	return nil
}

// String is a one-line summary for logs.
func (i JobInfo) String() string {
	return fmt.Sprintf("job %s (%s) %s, attempt %d/%d", i.ID, i.Type, i.State, i.Attempt, i.MaxAttempts)
}
