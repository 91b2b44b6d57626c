package backlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/google/uuid"
)

// JobArgs is the args of a typed job: a Go type (usually a struct) that
// names its job type once, in Kind, so that enqueueing a value and
// registering a handler for the type cannot disagree on it. The args are
// stored as the value's JSON encoding (encoding/json), so jobs enqueued
// from SQL or another language with the same type and JSON are worked by
// the same handler.
//
// Kind must return a constant: HandleArgs calls it on the type's zero
// value (a pointer type's on a pointer to a zero value), EnqueueArgs on
// the value enqueued. It is validated like any job type: not empty, at
// most 200 bytes, valid UTF-8 without NUL bytes.
type JobArgs interface {
	Kind() string
}

// JobArgsWithOptions is a JobArgs that declares its own default enqueue
// options: a priority, max attempts, a timeout, tags, or a unique,
// ordering or concurrency key computed from its fields. EnqueueOptions is
// called on the value at each enqueue, so a key may depend on the value:
//
//	func (a ChargeArgs) EnqueueOptions() []backlog.EnqueueOption {
//		return []backlog.EnqueueOption{
//			backlog.MaxAttempts(5),
//			backlog.UniqueKey("charge:" + a.OrderID),
//		}
//	}
//
// Precedence: the args' options apply first and the options given at
// enqueue (EnqueueArgs, EnqueueArgsTx, Spec, JobSpec.Options) after them,
// so an explicit option wins over a default of the args. Single-valued
// options (Priority, MaxAttempts, Timeout, RunAt, Delay, OrderingKey,
// UniqueKey, ConcurrencyKey) take the last value given: UniqueKey("")
// removes a default key, Timeout(0) a default timeout. Tags and Metadata
// merge key by key, a later value winning for the same key (the Enqueuing
// hook's metadata comes between the two). DependsOn adds up.
type JobArgsWithOptions interface {
	JobArgs
	EnqueueOptions() []EnqueueOption
}

// EnqueueArgs inserts one job of the type args.Kind() with args as its
// JSON args and returns its ID, as Enqueue does. The args' default
// options (JobArgsWithOptions) apply first, then opts. A Kind that is not
// a valid job type, or a nil args, returns an *InputError and writes
// nothing.
func (q *Queue) EnqueueArgs(ctx context.Context, args JobArgs, opts ...EnqueueOption) (uuid.UUID, error) {
	if args == nil {
		return uuid.Nil, invalid("args", "nil JobArgs")
	}
	return q.Enqueue(ctx, "", args, opts...)
}

// EnqueueArgsTx is EnqueueArgs inside the caller's transaction, a pgx.Tx
// or a database/sql one (see Tx and EnqueueTx): the job exists, and
// workers are notified, only if tx commits.
func (q *Queue) EnqueueArgsTx(ctx context.Context, tx Tx, args JobArgs, opts ...EnqueueOption) (uuid.UUID, error) {
	if args == nil {
		return uuid.Nil, invalid("args", "nil JobArgs")
	}
	return q.EnqueueTx(ctx, tx, "", args, opts...)
}

// Spec returns the JobSpec of a typed job for EnqueueMany, EnqueueManyTx
// and InsertMany: its Type is args.Kind() and its options are the args'
// defaults (JobArgsWithOptions) followed by opts. Set the returned spec's
// ID when other jobs of the batch depend on it. Typed and string specs
// mix freely in one batch.
//
// Spec is JobSpec{Args: args, Options: opts} checked by the compiler: a
// JobSpec whose Args is a JobArgs may leave Type empty (it is the
// args' Kind) and gets the args' default options all the same.
func Spec(args JobArgs, opts ...EnqueueOption) JobSpec {
	return JobSpec{Args: args, Options: opts}
}

// A resolvedSpec is a JobSpec whose args were asked, once, for their Kind
// and default options (JobSpec.resolve): the enqueue hooks report typ and
// buildJob builds the row from it, so that neither asks the args again
// nor validates the Kind again.
type resolvedSpec struct {
	JobSpec
	typ      string          // Type, or else the args' Kind ("" when neither says)
	defaults []EnqueueOption // the args' default options, which apply before Options
	err      error           // what is wrong with the args, reported by buildJob
}

// options are the spec's options as they apply: the args' defaults first.
func (r resolvedSpec) options() []EnqueueOption {
	if len(r.defaults) == 0 {
		return r.Options
	}
	return append(r.defaults[:len(r.defaults):len(r.defaults)], r.Options...)
}

// resolveAll resolves every spec.
func resolveAll(specs []JobSpec) []resolvedSpec {
	out := make([]resolvedSpec, len(specs))
	for i, s := range specs {
		out[i] = s.resolve()
	}
	return out
}

