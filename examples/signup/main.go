// Command signup is a small application: a user signs up, the user's row
// and a welcome email job are written in one transaction, and a handler
// sends the email. Its tests (main_test.go) show package backlogtest at
// work. Run it with `DATABASE_URL=postgres://… go run ./examples/signup`.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/mail"
	"os"
	"os/signal"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// WelcomeArgs are the args of an "email.welcome" job.
type WelcomeArgs struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
}

// Kind is the job type of WelcomeArgs jobs.
func (WelcomeArgs) Kind() string { return "email.welcome" }

// EnqueueOptions are the defaults of every welcome email: at most one
// live job per user (a sign-up retried by the client enqueues no second
// email), and five attempts.
func (a WelcomeArgs) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{backlog.UniqueKey(fmt.Sprintf("welcome:%d", a.UserID)), backlog.MaxAttempts(5)}
}

// Mailer sends email.
type Mailer interface {
	Send(ctx context.Context, to, subject, body string) error
}

// App signs users up and welcomes them.
type App struct {
	Pool   *pgxpool.Pool
	Queue  *backlog.Queue
	Mailer Mailer
}

// Migrate creates the queue's tables and the users table, both in the
// queue's schema.
func (a *App) Migrate(ctx context.Context) error {
	if err := a.Queue.Migrate(ctx); err != nil {
		return err
	}
	_, err := a.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+a.users()+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL UNIQUE)`)
	return err
}

func (a *App) users() string { return pgx.Identifier{a.Queue.Schema(), "users"}.Sanitize() }

// Signup is what SignUp did.
type Signup struct {
	UserID     int64
	WelcomeJob uuid.UUID // the job that sends the welcome email
}

// SignUp creates a user and enqueues the welcome email, both or neither.
func (a *App) SignUp(ctx context.Context, email string) (Signup, error) {
	var s Signup
	err := pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		var err error
		s, err = a.SignUpTx(ctx, tx, email)
		return err
	})
	return s, err
}

// SignUpTx is SignUp inside the caller's transaction: the welcome email is
// sent only if tx commits.
func (a *App) SignUpTx(ctx context.Context, tx pgx.Tx, email string) (Signup, error) {
	var s Signup
	if err := tx.QueryRow(ctx, `INSERT INTO `+a.users()+` (email) VALUES ($1) RETURNING id`, email).Scan(&s.UserID); err != nil {
		return s, fmt.Errorf("creating user %s: %w", email, err)
	}
	var err error
	s.WelcomeJob, err = a.Queue.EnqueueArgsTx(ctx, tx, WelcomeArgs{UserID: s.UserID, Email: email})
	return s, err
}

// Handlers routes the application's job types.
func (a *App) Handlers() *backlog.Mux {
	mux := backlog.NewMux()
	backlog.HandleArgs(mux, a.welcome)
	return mux
}

// welcome sends the welcome email. An address that does not parse fails
// the job at once; a mailer error is retried.
func (a *App) welcome(ctx context.Context, job *backlog.Job, args WelcomeArgs) error {
	addr, err := mail.ParseAddress(args.Email)
	if err != nil {
		return backlog.Permanent(fmt.Errorf("user %d: %w", args.UserID, err))
	}
	if err := a.Mailer.Send(ctx, addr.Address, "Welcome!", fmt.Sprintf("Hello user %d, welcome aboard.", args.UserID)); err != nil {
		return fmt.Errorf("sending the welcome email: %w", err)
	}
	return job.SetResult(map[string]string{"sent_to": addr.Address})
}

// stdoutMailer prints the email instead of sending it.
type stdoutMailer struct{}

func (stdoutMailer) Send(_ context.Context, to, subject, body string) error {
	fmt.Printf("  to %s: %s %s\n", to, subject, body)
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "signup:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is not set (postgres://user@host:5432/db)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	const schema = "backlog_signup"
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
	app := &App{Pool: pool, Queue: q, Mailer: stdoutMailer{}}
	if err := app.Migrate(ctx); err != nil {
		return err
	}

	var ids []uuid.UUID
	for _, email := range []string{"ada@example.com", "grace@example.com"} {
		s, err := app.SignUp(ctx, email)
		if err != nil {
			return err
		}
		ids = append(ids, s.WelcomeJob)
	}
	fmt.Printf("signed up %d users\n", len(ids))

	workCtx, stopWork := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.Work(workCtx, app.Handlers()) }()
	var waitErr error
	for _, id := range ids {
		info, err := q.Wait(ctx, id)
		if err == nil {
			err = info.Err() // nil when completed
		}
		if err != nil {
			waitErr = err
			break
		}
	}
	stopWork()
	if err := errors.Join(waitErr, <-done); err != nil {
		return err
	}
	fmt.Println("every welcome email was sent")
	return nil
}
