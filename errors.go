package backlog

import (
	"errors"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/pgerr"
)

var (
	// ErrLeaseLost is the cause of a handler context's cancellation when the
	// job's lease was lost (it expired, or another worker now holds the job),
	// and the error of a finish the database refused for the same reason.
	ErrLeaseLost = errors.New("backlog: lease lost")

	// ErrNotFound is returned for an unknown job ID.
	ErrNotFound = errors.New("backlog: job not found")

	// ErrClosed is returned by calls on a Queue after Close.
	ErrClosed = errors.New("backlog: queue closed")

	// ErrInvalid matches (with errors.Is) every *InputError.
	ErrInvalid = errors.New("backlog: invalid input")

	// ErrShutdown is the cause of a handler context's cancellation when Work
	// is stopping and the grace period has run out.
	ErrShutdown = errors.New("backlog: worker shutting down")

	// ErrCancelled is the cause of a handler context's cancellation when the
	// job was cancelled with Queue.Cancel.
	ErrCancelled = errors.New("backlog: job cancelled")

	// ErrJobFailed matches JobInfo.Err of a failed job.
	ErrJobFailed = errors.New("backlog: job failed")

	// ErrNotFinished matches JobInfo.Err of a job that has not reached a
	// terminal state.
	ErrNotFinished = errors.New("backlog: job not finished")

	// ErrJobTimeout is the cause of a handler context's cancellation when the
	// job's timeout passed.
	ErrJobTimeout = errors.New("backlog: job timeout")
)

// ErrRetryable matches (with errors.Is) errors of calls that failed for a
// transient reason: the connection dropped or was refused, the server is
// restarting or shutting down, too many connections, a deadlock or
// serialization failure, or a timeout. The call may be retried. Note that
// when a connection drops during a commit, the transaction may have
// committed: an Enqueue retried after such an error can insert the job
// twice unless it has a UniqueKey.
var ErrRetryable = errors.New("backlog: retryable database error")

type retryableError struct{ err error }

func (e *retryableError) Error() string        { return e.err.Error() }
func (e *retryableError) Unwrap() []error      { return []error{e.err, ErrRetryable} }
func (e *retryableError) Is(target error) bool { return target == ErrRetryable }

// classify marks transient database errors as retryable.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrRetryable) || !pgerr.Transient(err) {
		return err
	}
	return &retryableError{err: err}
}

// InputError reports bad input: the field it concerns and what is wrong. It
// matches ErrInvalid with errors.Is. Nothing is written when one is returned.
type InputError struct {
	Field  string // e.g. "type", "tags", "args", "max attempts"
	Reason string
}

// Error names the field and the problem.
func (e *InputError) Error() string { return "backlog: invalid " + e.Field + ": " + e.Reason }

// Is reports whether target is ErrInvalid.
func (e *InputError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InputError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// permanentError marks a handler error that must not be retried.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so the job fails at once instead of being retried.
// Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was made by Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// snoozeError asks for the job to run again after a delay without spending
// an attempt.
type snoozeError struct{ d time.Duration }

func (e *snoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.d) }

// IsSnooze reports whether err was made by Snooze.
func IsSnooze(err error) bool {
	var s *snoozeError
	return errors.As(err, &s)
}

// Snooze, returned by a handler, makes the job available again after d
// without spending an attempt. A negative d counts as zero.
func Snooze(d time.Duration) error { return &snoozeError{d: max(d, 0)} }