// resolve asks s's args, when they are a JobArgs, for their Kind, checked
// (Type, when set, must equal it), and their default options; any other
// spec is its Type and Options.
func (s JobSpec) resolve() resolvedSpec {
	r := resolvedSpec{JobSpec: s, typ: s.Type}
	a, ok := s.Args.(JobArgs)
	if !ok {
		return r
	}
	if nilPointer(a) {
		r.err = invalid("args", "nil %T", a)
		return r
	}
	t := reflect.TypeOf(a)
	kind := a.Kind()
	if s.Type == "" {
		r.typ = kind
	}
	if err := validateKind(t, kind); err != nil {
		r.err = err
		return r
	}
	if s.Type != "" && s.Type != kind {
		r.err = invalid("type", "%q differs from the Kind of its args, %T: %q (leave the type empty, or enqueue with EnqueueArgs)", s.Type, a, kind)
		return r
	}
	d, ok := a.(JobArgsWithOptions)
	if !ok && t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(withOptions) {
		// Its defaults would be silently left out.
		r.err = invalid("options", "%s declares EnqueueOptions on its pointer, *%s, which a %s value does not have: "+
			"declare it on the value (func (a %s) EnqueueOptions), or enqueue a pointer", t, t, t, t.Name())
		return r
	}
	if ok {
		r.defaults = d.EnqueueOptions()
		for _, o := range r.defaults {
			if o == nil {
				r.err = invalid("options", "nil option among the EnqueueOptions of %T", a)
				return r
			}
		}
	}
	return r
}

var withOptions = reflect.TypeFor[JobArgsWithOptions]()

// validateKind checks the Kind of the args type t.
func validateKind(t reflect.Type, kind string) error {
	err := validateType(kind)
	if err == nil {
		return nil
	}
	var ie *InputError
	if errors.As(err, &ie) {
		return invalid("type", "the Kind of %s, %q: %s", t, kind, ie.Reason)
	}
	return err
}

// argsKind returns the Kind of the args type t (a JobArgs type), from
// its zero value (a pointer type's from a pointer to a zero value). ok is
// false when t is an interface type, whose zero value has no Kind.
// backlogtest finds kinds with it too (internal/testbridge).
func argsKind(t reflect.Type) (kind string, ok bool) {
	var v reflect.Value
	switch t.Kind() {
	case reflect.Interface:
		return "", false
	case reflect.Pointer:
		v = reflect.New(t.Elem())
	default:
		v = reflect.Zero(t)
	}
	return v.Interface().(JobArgs).Kind(), true
}

// ErrArgsDecode matches (with errors.Is) the error of a typed handler's
// attempt whose args do not decode into the handler's args type.
var ErrArgsDecode = errors.New("backlog: args do not decode")

// HandleArgs registers f on m for the jobs of T's kind: each attempt
// decodes the job's JSON args into a T and calls f with it and the Job
// (its ID, attempt, tags, metadata, …). Typed and string handlers share
// a Mux, so one Work call serves both.
//
// Decoding is encoding/json's: fields of the JSON that T does not have
// are ignored, so a producer may add a field before every worker knows
// it (a rolling deploy); a field missing from the JSON keeps its zero
// value. Args that do not decode into a T (a JSON type that does not fit
// a field, such as a string for an int; JSON null; an error of T's
// UnmarshalJSON) fail the attempt permanently, without retries, since
// the stored args will not change: the error matches ErrArgsDecode and
// names the job, its kind and T. f is not called.
//
// HandleArgs panics, as Mux.Handle does, when T's Kind is not a valid job
// type, when f is nil, or when the kind is already registered on m, by a
// HandleArgs for the same or another args type or by Handle or
// HandleFunc: the message names the kind and both registrations.
func HandleArgs[T JobArgs](m *Mux, f func(ctx context.Context, job *Job, args T) error, opts ...HandleOption) {
	t := reflect.TypeFor[T]()
	kind, ok := argsKind(t)
	if !ok {
		panic(invalid("args", "HandleArgs needs a concrete args type, not the interface %s", t))
	}
	if err := validateKind(t, kind); err != nil {
		panic(err)
	}
	if f == nil {
		panic(invalid("handler", "nil handler for kind %q (%s)", kind, t))
	}
	h := HandlerFunc(func(ctx context.Context, job *Job) error {
		var args T
		if err := decodeArgs(job, &args, t); err != nil {
			return err
		}
		return f(ctx, job, args)
	})
	m.handle(kind, h, t.String(), opts)
}

// decodeArgs decodes the job's args into v, a pointer to a JobArgs of
// type t, or returns the permanent error that fails the attempt.
func decodeArgs(job *Job, v any, t reflect.Type) error {
	null, err := unmarshalArgs(job.Args, v)
	switch {
	case null:
		return Permanent(fmt.Errorf("%w: job %s (kind %q) has null args, which would leave a %s unset",
			ErrArgsDecode, job.ID, job.Type, t))
	case err != nil:
		return Permanent(fmt.Errorf("%w: job %s (kind %q) into %s: %w", ErrArgsDecode, job.ID, job.Type, t, err))
	}
	return nil
}

// unmarshalArgs decodes a job's JSON args into v (a pointer to a JobArgs)
// as a typed handler gets them. null reports args that are JSON null or
// empty, which would leave the value unset: they are refused, not
// decoded. backlogtest decodes with it too (internal/testbridge).
func unmarshalArgs(args []byte, v any) (null bool, err error) {
	if a := bytes.TrimSpace(args); len(a) == 0 || string(a) == "null" {
		return true, nil
	}
	return false, json.Unmarshal(args, v)
}
