// Package testbridge connects package backlogtest to machinery of package
// backlog that is not public API: the claim of one given job, the run of a
// handler on a claimed job and the fenced write of its outcome, and how a
// typed handler finds its kind and decodes its args. Package
// backlog sets the variables at init (it imports this package, so the
// values cross as any); only backlogtest calls them. Keeping them here
// keeps package backlog free of exported names that applications could
// misuse in production code.
package testbridge

import (
	"context"
	"reflect"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Run is what one inline run of a handler did.
type Run struct {
	Job     any    // the *backlog.Job the handler got
	Outcome string // a backlog.Outcome
	Err     error  // what the handler returned (a panic as an error)
	Written bool   // the outcome was written (the fence let it through)
}

// Inline runs handlers on claimed jobs in the caller's goroutine. Its
// methods must not be called concurrently.
type Inline interface {
	// Work claims job id through the claim statement (other available
	// jobs of its type held locked for the moment, so that the claim
	// takes this one) and runs the handler on it.
	Work(ctx context.Context, id uuid.UUID) (Run, error)
	// Next promotes due scheduled jobs (with all, every scheduled job of
	// the handler's types, due or not), claims the next due job of the
	// handler's types and runs the handler on it. ok is false when it
	// claimed none; busy then says whether jobs of those types are running
	// elsewhere, locked by another transaction or held back by a limit.
	Next(ctx context.Context, all bool) (r Run, ok, busy bool, err error)
	// Close ends the inline runs (the Queue may close after it).
	Close()
}

var (
	// Pool returns a *backlog.Queue's pool.
	Pool func(q any) *pgxpool.Pool
	// NewInline starts inline runs of handler h (a backlog.Handler) on
	// queue q (a *backlog.Queue) with opts (a []backlog.WorkOption).
	// Cancelling ctx cancels a running handler as the end of Work's grace
	// period would (cause backlog.ErrShutdown).
	NewInline func(ctx context.Context, q, h, opts any) (Inline, error)
	// ArgsKind returns the Kind of the args type t (a backlog.JobArgs
	// type) as backlog.HandleArgs finds it; ok is false for an interface
	// type.
	ArgsKind func(t reflect.Type) (kind string, ok bool)
	// UnmarshalArgs decodes a job's JSON args into v (a pointer to a
	// backlog.JobArgs) as a backlog.HandleArgs handler gets them; null
	// reports args that are JSON null or empty, which it refuses.
	UnmarshalArgs func(args []byte, v any) (null bool, err error)
)
