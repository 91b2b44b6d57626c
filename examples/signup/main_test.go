package main

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogtest"
)

var pool *pgxpool.Pool

func TestMain(m *testing.M) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		os.Stderr.WriteString("examples/signup: DATABASE_URL is not set; skipping the tests (`make test` sets it)\n")
		if os.Getenv("BACKLOG_CI") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	var err error
	if pool, err = pgxpool.New(context.Background(), url); err != nil {
		panic(err)
	}
	code := m.Run()
	pool.Close()
	os.Exit(code)
}

// fakeMailer records what it sent; err, when set, is what Send returns.
type fakeMailer struct {
	mu   sync.Mutex
	sent []string
	err  error
}

func (m *fakeMailer) Send(_ context.Context, to, _, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	m.sent = append(m.sent, to)
	return nil
}

// newApp gives the test an App on a queue of its own.
func newApp(t *testing.T) (*App, *fakeMailer) {
	t.Helper()
	mailer := &fakeMailer{}
	app := &App{Pool: pool, Queue: backlogtest.NewQueue(t, pool), Mailer: mailer}
	if err := app.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return app, mailer
}

func TestSignUpEnqueuesTheWelcomeEmailInItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app, _ := newApp(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	s, err := app.SignUpTx(ctx, tx, "ada@example.com")
	if err != nil {
		t.Fatal(err)
	}

	// Inside the transaction the job is there, with the user's ID...
	job := backlogtest.RequireEnqueuedArgsTx[WelcomeArgs](ctx, t, app.Queue, tx, &backlogtest.Want{
		UniqueKey:   "welcome:" + itoa(s.UserID),
		MaxAttempts: 5,
		State:       backlog.StateAvailable,
	})
	if want := (WelcomeArgs{UserID: s.UserID, Email: "ada@example.com"}); job.Args != want || job.Job.ID != s.WelcomeJob {
		t.Fatalf("job %s with args %+v, want %s with %+v", job.Job.ID, job.Args, s.WelcomeJob, want)
	}
	// ...outside it, not yet; and a rollback takes it back with the user.
	backlogtest.RequireNotEnqueuedArgs[WelcomeArgs](ctx, t, app.Queue, nil)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	backlogtest.RequireNotEnqueuedArgs[WelcomeArgs](ctx, t, app.Queue, nil)
}

func TestWelcomeOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app, mailer := newApp(t)

	s, err := app.SignUp(ctx, "ada@example.com")
	if err != nil {
		t.Fatal(err)
	}
	r := backlogtest.Work(ctx, t, app.Queue, app.Handlers(), s.WelcomeJob)
	if r.Outcome != backlog.OutcomeCompleted || len(mailer.sent) != 1 || mailer.sent[0] != "ada@example.com" {
		t.Fatalf("outcome %s (%v), sent %q", r.Outcome, r.Err, mailer.sent)
	}
	var res struct {
		SentTo string `json:"sent_to"`
	}
	if err := r.Info.DecodeResult(&res); err != nil || res.SentTo != "ada@example.com" {
		t.Fatalf("result %+v, %v", res, err)
	}

	// The mailer fails: retried later.
	mailer.err = errors.New("smtp: connection refused")
	s, err = app.SignUp(ctx, "grace@example.com")
	if err != nil {
		t.Fatal(err)
	}
	r = backlogtest.Work(ctx, t, app.Queue, app.Handlers(), s.WelcomeJob)
	if r.Outcome != backlog.OutcomeRetried || r.Info.State != backlog.StateScheduled || r.Info.Attempt != 1 {
		t.Fatalf("outcome %s, state %s, attempt %d", r.Outcome, r.Info.State, r.Info.Attempt)
	}

	// An address that does not parse: failed at once.
	s, err = app.SignUp(ctx, "not an address")
	if err != nil {
		t.Fatal(err)
	}
	r = backlogtest.Work(ctx, t, app.Queue, app.Handlers(), s.WelcomeJob)
	if r.Outcome != backlog.OutcomeFailed || r.Info.State != backlog.StateFailed {
		t.Fatalf("outcome %s, state %s", r.Outcome, r.Info.State)
	}
}

func TestEverySignUpIsWelcomed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app, mailer := newApp(t)
	for _, email := range []string{"a@example.com", "b@example.com", "c@example.com"} {
		if _, err := app.SignUp(ctx, email); err != nil {
			t.Fatal(err)
		}
	}
	s := backlogtest.DrainUntilIdle(ctx, t, app.Queue, app.Handlers(), nil)
	if s.Count(backlog.OutcomeCompleted) != 3 || len(mailer.sent) != 3 {
		t.Fatalf("outcomes %v, sent %q", s.Outcomes, mailer.sent)
	}
	backlogtest.RequireManyEnqueued(ctx, t, app.Queue, []backlogtest.Expect{
		{Type: "email.welcome", Want: &backlogtest.Want{Args: map[string]string{"email": "a@example.com"}, State: backlog.StateCompleted}},
		{Type: "email.welcome", Want: &backlogtest.Want{Args: map[string]string{"email": "b@example.com"}, State: backlog.StateCompleted}},
		{Type: "email.welcome", Want: &backlogtest.Want{Args: map[string]string{"email": "c@example.com"}, State: backlog.StateCompleted}},
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
