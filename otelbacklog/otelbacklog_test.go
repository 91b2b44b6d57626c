package otelbacklog_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/internal/worktest"
	"github.com/backlogq/backlog/otelbacklog"
)

func TestMain(m *testing.M) {
	if err := testdb.Ping(); err != nil {
		os.Stderr.WriteString("otelbacklog tests: no PostgreSQL at $DATABASE_URL (" + err.Error() + "); skipping every test. `make test` finds or starts one.\n")
		if os.Getenv("BACKLOG_CI") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// env is a queue in a schema of its own, instrumented with in-memory
// exporters.
type env struct {
	t      *testing.T
	q      *backlog.Queue
	inst   *otelbacklog.Instrumentation
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{t: t, spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		require.NoError(t, e.tp.Shutdown(ctx))
		require.NoError(t, mp.Shutdown(ctx))
	})
	var err error
	e.inst, err = otelbacklog.New(otelbacklog.WithTracerProvider(e.tp), otelbacklog.WithMeterProvider(mp),
		otelbacklog.WithPropagator(propagation.TraceContext{}))
	require.NoError(t, err)
	e.q, err = backlog.New(ctx, testdb.Pool(t), backlog.WithSchema(testdb.Schema(t)), backlog.WithHooks(e.inst.Hooks()),
		backlog.WithRetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Randomization: 0.01}))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.q.Close()) })
	require.NoError(t, e.q.Migrate(ctx))
	return e
}

func (e *env) work(h backlog.HandlerFunc, types ...string) (stop func() error) {
	return worktest.Run(e.t, func(ctx context.Context) error { return e.q.Work(ctx, h, backlog.Types(types...)) })
}

// waitSpans polls until n ended spans match pred, and returns them in the
// order they ended.
func (e *env) waitSpans(n int, pred func(sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var out []sdktrace.ReadOnlySpan
		for _, s := range e.spans.Ended() {
			if pred(s) {
				out = append(out, s)
			}
		}
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d spans ended within 10s", len(out), n)
		}
		<-tick.C
	}
}

func named(prefix string) func(sdktrace.ReadOnlySpan) bool {
	return func(s sdktrace.ReadOnlySpan) bool { return strings.HasPrefix(s.Name(), prefix) }
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

// TestAttemptSpanIsChildOfEnqueue: a job enqueued inside a span carries
// its trace context; its attempt span is a child of the enqueue span, in
// the request's trace, and is the span of the handler's context.
func TestAttemptSpanIsChildOfEnqueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, req := e.tp.Tracer("test").Start(context.Background(), "request")
	id, err := e.q.Enqueue(ctx, "email.send", map[string]string{"to": "a@example.com"})
	require.NoError(t, err)
	req.End()
	info, err := e.q.Job(context.Background(), id)
	require.NoError(t, err)
	require.Contains(t, info.Metadata, "traceparent")

	inHandler := make(chan trace.SpanContext, 1)
	stop := e.work(func(ctx context.Context, j *backlog.Job) error {
		inHandler <- trace.SpanContextFromContext(ctx)
		return nil
	}, "email.send")
	defer func() { require.NoError(t, stop()) }()

	enq := e.waitSpans(1, named("enqueue"))[0]
	proc := e.waitSpans(1, named("process"))[0]
	require.Equal(t, "enqueue email.send", enq.Name())
	require.Equal(t, trace.SpanKindProducer, enq.SpanKind())
	require.Equal(t, req.SpanContext().SpanID(), enq.Parent().SpanID())
	require.Equal(t, req.SpanContext().TraceID(), enq.SpanContext().TraceID())
	require.Equal(t, "send", attr(enq, "messaging.operation.type").AsString())
	require.Equal(t, "backlog", attr(enq, "messaging.system").AsString())
	require.Equal(t, "email.send", attr(enq, "messaging.destination.name").AsString())

	require.Equal(t, "process email.send", proc.Name())
	require.Equal(t, trace.SpanKindConsumer, proc.SpanKind())
	require.Equal(t, req.SpanContext().TraceID(), proc.SpanContext().TraceID())
	require.Equal(t, enq.SpanContext().SpanID(), proc.Parent().SpanID())
	require.True(t, proc.Parent().IsRemote())
	require.Equal(t, "process", attr(proc, "messaging.operation.type").AsString())
	require.Equal(t, id.String(), attr(proc, "messaging.message.id").AsString())
	require.Equal(t, int64(1), attr(proc, otelbacklog.AttemptKey).AsInt64())
	require.Equal(t, "completed", attr(proc, otelbacklog.OutcomeKey).AsString())
	require.Equal(t, codes.Unset, proc.Status().Code)
	require.Equal(t, proc.SpanContext().SpanID(), (<-inHandler).SpanID())
}

