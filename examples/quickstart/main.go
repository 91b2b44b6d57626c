// Command quickstart enqueues a few jobs, works them, and prints what
// happened. Run it with `make demo` (which finds or starts a PostgreSQL), or
// `DATABASE_URL=postgres://… go run ./examples/quickstart`.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// Each job type is a Go type whose Kind names it once: the enqueue and
// the handler cannot disagree on the type or on the args.

// EmailArgs are the args of an "email.send" job.
type EmailArgs struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Kind is the job type of EmailArgs jobs.
func (EmailArgs) Kind() string { return "email.send" }

// ReportArgs are the args of a "report.render" job.
type ReportArgs struct {
	Month string `json:"month"`
}

// Kind is the job type of ReportArgs jobs.
func (ReportArgs) Kind() string { return "report.render" }

// Report is the result of a report.render job, which the email that
// depends on it reads.
type Report struct {
	URL string `json:"url"`
}

// ChargeArgs are the args of an "invoice.charge" job.
type ChargeArgs struct {
	Invoice int `json:"invoice"`
	Cents   int `json:"cents"`
}

// Kind is the job type of ChargeArgs jobs.
func (ChargeArgs) Kind() string { return "invoice.charge" }

// EnqueueOptions are the defaults of every charge (options given at
// enqueue win over them): three attempts at most, and one live charge per
// invoice, whoever enqueues it.
func (a ChargeArgs) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{backlog.MaxAttempts(3), backlog.UniqueKey(fmt.Sprintf("charge:%d", a.Invoice))}
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// An unset DATABASE_URL would make pgx connect to libpq's defaults
	// (a local socket, your user name): say so instead.
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is not set: run `make demo` (it finds or starts a PostgreSQL), " +
			"or set DATABASE_URL=postgres://user@host:5432/db")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()

	// A schema of its own, so the demo never touches real data.
	const schema = "backlog_quickstart"
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") //nolint:errcheck

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	q, err := backlog.New(ctx, pool, backlog.WithSchema(schema), backlog.WithLogger(logger))
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.Migrate(ctx); err != nil {
		return err
	}

	// Handlers, routed by job type: each gets its args decoded.
	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a EmailArgs) error {
		if len(job.PrerequisiteIDs()) > 0 {
			// It depends on the report: attach the report's link.
			r, err := backlog.PrerequisiteResultOfType[Report](ctx, job, ReportArgs{}.Kind())
			if err != nil {
				return err
			}
			a.Subject += " (" + r.URL + ")"
		}
		fmt.Printf("  [worker] attempt %d: sending %q to %s\n", job.Attempt, a.Subject, a.To)
		return job.SetResult(map[string]string{"message_id": "msg-" + job.ID.String()[28:]})
	})
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a ReportArgs) error {
		if job.Attempt == 1 {
			fmt.Printf("  [worker] attempt %d: rendering report… the printer is on fire, will retry\n", job.Attempt)
			return errors.New("printer on fire")
		}
		for page := 1; page <= 3; page++ {
			// Shown by q.Job (and the dashboard) while it runs and after.
			if err := job.SetProgress(ctx, map[string]int{"page": page, "of": 3}); err != nil {
				return err
			}
		}
		fmt.Printf("  [worker] attempt %d: report for %s rendered\n", job.Attempt, a.Month)
		return job.SetResult(Report{URL: "https://example.com/reports/" + a.Month + ".pdf"})
	}, backlog.RetryBackoff(backlog.Backoff{Initial: 200 * time.Millisecond}))
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a ChargeArgs) error {
		fmt.Printf("  [worker] attempt %d: card declined for invoice %d, no point retrying\n", job.Attempt, a.Invoice)
		return backlog.Permanent(errors.New("card declined"))
	})

	// Enqueue: one at a time, in a transaction of our own, and in bulk.
	var ids []uuid.UUID
	id, err := q.EnqueueArgs(ctx, EmailArgs{To: "ada@example.com", Subject: "Welcome"})
	if err != nil {
		return err
	}
	ids = append(ids, id)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The job exists only if this transaction commits.
		id, err := q.EnqueueArgsTx(ctx, tx, ChargeArgs{Invoice: 42, Cents: 4200})
		ids = append(ids, id)
		return err
	}); err != nil {
		return err
	}
	// A small DAG: the email waits for the report and reads its result.
	report := backlog.Spec(ReportArgs{Month: "2026-10"})
	report.ID = backlog.NewID()
	more, err := q.EnqueueMany(ctx, []backlog.JobSpec{
		report,
		backlog.Spec(EmailArgs{To: "grace@example.com", Subject: "Your report"}, backlog.DependsOn(report.ID)),
	})
	if err != nil {
		return err
	}
	ids = append(ids, more...)
	fmt.Printf("enqueued %d jobs\n", len(ids))

	// Work until every job has finished, then stop the workers.
	workCtx, stopWork := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.Work(workCtx, mux, backlog.Concurrency(4)) }()
	if err := waitAll(ctx, q, ids); err != nil {
		stopWork()
		<-done
		return err
	}
	stopWork()
	if err := <-done; err != nil {
		return err
	}

	fmt.Println("\nfinal states:")
	for _, id := range ids {
		info, err := q.Job(ctx, id)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("  %-15s %-10s attempts=%d", info.Type, info.State, info.Attempt)
		if len(info.Result) > 0 {
			line += " result=" + string(info.Result)
		}
		if len(info.Progress) > 0 {
			line += " progress=" + string(info.Progress)
		}
		if info.LastError != "" {
			line += fmt.Sprintf(" last_error=%q", info.LastError)
		}
		fmt.Println(line)
	}
	return nil
}

// waitAll polls until every job is in a terminal state.
func waitAll(ctx context.Context, q *backlog.Queue, ids []uuid.UUID) error {
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pending := 0
		for _, id := range ids {
			info, err := q.Job(ctx, id)
			if err != nil {
				return err
			}
			if !info.State.Terminal() {
				pending++
			}
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%d jobs still unfinished after 30s", pending)
		case <-tick.C:
		}
	}
}
