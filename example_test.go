package backlog_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// exampleQueue opens a Queue in a fresh schema of the test database; the
// returned func closes it and drops the schema. Examples run under `make
// test`, which provides the database (see TestMain for a machine without
// one).
func exampleQueue(opts ...backlog.Option) (*backlog.Queue, *pgxpool.Pool, func()) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.URL())
	if err != nil {
		panic(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	all := append([]backlog.Option{backlog.WithSchema(schema),
		backlog.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	q, err := backlog.New(ctx, pool, all...)
	if err != nil {
		panic(err)
	}
	if err := q.Migrate(ctx); err != nil {
		panic(err)
	}
	return q, pool, func() {
		_ = q.Close()
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}

// workInBackground runs q.Work until the returned stop is called.
func workInBackground(q *backlog.Queue, h backlog.Handler, opts ...backlog.WorkOption) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := q.Work(ctx, h, opts...); err != nil {
			panic(err)
		}
	}()
	return func() { cancel(); <-done }
}

type EmailArgs struct {
	To string `json:"to"`
}

// Enqueue a job and work it with a typed handler.
func ExampleQueue_Work() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	mux := backlog.NewMux()
	mux.Handle("email.send", backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a EmailArgs) error {
		fmt.Println("sending to", a.To)
		return job.SetResult(map[string]string{"status": "sent"})
	}))
	stop := workInBackground(q, mux, backlog.Concurrency(4))
	defer stop()

	id, err := q.Enqueue(ctx, "email.send", EmailArgs{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	info, err := q.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	var res struct{ Status string }
	if err := info.DecodeResult(&res); err != nil {
		panic(err)
	}
	fmt.Println(info.State, res.Status, info.Err())
	// Output:
	// sending to ada@example.com
	// completed sent <nil>
}

// A job enqueued inside a transaction exists only if it commits.
func ExampleQueue_EnqueueTx() {
	q, pool, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	id, err := q.EnqueueTx(ctx, tx, "invoice.render", map[string]int{"invoice": 42})
	if err != nil {
		panic(err)
	}
	_ = tx.Rollback(ctx)
	_, err = q.Job(ctx, id)
	fmt.Println("after rollback:", errors.Is(err, backlog.ErrNotFound))

	tx, err = pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	if id, err = q.EnqueueTx(ctx, tx, "invoice.render", map[string]int{"invoice": 42}); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	info, err := q.Job(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println("after commit:", info.State)
	// Output:
	// after rollback: true
	// after commit: available
}

// HandleJSON decodes a job's args; args that do not decode fail the job
// permanently.
func ExampleHandleJSON() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	type Resize struct {
		Image string `json:"image"`
		Width int    `json:"width"`
	}
	h := backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, r Resize) error {
		fmt.Printf("resizing %s to %dpx\n", r.Image, r.Width)
		return nil
	})
	stop := workInBackground(q, h, backlog.Types("image.resize"))
	defer stop()

	ok, _ := q.Enqueue(ctx, "image.resize", Resize{Image: "cat.png", Width: 200})
	bad, _ := q.Enqueue(ctx, "image.resize", []int{1, 2})
	for _, id := range []uuid.UUID{ok, bad} {
		info, err := q.Wait(ctx, id)
		if err != nil {
			panic(err)
		}
		fmt.Println(info.State)
	}
	// Output:
	// resizing cat.png to 200px
	// completed
	// failed
}

// A job runs only after the jobs it depends on have completed.
func ExampleDependsOn() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	// IDs set up front, so members of one batch can refer to each other.
	fetch, parse, report := backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err := q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: report, Type: "step", Args: "report", Options: []backlog.EnqueueOption{backlog.DependsOn(fetch, parse)}},
		{ID: parse, Type: "step", Args: "parse", Options: []backlog.EnqueueOption{backlog.DependsOn(fetch)}},
		{ID: fetch, Type: "step", Args: "fetch"},
	})
	if err != nil {
		panic(err)
	}
	stop := workInBackground(q, backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, step string) error {
		fmt.Println(step)
		return nil
	}), backlog.Types("step"), backlog.Concurrency(4))
	defer stop()
	if _, err := q.Wait(ctx, report); err != nil {
		panic(err)
	}
	// Output:
	// fetch
	// parse
	// report
}

