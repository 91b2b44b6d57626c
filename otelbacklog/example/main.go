// Command example traces and measures a backlog queue with OpenTelemetry,
// printing spans and metrics to stdout: a "request" span enqueues a job
// that fails once and then succeeds, so the trace shows the request, its
// enqueue span and two attempt spans (children of the enqueue span, in the
// same trace). Run it from otelbacklog/ with
//
//	DATABASE_URL=postgres://… go run ./example
//
// (or `../scripts/with-db.sh go run ./example`, which finds or starts a
// PostgreSQL). It works in a schema of its own, dropped at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/otelbacklog"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is not set: run `../scripts/with-db.sh go run ./example`, " +
			"or set DATABASE_URL=postgres://user@host:5432/db")
	}

	// The SDK, exporting to stdout; W3C trace context carries traces from
	// the enqueue to the attempts (through each job's metadata).
	traceExp, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(traceExp))
	defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck
	metricExp, err := stdoutmetric.New(stdoutmetric.WithPrettyPrint())
	if err != nil {
		return err
	}
	reader := sdkmetric.NewPeriodicReader(metricExp, sdkmetric.WithInterval(time.Hour)) // exported at the end
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	inst, err := otelbacklog.New() // the global providers and propagator set above
	if err != nil {
		return err
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	const schema = "backlog_otel_example"
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") //nolint:errcheck
	q, err := backlog.New(ctx, pool, backlog.WithSchema(schema), backlog.WithHooks(inst.Hooks()),
		backlog.WithRetryBackoff(backlog.Backoff{Initial: 100 * time.Millisecond}))
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Migrate(ctx); err != nil {
		return err
	}
	stopObserving, err := inst.ObserveQueue(q) // available/running gauges
	if err != nil {
		return err
	}
	defer stopObserving() //nolint:errcheck

	// A request enqueues a job inside its span.
	reqCtx, req := tp.Tracer("example").Start(ctx, "POST /reports")
	id, err := q.Enqueue(reqCtx, "report.render", map[string]string{"report": "q3"})
	req.End()
	if err != nil {
		return err
	}
	info, err := q.Job(ctx, id)
	if err != nil {
		return err
	}
	fmt.Printf("enqueued job %s with metadata %v\n", id, info.Metadata)

	// A worker runs it: the first attempt fails, the second succeeds.
	done := make(chan struct{})
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	workErr := make(chan error, 1)
	go func() {
		workErr <- q.Work(workCtx, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
			// ctx carries the attempt's span: spans started here nest under it.
			_, span := otel.Tracer("example").Start(ctx, "render")
			defer span.End()
			if job.Attempt == 1 {
				return errors.New("the printer is on fire")
			}
			close(done)
			return nil
		}), backlog.Types("report.render"))
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := q.Wait(ctx, id); err != nil {
		return err
	}
	stopWork()
	if err := <-workErr; err != nil {
		return err
	}
	fmt.Println("job completed; spans above, metrics below")
	// Exports the metrics while the queue is open (the gauges read it);
	// the deferred Shutdown then does nothing.
	return mp.Shutdown(ctx)
}
