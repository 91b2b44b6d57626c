package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
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

	att   attempt        // the attempt Work runs it in (nil: none)
	pre   []uuid.UUID    // prerequisites that completed before it ran (nil: none)
	preIn []Prerequisite // loaded by Prerequisites
	mu    sync.Mutex
	res   json.RawMessage
	resE  error
}

// attempt is what a Job's methods need of the attempt a Work call runs it
// in (workAttempt): to report progress under its lease, and to read its
// prerequisites' kept results.
type attempt interface {
	setProgress(b json.RawMessage) error
	inputs(ctx context.Context, ids []uuid.UUID) ([]store.Input, error)
}

// SetResult records a small JSON result, stored with the job when the
// handler returns nil. json.RawMessage and []byte are taken as JSON text.
// When v does not marshal, is larger than MaxResultBytes, or holds what
// PostgreSQL cannot store (a \u0000 character, an unpaired surrogate, a
// number out of numeric's range such as 1e200000), it returns a permanent
// error (matching ErrInvalid, an *InputError naming the result), and the
// job fails with it whatever the handler returns, unless a later call
// sets a result that can be stored.
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

// Prerequisite is a job that a job depended on (DependsOn) and that
// completed before it ran, with its result.
type Prerequisite struct {
	ID   uuid.UUID
	Type string
	// State is StateCompleted: a job runs only once its dependencies
	// completed. ("" when the prerequisite's record is gone, which can
	// only happen to a job retried by hand long after it ended.)
	State  State
	Result json.RawMessage // its Job.SetResult value; null when it set none
}

// PrerequisiteIDs returns the IDs of the job's prerequisites: the jobs it
// depended on (DependsOn), which all completed before it ran. It is nil
// for a job without dependencies. The claim returns them with the job:
// this reads nothing.
func (j *Job) PrerequisiteIDs() []uuid.UUID { return slices.Clone(j.pre) }

