package backlog_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// SendEmail is the args of the "email.send" job: its Kind names the job
// type once, for enqueueing and for the handler.
type SendEmail struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Kind is the job type of SendEmail jobs.
func (SendEmail) Kind() string { return "email.send" }

// ChargeOrder is the args of the "order.charge" job, with default options:
// at most 5 attempts, and at most one live charge per order (a unique key
// computed from the order ID).
type ChargeOrder struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

// Kind is the job type of ChargeOrder jobs.
func (ChargeOrder) Kind() string { return "order.charge" }

// EnqueueOptions are the defaults of every ChargeOrder job; options given
// at enqueue override them.
func (a ChargeOrder) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{
		backlog.MaxAttempts(5),
		backlog.UniqueKey("charge:" + a.OrderID),
	}
}

// A typed job: the handler gets the decoded args, and typed and string
// handlers share one Mux and one Work call.
func ExampleHandleArgs() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a SendEmail) error {
		fmt.Printf("sending %q to %s (attempt %d)\n", a.Subject, a.To, job.Attempt)
		return nil
	})
	mux.HandleFunc("audit.log", func(ctx context.Context, job *backlog.Job) error { return nil })
	stop := workInBackground(q, mux)
	defer stop()

	id, err := q.EnqueueArgs(ctx, SendEmail{To: "ada@example.com", Subject: "Welcome"})
	if err != nil {
		panic(err)
	}
	info, err := q.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Type, info.State)
	// Output:
	// sending "Welcome" to ada@example.com (attempt 1)
	// email.send completed
}

// Args that do not decode into the handler's type (here enqueued through
// the string API, as SQL or another language could) fail the job at once,
// with an error naming the job, its kind and the Go type; the handler is
// not called.
func ExampleHandleArgs_decodeError() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a SendEmail) error {
		fmt.Println("not called")
		return nil
	})
	stop := workInBackground(q, mux)
	defer stop()

	id, err := q.Enqueue(ctx, "email.send", map[string]int{"to": 42})
	if err != nil {
		panic(err)
	}
	info, err := q.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.State, "after", info.Attempt, "attempt")
	fmt.Println(strings.Replace(info.LastError, id.String(), "<id>", 1))
	// Output:
	// failed after 1 attempt
	// permanent: backlog: args do not decode: job <id> (kind "email.send") into backlog_test.SendEmail: json: cannot unmarshal number into Go struct field SendEmail.to of type string
}

// An args type's default options apply to every job of it; options given
// at enqueue win over them.
func ExampleJobArgsWithOptions() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	first, _ := q.EnqueueArgs(ctx, ChargeOrder{OrderID: "A-1", Cents: 4200})
	again, _ := q.EnqueueArgs(ctx, ChargeOrder{OrderID: "A-1", Cents: 4200}) // the same order: the same job
	urgent, _ := q.EnqueueArgs(ctx, ChargeOrder{OrderID: "B-2"}, backlog.MaxAttempts(1), backlog.Priority(1))
	for _, id := range []uuid.UUID{first, urgent} {
		info, err := q.Job(ctx, id)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s max_attempts=%d priority=%d unique_key=%s\n", info.Type, info.MaxAttempts, info.Priority, info.UniqueKey)
	}
	fmt.Println("duplicate:", again == first)
	// Output:
	// order.charge max_attempts=5 priority=0 unique_key=charge:A-1
	// order.charge max_attempts=1 priority=1 unique_key=charge:B-2
	// duplicate: true
}

// A typed job enqueued inside a transaction exists only if it commits.
func ExampleQueue_EnqueueArgsTx() {
	q, pool, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// … the caller's own writes in tx …
	id, err := q.EnqueueArgsTx(ctx, tx, ChargeOrder{OrderID: "A-1", Cents: 4200})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	info, err := q.Job(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Type, info.State, string(info.Args))
	// Output: order.charge available {"cents": 4200, "order_id": "A-1"}
}

// Typed jobs in one batch (one statement, all or nothing), with a string
// job beside them and a dependency between members.
func ExampleSpec() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	// The receipt depends on the charge: set its ID up front, and drop its
	// default unique key (a member that others of its batch depend on
	// cannot have one: it might be a duplicate, and not inserted).
	charge := backlog.Spec(ChargeOrder{OrderID: "A-1", Cents: 4200}, backlog.UniqueKey(""))
	charge.ID = backlog.NewID()
	ids, err := q.EnqueueMany(ctx, []backlog.JobSpec{
		charge,
		backlog.Spec(SendEmail{To: "ada@example.com", Subject: "Receipt"}, backlog.DependsOn(charge.ID)),
		{Type: "audit.log", Args: map[string]string{"order": "A-1"}},
	})
	if err != nil {
		panic(err)
	}
	for _, id := range ids {
		info, err := q.Job(ctx, id)
		if err != nil {
			panic(err)
		}
		fmt.Println(info.Type, info.State)
	}
	// Output:
	// order.charge available
	// email.send blocked
	// audit.log available
}
