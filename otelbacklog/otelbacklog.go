// Package otelbacklog traces and measures a backlog queue with
// OpenTelemetry, through the queue's hooks (backlog.Hooks): the core
// library has no OpenTelemetry dependency, this module does.
//
//	inst, err := otelbacklog.New() // global providers and propagator
//	q, err := backlog.New(ctx, pool, backlog.WithHooks(inst.Hooks()))
//	stop, err := inst.ObserveQueue(q) // the gauges; optional
//	defer stop()
//
// # Traces
//
// Every enqueue call made inside a span (Enqueue, EnqueueTx, EnqueueMany,
// EnqueueManyTx, InsertMany) gets a span of kind producer, "enqueue
// <type>", a child of the caller's span, and its trace context is written
// into the metadata of every job of the call (backlog.Metadata) through
// the propagator. Every attempt gets a span of kind consumer, "process
// <type>", whose parent is that trace context: a trace shows the request
// that enqueued a job and, below its enqueue span, each attempt that ran
// it (a retried job has one process span per attempt, siblings). The
// handler's context carries the attempt span, so its own spans nest
// under it.
//
// Parent rather than link: a job has exactly one creation context and
// each attempt belongs to the work that context started, so a parent
// puts the request and its jobs in one tree, where most trace viewers
// show them without following links. The cost is that a job that waits
// long (scheduled, retried with backoff) stretches its trace over that
// time.
//
// An enqueue call made outside any span starts no trace and writes no
// metadata (a job without metadata costs nothing extra; periodic jobs,
// enqueued by the scheduler, have none): its attempts start traces of
// their own. The propagator decides what is written: with only the W3C
// trace context, a job carries "traceparent" (55 bytes) and, when set,
// "tracestate". Should everything the propagator writes (baggage, say)
// exceed half of backlog.MaxMetadataBytes, only traceparent and
// tracestate are kept, so that tracing alone never fails an enqueue. A
// job whose own Metadata already takes most of MaxMetadataBytes can still
// go over it with the trace context added: that enqueue fails with an
// *InputError naming "metadata".
//
// Attributes follow the OpenTelemetry semantic conventions for messaging
// (v1.43.0): messaging.system "backlog"; messaging.operation.type "send"
// for the enqueue (the conventions' current name for what was "publish")
// and "process" for an attempt; messaging.operation.name "enqueue" and
// "process"; messaging.destination.name, the job type (left out when a
// batch mixes types); messaging.batch.message_count for calls of more
// than one job; messaging.message.id, the job ID, on attempts. backlog's
// own: backlog.job.attempt, backlog.job.max_attempts, backlog.job.outcome
// (completed, retried, failed, snoozed, cancelled, released, lease_lost),
// backlog.job.queue_latency (seconds from due to claimed, database clock)
// and backlog.enqueue.duplicates. A failed enqueue, and an attempt that
// ended retried, failed or with a lost lease, records its error and sets
// the span's status to Error (error.type is the error's Go type).
//
// # Metrics
//
// Counters, per job type (attribute messaging.destination.name):
// backlog.jobs.enqueued (jobs written, duplicates not counted), .started,
// and one per outcome: .completed, .retried, .failed, .snoozed,
// .cancelled, .released, .lease_lost. Histograms in seconds:
// backlog.job.duration (the handler's run time, per type and outcome) and
// backlog.job.queue_latency (due to claimed, per type). Gauges, once
// ObserveQueue is called: backlog.jobs.available and backlog.jobs.running
// per type.
package otelbacklog

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/backlogq/backlog"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/backlogq/backlog/otelbacklog"

// Attribute keys of backlog's own.
const (
	AttemptKey      = attribute.Key("backlog.job.attempt")
	MaxAttemptsKey  = attribute.Key("backlog.job.max_attempts")
	OutcomeKey      = attribute.Key("backlog.job.outcome")
	QueueLatencyKey = attribute.Key("backlog.job.queue_latency") // seconds
	DuplicatesKey   = attribute.Key("backlog.enqueue.duplicates")
)

// Option configures New.
type Option interface{ apply(*config) }

