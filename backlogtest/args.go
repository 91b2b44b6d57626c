package backlogtest

import (
	"context"
	"reflect"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testbridge"
)

// Enqueued is a typed job that was enqueued: its args decoded into T,
// and its record.
type Enqueued[T backlog.JobArgs] struct {
	Args T
	Job  *backlog.JobInfo
}

// RequireEnqueuedArgs asserts that a job of T's kind matching want was
// enqueued (committed) in q's schema, as RequireEnqueued does for the
// kind, and returns the oldest match with its args decoded into T. want
// may hold a T in Args, which then must match every field T encodes. It
// fails t as RequireEnqueued does, and also when the job's args do not
// decode into T (as the job's HandleArgs handler would fail it).
func RequireEnqueuedArgs[T backlog.JobArgs](ctx context.Context, t TB, q *backlog.Queue, want *Want) Enqueued[T] {
	t.Helper()
	kind := kindOf[T](t, "RequireEnqueuedArgs")
	return decodeEnqueued[T](t, "RequireEnqueuedArgs", requireEnqueued(ctx, t, q, testbridge.Pool(q), kind, want))
}

// RequireEnqueuedArgsTx is RequireEnqueuedArgs reading through tx (a
// backlog.Tx, as RequireEnqueuedTx takes), so that it sees what tx
// enqueued and has not committed yet.
func RequireEnqueuedArgsTx[T backlog.JobArgs](ctx context.Context, t TB, q *backlog.Queue, tx backlog.Tx, want *Want) Enqueued[T] {
	t.Helper()
	kind := kindOf[T](t, "RequireEnqueuedArgsTx")
	db := txQuerier(t, "RequireEnqueuedArgsTx", tx)
	return decodeEnqueued[T](t, "RequireEnqueuedArgsTx", requireEnqueued(ctx, t, q, db, kind, want))
}

// RequireNotEnqueuedArgs asserts that no job of T's kind matching want
// was enqueued (committed) in q's schema, as RequireNotEnqueued does for
// the kind.
func RequireNotEnqueuedArgs[T backlog.JobArgs](ctx context.Context, t TB, q *backlog.Queue, want *Want) {
	t.Helper()
	requireNotEnqueued(ctx, t, q, testbridge.Pool(q), kindOf[T](t, "RequireNotEnqueuedArgs"), want)
}

// EnqueuedArgs returns every job of T's kind matching want that was
// enqueued (committed) in q's schema, in the order they were enqueued,
// with their args decoded into T: none (an empty slice) when there is
// none, so that the test states how many it expects. It fails t when it
// cannot read the jobs, when want is invalid, or when a matching job's
// args do not decode into T.
func EnqueuedArgs[T backlog.JobArgs](ctx context.Context, t TB, q *backlog.Queue, want *Want) []Enqueued[T] {
	t.Helper()
	const fn = "EnqueuedArgs"
	kind := kindOf[T](t, fn)
	w, err := want.compile()
	if err != nil {
		fatalf(t, "%s[%s]: %v", fn, reflect.TypeFor[T](), err)
	}
	jobs, err := readJobs(ctx, q, testbridge.Pool(q))
	if err != nil {
		fatalf(t, "%s[%s]: %v", fn, reflect.TypeFor[T](), err)
	}
	out := []Enqueued[T]{}
	for _, j := range jobs {
		if j.Type == kind && w.mismatch(j) == "" {
			out = append(out, decodeEnqueued[T](t, fn, j))
		}
	}
	return out
}

// kindOf returns T's kind, as backlog.HandleArgs finds it. It fails t
// when T is an interface type.
func kindOf[T backlog.JobArgs](t TB, fn string) string {
	t.Helper()
	kind, ok := testbridge.ArgsKind(reflect.TypeFor[T]())
	if !ok {
		fatalf(t, "%s needs a concrete args type, not the interface %s", fn, reflect.TypeFor[T]())
	}
	return kind
}

// decodeEnqueued decodes job's args into a T as a backlog.HandleArgs
// handler would, failing t when they do not decode or are null.
func decodeEnqueued[T backlog.JobArgs](t TB, fn string, job *backlog.JobInfo) Enqueued[T] {
	t.Helper()
	var v T
	null, err := testbridge.UnmarshalArgs(job.Args, &v)
	switch {
	case null:
		fatalf(t, "%s: job %s (%s) has null args, which do not decode into %s", fn, job.ID, job.Type, reflect.TypeFor[T]())
	case err != nil:
		fatalf(t, "%s: decoding the args of job %s (%s) into %s: %v", fn, job.ID, job.Type, reflect.TypeFor[T](), err)
	}
	return Enqueued[T]{Args: v, Job: job}
}
