package backlogtest_test

import (
	"context"
	"fmt"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogtest"
)

// ResetPassword is a typed job (backlog.JobArgs) of the code under test.
type ResetPassword struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
}

// Kind is the job type of ResetPassword jobs.
func (ResetPassword) Kind() string { return "email.reset_password" }

// Assert on a typed job: the kind comes from the args type, and the job
// comes back with its args decoded.
func ExampleRequireEnqueuedArgs() {
	ctx := context.Background()
	q := backlogtest.NewQueue(t, pool)
	// The code under test.
	_, err := q.EnqueueArgs(ctx, ResetPassword{UserID: 42, Email: "ada@example.com"}, backlog.Priority(1))
	check(err)

	got := backlogtest.RequireEnqueuedArgs[ResetPassword](ctx, t, q, &backlogtest.Want{Priority: new(1)})
	fmt.Println(got.Job.Type, got.Args.UserID, got.Args.Email)
	backlogtest.RequireNotEnqueuedArgs[ResetPassword](ctx, t, q, &backlogtest.Want{Args: map[string]any{"user_id": 7}})
	fmt.Println(len(backlogtest.EnqueuedArgs[ResetPassword](ctx, t, q, nil)), "enqueued")
	// Output:
	// email.reset_password 42 ada@example.com
	// 1 enqueued
}