type config struct {
	tp   trace.TracerProvider
	mp   metric.MeterProvider
	prop propagation.TextMapPropagator
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTracerProvider sets the provider of the tracer. Defaults to the
// global one (otel.GetTracerProvider) at the time New is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithMeterProvider sets the provider of the meter. Defaults to the global
// one (otel.GetMeterProvider) at the time New is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithPropagator sets how trace context is written into and read from job
// metadata. Defaults to the global TextMapPropagator
// (otel.GetTextMapPropagator), looked up on every call, so one set after
// New still counts. The global one propagates nothing until the program
// sets one: call otel.SetTextMapPropagator(propagation.TraceContext{}) (or
// a composite with propagation.Baggage{}), or pass it here.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// Instrumentation holds the tracer, the instruments and the propagator;
// its Hooks go to backlog.WithHooks. Safe for concurrent use.
type Instrumentation struct {
	tracer trace.Tracer
	meter  metric.Meter
	prop   propagation.TextMapPropagator // nil: the global one

	enqueued, started metric.Int64Counter
	outcomes          map[backlog.Outcome]metric.Int64Counter
	duration, latency metric.Float64Histogram
	available         metric.Int64ObservableGauge
	running           metric.Int64ObservableGauge

	attrs sync.Map // job type (and outcome) → attribute.Set
}

// New creates the tracer and the instruments.
func New(opts ...Option) (*Instrumentation, error) {
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	i := &Instrumentation{
		tracer:   c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		meter:    c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
		prop:     c.prop,
		outcomes: map[backlog.Outcome]metric.Int64Counter{},
	}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		m, err := i.meter.Int64Counter(name, metric.WithUnit("{job}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return m
	}
	i.enqueued = counter("backlog.jobs.enqueued", "Jobs written by enqueue calls (duplicates of unique jobs not counted).")
	i.started = counter("backlog.jobs.started", "Attempts started.")
	for _, o := range []backlog.Outcome{backlog.OutcomeCompleted, backlog.OutcomeRetried, backlog.OutcomeFailed,
		backlog.OutcomeSnoozed, backlog.OutcomeCancelled, backlog.OutcomeReleased, backlog.OutcomeLeaseLost} {
		i.outcomes[o] = counter("backlog.jobs."+string(o), "Attempts that ended "+string(o)+".")
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		m, err := i.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return m
	}
	i.duration = seconds("backlog.job.duration", "How long a handler ran, per attempt.")
	i.latency = seconds("backlog.job.queue_latency", "How long a job waited from due to claimed (database clock), per attempt.")
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		m, err := i.meter.Int64ObservableGauge(name, metric.WithUnit("{job}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return m
	}
	i.available = gauge("backlog.jobs.available", "Jobs due and waiting for a worker (ObserveQueue).")
	i.running = gauge("backlog.jobs.running", "Jobs running under a lease (ObserveQueue).")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return i, nil
}

// Hooks returns the hooks to install with backlog.WithHooks.
func (i *Instrumentation) Hooks() backlog.Hooks {
	return backlog.Hooks{Enqueuing: i.enqueuing, Enqueued: i.enqueuedHook, Started: i.start, Finished: i.finish}
}

// ObserveQueue reports the gauges backlog.jobs.available and
// backlog.jobs.running per type, read from q.Stats once per collection
// (both gauges from one call). The cost is that of Stats on every
// collection: five short queries, the largest a count of the live jobs by
// type and state (it grows with the jobs waiting or running, never with
// the history kept); at a collection interval of seconds or more it is
// negligible. A failed read reports nothing for that collection and
// returns the error to the SDK. The returned function stops the
// observation.
func (i *Instrumentation) ObserveQueue(q *backlog.Queue) (stop func() error, err error) {
	reg, err := i.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := q.Stats(ctx)
		if err != nil {
			return err
		}
		for typ, states := range st.ByType {
			set := metric.WithAttributeSet(i.typeAttrs(typ))
			o.ObserveInt64(i.available, states[backlog.StateAvailable], set)
			o.ObserveInt64(i.running, states[backlog.StateRunning], set)
		}
		return nil
	}, i.available, i.running)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}

func (i *Instrumentation) propagator() propagation.TextMapPropagator {
	if i.prop != nil {
		return i.prop
	}
	return otel.GetTextMapPropagator()
}

// typeAttrs returns the attribute set of a job type.
func (i *Instrumentation) typeAttrs(typ string) attribute.Set {
	return i.attrSet(typ, func() []attribute.KeyValue {
		if typ == "" {
			return nil
		}
		return []attribute.KeyValue{semconv.MessagingDestinationName(typ)}
	})
}

// outcomeAttrs returns the attribute set of a job type and outcome.
func (i *Instrumentation) outcomeAttrs(typ string, o backlog.Outcome) attribute.Set {
	return i.attrSet(typeOutcome{typ, o}, func() []attribute.KeyValue {
		return []attribute.KeyValue{semconv.MessagingDestinationName(typ), OutcomeKey.String(string(o))}
	})
}

// attrSet returns the set cached under key, made by mk the first time
// (hooks run on every job; job types are a small set in practice).
func (i *Instrumentation) attrSet(key any, mk func() []attribute.KeyValue) attribute.Set {
	if s, ok := i.attrs.Load(key); ok {
		return s.(attribute.Set)
	}
	s := attribute.NewSet(mk()...)
	i.attrs.Store(key, s)
	return s
}

type typeOutcome struct {
	typ     string
	outcome backlog.Outcome
}

type enqueueSpanKey struct{}
type attemptSpanKey struct{}

var (
	systemAttr = semconv.MessagingSystemKey.String("backlog")
	sendAttrs  = []attribute.KeyValue{systemAttr, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("enqueue")}
	procAttrs  = []attribute.KeyValue{systemAttr, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process")}
)

// enqueuing starts the producer span of an enqueue call made inside a
// span, and returns its trace context for the jobs' metadata.
func (i *Instrumentation) enqueuing(ctx context.Context, ev backlog.EnqueueEvent) (context.Context, map[string]string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil, nil
	}
	attrs := append(make([]attribute.KeyValue, 0, len(sendAttrs)+2), sendAttrs...)
	name := "enqueue"
	if ev.Type != "" {
		name += " " + ev.Type
		attrs = append(attrs, semconv.MessagingDestinationName(ev.Type))
	}
	if ev.Jobs > 1 {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(ev.Jobs))
	}
	ctx, span := i.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	carrier := propagation.MapCarrier{}
	i.propagator().Inject(ctx, carrier)
	if metadataBytes(carrier) > backlog.MaxMetadataBytes/2 {
		for k := range carrier {
			if k != "traceparent" && k != "tracestate" {
				delete(carrier, k)
			}
		}
	}
	return context.WithValue(ctx, enqueueSpanKey{}, span), carrier
}