// TestRetriedJobHasTwoAttemptSpans: a job that fails, then succeeds, has
// two attempt spans under its enqueue span, with their outcomes; the
// failed one records the error.
func TestRetriedJobHasTwoAttemptSpans(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, req := e.tp.Tracer("test").Start(context.Background(), "request")
	_, err := e.q.Enqueue(ctx, "flaky", nil)
	require.NoError(t, err)
	req.End()
	stop := e.work(func(_ context.Context, j *backlog.Job) error {
		if j.Attempt == 1 {
			return errors.New("boom")
		}
		return nil
	}, "flaky")
	defer func() { require.NoError(t, stop()) }()

	enq := e.waitSpans(1, named("enqueue"))[0]
	procs := e.waitSpans(2, named("process"))
	require.Len(t, procs, 2)
	for n, p := range procs {
		require.Equal(t, enq.SpanContext().SpanID(), p.Parent().SpanID())
		require.Equal(t, req.SpanContext().TraceID(), p.SpanContext().TraceID())
		require.Equal(t, int64(n+1), attr(p, otelbacklog.AttemptKey).AsInt64())
	}
	require.Equal(t, "retried", attr(procs[0], otelbacklog.OutcomeKey).AsString())
	require.Equal(t, codes.Error, procs[0].Status().Code)
	require.Equal(t, "boom", procs[0].Status().Description)
	require.Len(t, procs[0].Events(), 1) // the recorded error
	require.Equal(t, "completed", attr(procs[1], otelbacklog.OutcomeKey).AsString())
	require.Equal(t, codes.Unset, procs[1].Status().Code)
}

// TestNoSpanNoMetadata: a job enqueued outside any span has no metadata,
// and no enqueue span is made; its attempt starts a trace of its own.
func TestNoSpanNoMetadata(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	id, err := e.q.Enqueue(ctx, "plain", nil)
	require.NoError(t, err)
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Nil(t, info.Metadata)
	stop := e.work(func(context.Context, *backlog.Job) error { return nil }, "plain")
	defer func() { require.NoError(t, stop()) }()
	proc := e.waitSpans(1, named("process"))[0]
	require.False(t, proc.Parent().IsValid())
	for _, s := range e.spans.Ended() {
		require.NotEqual(t, trace.SpanKindProducer, s.SpanKind(), s.Name())
	}
}

// TestMetricsPerType: counters, histograms and gauges, per job type.
func TestMetricsPerType(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	stopObserving, err := e.inst.ObserveQueue(e.q)
	require.NoError(t, err)
	defer func() { require.NoError(t, stopObserving()) }()

	var specs []backlog.JobSpec
	for range 3 {
		specs = append(specs, backlog.JobSpec{Type: "a"})
	}
	_, err = e.q.EnqueueMany(ctx, specs) // one call, one type
	require.NoError(t, err)
	for _, args := range []string{`{"fail": false}`, `{"fail": true}`} {
		_, err = e.q.Enqueue(ctx, "b", []byte(args))
		require.NoError(t, err)
	}
	// A unique duplicate is not counted.
	_, err = e.q.Enqueue(ctx, "idle", nil, backlog.UniqueKey("u"))
	require.NoError(t, err)
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "idle"}, {Type: "idle", Options: []backlog.EnqueueOption{backlog.UniqueKey("u")}}})
	require.NoError(t, err)

	// Before anything runs: the gauges.
	m := e.collect()
	require.Equal(t, map[string]int64{"a": 3, "b": 2, "idle": 2}, m.gauge["backlog.jobs.available"])
	require.Equal(t, map[string]int64{"a": 3, "b": 2, "idle": 2}, m.sum["backlog.jobs.enqueued"])

	stop := e.work(func(_ context.Context, j *backlog.Job) error {
		if strings.Contains(string(j.Args), "true") {
			return backlog.Permanent(errors.New("bad input"))
		}
		return nil
	}, "a", "b")
	defer func() { require.NoError(t, stop()) }()
	e.waitSpans(5, named("process"))
	require.NoError(t, stop())

	m = e.collect()
	require.Equal(t, map[string]int64{"a": 3, "b": 2}, m.sum["backlog.jobs.started"])
	require.Equal(t, map[string]int64{"a": 3, "b": 1}, m.sum["backlog.jobs.completed"])
	require.Equal(t, map[string]int64{"b": 1}, m.sum["backlog.jobs.failed"])
	require.Equal(t, map[string]uint64{"a": 3, "b": 2}, m.hist["backlog.job.queue_latency"])
	require.Equal(t, map[string]uint64{"a/completed": 3, "b/completed": 1, "b/failed": 1}, m.hist["backlog.job.duration"])
	require.Equal(t, int64(2), m.gauge["backlog.jobs.available"]["idle"])
	require.Zero(t, m.gauge["backlog.jobs.available"]["a"])
	require.Zero(t, m.gauge["backlog.jobs.running"]["a"])
}

type metrics struct {
	sum   map[string]map[string]int64  // counter → type → value
	gauge map[string]map[string]int64  // gauge → type → value
	hist  map[string]map[string]uint64 // histogram → type[/outcome] → count
}

func (e *env) collect() metrics {
	e.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(e.t, e.reader.Collect(context.Background(), &rm))
	out := metrics{sum: map[string]map[string]int64{}, gauge: map[string]map[string]int64{}, hist: map[string]map[string]uint64{}}
	key := func(s attribute.Set) string {
		k, _ := s.Value("messaging.destination.name")
		if o, ok := s.Value(otelbacklog.OutcomeKey); ok {
			return k.AsString() + "/" + o.AsString()
		}
		return k.AsString()
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(e.t, otelbacklog.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				out.sum[m.Name] = map[string]int64{}
				for _, p := range d.DataPoints {
					out.sum[m.Name][key(p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				out.gauge[m.Name] = map[string]int64{}
				for _, p := range d.DataPoints {
					out.gauge[m.Name][key(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				out.hist[m.Name] = map[string]uint64{}
				for _, p := range d.DataPoints {
					out.hist[m.Name][key(p.Attributes)] = p.Count
				}
			}
		}
	}
	return out
}
