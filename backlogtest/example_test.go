package backlogtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogtest"
)

// In these examples t stands for the test's *testing.T and pool for its
// *pgxpool.Pool (see main_test.go).

type WelcomeArgs struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
}

// check stops an example on an unexpected error.
func check(err error) {
	if err != nil {
		panic(err)
	}
}

// A schema of the test's own, migrated, dropped when the test ends: tests
// that each take one may call t.Parallel.
func ExampleNewQueue() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)

	_, err := q.Enqueue(ctx, "report.render", map[string]any{"id": 7}, backlog.Priority(10))
	check(err)

	job := backlogtest.RequireEnqueued(ctx, t, q, "report.render", &backlogtest.Want{
		Args:     map[string]any{"id": 7},
		Priority: new(10),
		State:    backlog.StateAvailable,
	})
	backlogtest.RequireNotEnqueued(ctx, t, q, "report.email", nil)
	fmt.Println(job.Type, job.State, string(job.Args))
	// Output: report.render available {"id": 7}
}

// Check what the code under test enqueued inside its transaction, before
// it commits.
func ExampleRequireEnqueuedTx() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)

	tx, err := pool.Begin(ctx)
	check(err)
	defer tx.Rollback(ctx) //nolint:errcheck
	// The code under test: a sign-up enqueues its welcome email in its own
	// transaction.
	_, err = q.EnqueueTx(ctx, tx, "email.welcome", WelcomeArgs{UserID: 42, Email: "ada@example.com"})
	check(err)

	job := backlogtest.RequireEnqueuedTx(ctx, t, q, tx, "email.welcome", &backlogtest.Want{
		Args: map[string]any{"user_id": 42}, // a JSON subset: the email is not checked here
	})
	args := backlogtest.Args[WelcomeArgs](t, job)
	fmt.Println(job.State, args.UserID, args.Email)
	// Output: available 42 ada@example.com
}

// The jobs of the named types, in the order they were enqueued.
func ExampleRequireManyEnqueued() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)
	_, err := q.EnqueueMany(ctx, []backlog.JobSpec{
		{Type: "invoice.render", Args: map[string]int{"invoice": 1}},
		{Type: "invoice.send", Args: map[string]int{"invoice": 1}},
		{Type: "audit.log", Args: map[string]int{"invoice": 1}}, // not asked about
	})
	check(err)

	jobs := backlogtest.RequireManyEnqueued(ctx, t, q, []backlogtest.Expect{
		{Type: "invoice.render", Want: &backlogtest.Want{Args: map[string]int{"invoice": 1}}},
		{Type: "invoice.send"},
	})
	for _, j := range jobs {
		fmt.Println(j.Type)
	}
	// Output:
	// invoice.render
	// invoice.send
}

// Run a handler on one job, in the test's goroutine, through the real claim
// and the real fenced finish.
func ExampleWork() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)
	id, err := q.Enqueue(ctx, "email.welcome", WelcomeArgs{UserID: 42, Email: "ada@example.com"})
	check(err)

	send := backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a WelcomeArgs) error {
		if a.Email == "" {
			return backlog.Permanent(errors.New("no address"))
		}
		return job.SetResult(map[string]string{"message_id": "m-1"})
	})
	r := backlogtest.Work(ctx, t, q, send, id)

	var res struct {
		MessageID string `json:"message_id"`
	}
	check(r.Info.DecodeResult(&res))
	fmt.Println(r.Outcome, r.Info.State, r.Info.Attempt, res.MessageID)
	// Output: completed completed 1 m-1
}

// An error is retried later: Work returns the outcome and the recorded
// state, without waiting for the retry.
func ExampleWork_retried() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)
	id, err := q.Enqueue(ctx, "email.welcome", WelcomeArgs{UserID: 42})
	check(err)

	r := backlogtest.Work(ctx, t, q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		return errors.New("smtp: connection refused")
	}), id)
	fmt.Println(r.Outcome, r.Info.State, r.Info.Attempt, r.Info.LastError)
	// Output: retried scheduled 1 smtp: connection refused
}

// Work every due job, including those the handlers enqueue and the
// dependents their completion releases, until nothing is left to do. Jobs
// run in the claim's order (priority, then run_at): the CRM sync, due
// since it was enqueued, goes before the welcome email the signup
// enqueued.
func ExampleDrainUntilIdle() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)

	mux := backlog.NewMux()
	mux.HandleFunc("user.signup", func(ctx context.Context, job *backlog.Job) error {
		fmt.Println("signup")
		_, err := q.Enqueue(ctx, "email.welcome", job.Args) // enqueued by a handler
		return err
	})
	mux.HandleFunc("email.welcome", func(ctx context.Context, job *backlog.Job) error {
		fmt.Println("welcome")
		return nil
	})
	mux.HandleFunc("crm.sync", func(ctx context.Context, job *backlog.Job) error {
		fmt.Println("crm")
		return nil
	})

	signup, err := q.Enqueue(ctx, "user.signup", WelcomeArgs{UserID: 42, Email: "ada@example.com"})
	check(err)
	_, err = q.Enqueue(ctx, "crm.sync", nil, backlog.DependsOn(signup)) // blocked until the signup completes
	check(err)

	s := backlogtest.DrainUntilIdle(ctx, t, q, mux, nil)
	fmt.Println(len(s.Runs), "runs,", s.Count(backlog.OutcomeCompleted), "completed")
	// Output:
	// signup
	// crm
	// welcome
	// 3 runs, 3 completed
}