// metadataBytes is the size of m's JSON encoding.
func metadataBytes(m map[string]string) int {
	b, _ := json.Marshal(m)
	return len(b)
}

// enqueuedHook counts the jobs written and ends the producer span.
func (i *Instrumentation) enqueuedHook(ctx context.Context, ev backlog.EnqueueEvent) {
	if ev.Err == nil {
		if n := ev.Jobs - ev.Duplicates; n > 0 {
			i.enqueued.Add(ctx, int64(n), metric.WithAttributeSet(i.typeAttrs(ev.Type)))
		}
	}
	span, ok := ctx.Value(enqueueSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	if ev.Duplicates > 0 {
		span.SetAttributes(DuplicatesKey.Int(ev.Duplicates))
	}
	if ev.Err != nil {
		span.RecordError(ev.Err)
		span.SetStatus(codes.Error, ev.Err.Error())
		span.SetAttributes(semconv.ErrorType(ev.Err))
	}
	span.End()
}

// start starts the consumer span of an attempt, a child of the trace
// context in the job's metadata (when there is one).
func (i *Instrumentation) start(ctx context.Context, job *backlog.Job) context.Context {
	attrs := i.typeAttrs(job.Type)
	i.started.Add(ctx, 1, metric.WithAttributeSet(attrs))
	if len(job.Metadata) > 0 {
		ctx = i.propagator().Extract(ctx, propagation.MapCarrier(job.Metadata))
	}
	ctx, span := i.tracer.Start(ctx, "process "+job.Type, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(procAttrs...),
		trace.WithAttributes(semconv.MessagingDestinationName(job.Type), semconv.MessagingMessageID(job.ID.String()),
			AttemptKey.Int(job.Attempt), MaxAttemptsKey.Int(job.MaxAttempts)))
	return context.WithValue(ctx, attemptSpanKey{}, span)
}

// finish records the attempt's outcome and ends its span.
func (i *Instrumentation) finish(ctx context.Context, job *backlog.Job, ev backlog.JobEvent) {
	typ := i.typeAttrs(job.Type)
	if c, ok := i.outcomes[ev.Outcome]; ok {
		c.Add(ctx, 1, metric.WithAttributeSet(typ))
	}
	i.duration.Record(ctx, ev.Duration.Seconds(), metric.WithAttributeSet(i.outcomeAttrs(job.Type, ev.Outcome)))
	i.latency.Record(ctx, ev.QueueLatency.Seconds(), metric.WithAttributeSet(typ))
	span, ok := ctx.Value(attemptSpanKey{}).(trace.Span)
	if !ok {
		return
	}
	span.SetAttributes(OutcomeKey.String(string(ev.Outcome)), QueueLatencyKey.Float64(ev.QueueLatency.Seconds()))
	switch ev.Outcome {
	case backlog.OutcomeRetried, backlog.OutcomeFailed, backlog.OutcomeLeaseLost:
		msg := string(ev.Outcome)
		if ev.Err != nil {
			span.RecordError(ev.Err)
			span.SetAttributes(semconv.ErrorType(ev.Err))
			msg = ev.Err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}