// Jobs with the same ordering key run one at a time, in enqueue order.
func ExampleOrderingKey() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	var last uuid.UUID
	for _, op := range []string{"open account", "deposit 10", "withdraw 5"} {
		id, err := q.Enqueue(ctx, "ledger", op, backlog.OrderingKey("account:42"))
		if err != nil {
			panic(err)
		}
		last = id
	}
	stop := workInBackground(q, backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, op string) error {
		fmt.Println(op)
		return nil
	}), backlog.Types("ledger"), backlog.Concurrency(8))
	defer stop()
	if _, err := q.Wait(ctx, last); err != nil {
		panic(err)
	}
	// Output:
	// open account
	// deposit 10
	// withdraw 5
}

// At most one live job per unique key: a second enqueue returns the first
// job's ID.
func ExampleUniqueKey() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	first, _ := q.Enqueue(ctx, "sync.user", map[string]int{"user": 7}, backlog.UniqueKey("sync:user:7"))
	res, err := q.InsertMany(ctx, nil, []backlog.JobSpec{{Type: "sync.user", Args: map[string]int{"user": 7},
		Options: []backlog.EnqueueOption{backlog.UniqueKey("sync:user:7")}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("duplicate:", res[0].Duplicate, "same job:", res[0].ID == first)
	// Output:
	// duplicate: true same job: true
}

// A periodic job is enqueued once per plan, however many processes
// register the schedule.
func ExampleQueue_Every() {
	q, _, cleanup := exampleQueue()
	defer cleanup()

	ticked := make(chan string, 10)
	stop := workInBackground(q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		ticked <- job.Type
		return nil
	}), backlog.Types("cache.refresh", "report.hourly"))
	defer stop()

	if err := q.Every("refresh", time.Second, "cache.refresh", nil); err != nil {
		panic(err)
	}
	// Cron takes 5-field specs and descriptors; "@every" aligns like Every.
	if err := q.Cron("hourly", "0 * * * *", "report.hourly", nil); err != nil {
		panic(err)
	}
	fmt.Println(<-ticked)
	// Output:
	// cache.refresh
}

// Cancel stops a running job's handler; Wait returns once it has ended.
func ExampleQueue_Cancel() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	started := make(chan struct{})
	stopped := make(chan error, 1)
	stop := workInBackground(q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		close(started)
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return context.Cause(ctx)
	}), backlog.Types("long"))
	defer stop()

	id, _ := q.Enqueue(ctx, "long", nil)
	<-started
	state, err := q.Cancel(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println("cancel found it", state)
	fmt.Println("handler stopped:", <-stopped)
	info, err := q.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.State, errors.Is(info.Err(), backlog.ErrCancelled))
	// Output:
	// cancel found it running
	// handler stopped: backlog: job cancelled
	// cancelled true
}

// Cancelling Work's context stops it gracefully: handlers get the grace
// period, then their contexts end (cause ErrShutdown) and their jobs go
// back to the queue without spending the attempt.
func ExampleQueue_Work_shutdown() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	started := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
			close(started)
			<-ctx.Done()
			fmt.Println("handler stopped:", context.Cause(ctx))
			return ctx.Err()
		}), backlog.Types("slow"), backlog.GracePeriod(100*time.Millisecond))
	}()
	id, _ := q.Enqueue(ctx, "slow", nil)
	<-started
	cancel()
	fmt.Println("Work returned:", <-done)
	info, _ := q.Job(ctx, id)
	fmt.Println(info.State, "attempt", info.Attempt)
	// Output:
	// handler stopped: backlog: worker shutting down
	// Work returned: <nil>
	// available attempt 0
}