// Prerequisites returns the job's prerequisites with their types and
// results, in the order of PrerequisiteIDs. The first call reads them all
// in one statement (none for a job without dependencies: it returns nil
// at once); later calls return the same values. The results stay readable
// while the job is live, whatever the retention of finished jobs and
// wherever the prerequisites' own records are.
func (j *Job) Prerequisites(ctx context.Context) ([]Prerequisite, error) {
	if len(j.pre) == 0 {
		return nil, nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.preIn != nil {
		return slices.Clone(j.preIn), nil
	}
	if j.att == nil {
		return nil, errors.New("backlog: the job's prerequisites cannot be read outside a worker")
	}
	rows, err := j.att.inputs(ctx, j.pre)
	if err != nil {
		return nil, fmt.Errorf("reading the prerequisites of job %s: %w", j.ID, err)
	}
	out := make([]Prerequisite, len(rows))
	for i, r := range rows {
		out[i] = Prerequisite{ID: r.ID, Type: r.Type, State: State(r.State), Result: r.Result}
	}
	j.preIn = out
	return slices.Clone(out), nil
}

// PrerequisiteResult decodes the result of the job's prerequisite id into
// a T. The first call reads every prerequisite of the job in one statement
// (see Job.Prerequisites). It fails with an error matching ErrNotFound
// when id is not one of the job's prerequisites.
func PrerequisiteResult[T any](ctx context.Context, job *Job, id uuid.UUID) (T, error) {
	var v T
	ps, err := job.Prerequisites(ctx)
	if err != nil {
		return v, err
	}
	for _, p := range ps {
		if p.ID == id {
			return v, decodePrerequisite(p, &v)
		}
	}
	return v, fmt.Errorf("%w: %s is not a prerequisite of job %s", ErrNotFound, id, job.ID)
}

// PrerequisiteResultOfType decodes the result of the job's one
// prerequisite of type typ into a T, for a handler that knows what it
// depends on by type rather than by ID. It fails with an error matching
// ErrNotFound when the job has no prerequisite of that type, and with an
// error when it has several (use PrerequisiteResult).
func PrerequisiteResultOfType[T any](ctx context.Context, job *Job, typ string) (T, error) {
	var v T
	ps, err := job.Prerequisites(ctx)
	if err != nil {
		return v, err
	}
	var found *Prerequisite
	for i := range ps {
		if ps[i].Type == typ {
			if found != nil {
				return v, fmt.Errorf("backlog: job %s has several prerequisites of type %q", job.ID, typ)
			}
			found = &ps[i]
		}
	}
	if found == nil {
		return v, fmt.Errorf("%w: job %s has no prerequisite of type %q", ErrNotFound, job.ID, typ)
	}
	return v, decodePrerequisite(*found, &v)
}

func decodePrerequisite(p Prerequisite, v any) error {
	if p.State != StateCompleted {
		return fmt.Errorf("%w: the record of prerequisite %s is gone", ErrNotFound, p.ID)
	}
	res := p.Result
	if len(res) == 0 {
		res = json.RawMessage("null")
	}
	if err := json.Unmarshal(res, v); err != nil {
		return fmt.Errorf("decoding the result of prerequisite %s (%s) into %T: %w", p.ID, p.Type, v, err)
	}
	return nil
}

// SetProgress records a small JSON value telling how far the job has got
// (json.RawMessage and []byte are taken as JSON text). It returns at once:
// the latest value of each running job is written with the lease
// renewals, at most about once a second while it changes, and the last
// one with the job's outcome, so a tight loop of calls costs no statement
// of its own. Queue.Job and Queue.List show it (JobInfo.Progress), also
// once the job has ended.
//
// When v does not marshal, is larger than MaxProgressBytes, or holds what
// PostgreSQL cannot store, it returns an *InputError (matching ErrInvalid)
// and keeps the previous value. Once the job's lease is lost it returns
// an error matching ErrLeaseLost and writes nothing: another worker may
// run the job by then. ctx is not used yet; it is there for a future
// write that may wait.
func (j *Job) SetProgress(ctx context.Context, v any) error {
	b, err := encodeJSON("progress", v, MaxProgressBytes)
	if err != nil {
		return err
	}
	if j.att == nil {
		return errors.New("backlog: progress can only be set by a worker's handler")
	}
	return j.att.setProgress(b)
}

// AttemptError is one attempt that did not succeed, in a job's error
// history. Worker, StartedAt, Duration and Outcome are recorded since
// schema version 23 (zero in entries written before). A successful
// attempt has no entry: it is the job's last, and its figures are the
// job's own (JobInfo.Worker, StartedAt, FinishedAt).
type AttemptError struct {
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"` // when the attempt ended
	Error   string    `json:"error"`
	// Worker is the worker ID that ran the attempt.
	Worker string `json:"worker,omitempty"`
	// StartedAt is when the attempt started (nil when not recorded).
	StartedAt *time.Time `json:"started_at,omitempty"`
	// Duration is how long the attempt ran, to the millisecond.
	Duration time.Duration `json:"-"`
	// Outcome names how the attempt ended: "error" (the handler returned
	// one), "timeout" (the job's timeout passed), "panic", "lease lost"
	// (the worker could not renew its lease), "lease expired" (the worker
	// stopped renewing it: crashed or cut off; found by the sweep) or
	// "cancelled". The worker decides it from the handler's error and the
	// cause of its context's end (errors.Is: an error wrapping
	// ErrJobTimeout or ErrLeaseLost counts) and records it with the
	// error; before schema version 25 it was read from the error text's
	// prefix, and workers of earlier versions still have it read so.
	Outcome string `json:"outcome,omitempty"`
}

// attemptErrorJSON is AttemptError as stored: Duration in milliseconds.
type attemptErrorJSON struct {
	attemptErrorFields
	MS int64 `json:"ms,omitempty"`
}

type attemptErrorFields AttemptError

// UnmarshalJSON decodes an entry as the database stores it (the run time
// in milliseconds, "ms").
func (e *AttemptError) UnmarshalJSON(b []byte) error {
	var v attemptErrorJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*e = AttemptError(v.attemptErrorFields)
	e.Duration = time.Duration(v.MS) * time.Millisecond
	return nil
}

// MarshalJSON encodes an entry as the database stores it.
func (e AttemptError) MarshalJSON() ([]byte, error) {
	return json.Marshal(attemptErrorJSON{attemptErrorFields: attemptErrorFields(e), MS: e.Duration.Milliseconds()})
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
	// Progress is the latest value the job reported with Job.SetProgress
	// (nil: none). While the job runs it lags the handler by up to about a
	// second; once the job has ended it is the last value.
	Progress   json.RawMessage
	LastError  string
	Errors     []AttemptError // oldest first, at most the last 20
	CreatedAt  time.Time
	RunAt      time.Time
	StartedAt  *time.Time // start of the latest attempt
	FinishedAt *time.Time // when it reached a terminal state
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
