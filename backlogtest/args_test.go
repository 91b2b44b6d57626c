package backlogtest_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogtest"
	"github.com/backlogq/backlog/internal/testdb"
)

// invoiceArgs is a typed job with a default priority and a unique key
// computed from its field.
type invoiceArgs struct {
	Invoice int    `json:"invoice"`
	Note    string `json:"note"`
}

func (invoiceArgs) Kind() string { return "invoice.render" }

func (a invoiceArgs) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{backlog.Priority(5), backlog.UniqueKey("invoice:" + strconv.Itoa(a.Invoice))}
}

// refArgs has pointer receivers.
type refArgs struct {
	Ref string `json:"ref"`
}

func (*refArgs) Kind() string { return "ref" }

func TestRequireEnqueuedArgs(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	id, err := q.EnqueueArgs(ctx, invoiceArgs{Invoice: 7, Note: "first"})
	require.NoError(tt, err)
	_, err = q.EnqueueArgs(ctx, invoiceArgs{Invoice: 8, Note: "second"}, backlog.Tags{"region": "eu"})
	require.NoError(tt, err)
	_, err = q.EnqueueArgs(ctx, &refArgs{Ref: "r-1"})
	require.NoError(tt, err)

	// The oldest job of the kind, decoded, with its record.
	got := backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tt, q, nil)
	require.Equal(tt, invoiceArgs{Invoice: 7, Note: "first"}, got.Args)
	require.Equal(tt, id, got.Job.ID)
	require.Equal(tt, 5, got.Job.Priority)
	require.Equal(tt, "invoice:7", got.Job.UniqueKey)

	// Narrowed by Want: a T in Args checks every field it encodes.
	got = backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tt, q, &backlogtest.Want{Args: invoiceArgs{Invoice: 8, Note: "second"}})
	require.Equal(tt, "second", got.Args.Note)
	got = backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tt, q, &backlogtest.Want{Tags: map[string]string{"region": "eu"}, Priority: new(5)})
	require.Equal(tt, 8, got.Args.Invoice)
	ref := backlogtest.RequireEnqueuedArgs[*refArgs](ctx, tt, q, nil)
	require.Equal(tt, "r-1", ref.Args.Ref)

	// Every match, in enqueue order; none is an empty slice.
	all := backlogtest.EnqueuedArgs[invoiceArgs](ctx, tt, q, nil)
	require.Len(tt, all, 2)
	require.Equal(tt, []int{7, 8}, []int{all[0].Args.Invoice, all[1].Args.Invoice})
	require.Empty(tt, backlogtest.EnqueuedArgs[invoiceArgs](ctx, tt, q, &backlogtest.Want{Args: map[string]any{"invoice": 9}}))
	require.NotNil(tt, backlogtest.EnqueuedArgs[invoiceArgs](ctx, tt, q, &backlogtest.Want{Args: map[string]any{"invoice": 9}}))

	backlogtest.RequireNotEnqueuedArgs[invoiceArgs](ctx, tt, q, &backlogtest.Want{Args: map[string]any{"invoice": 9}})
	msg := fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireNotEnqueuedArgs[invoiceArgs](ctx, tb, q, &backlogtest.Want{Args: map[string]any{"invoice": 8}})
	})
	require.Contains(tt, msg, `1 job(s) of type "invoice.render" matching {args ⊇ {"invoice":8}} were enqueued, want none`)
}

// The failures name the kind, what was enqueued instead, and, for args
// that do not decode into T, the job and T.
func TestRequireEnqueuedArgsFailures(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	msg := fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tb, q, nil) })
	require.Contains(tt, msg, `no job of type "invoice.render" was enqueued`)

	_, err := q.EnqueueArgs(ctx, invoiceArgs{Invoice: 1})
	require.NoError(tt, err)
	msg = fails(tt, func(tb backlogtest.TB) {
		backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tb, q, &backlogtest.Want{Args: invoiceArgs{Invoice: 2}})
	})
	require.Contains(tt, msg, `no job of type "invoice.render" matching {args ⊇ {"invoice":2,"note":""}} was enqueued`)
	require.Contains(tt, msg, `args at .invoice: want 2, have 1`)

	// Enqueued through the string API with args of another shape.
	bad, err := q.Enqueue(ctx, "invoice.render", map[string]string{"invoice": "seven"})
	require.NoError(tt, err)
	want := &backlogtest.Want{Args: map[string]string{"invoice": "seven"}}
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tb, q, want) })
	require.Contains(tt, msg, "RequireEnqueuedArgs: decoding the args of job "+bad.String()+" (invoice.render) into backlogtest_test.invoiceArgs: json: cannot unmarshal string")
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.EnqueuedArgs[invoiceArgs](ctx, tb, q, nil) })
	require.Contains(tt, msg, "EnqueuedArgs: decoding the args of job "+bad.String())
	_, err = q.Enqueue(ctx, "ref", nil)
	require.NoError(tt, err)
	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedArgs[*refArgs](ctx, tb, q, nil) })
	require.Contains(tt, msg, "has null args, which do not decode into *backlogtest_test.refArgs")

	msg = fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedArgs[backlog.JobArgs](ctx, tb, q, nil) })
	require.Contains(tt, msg, "RequireEnqueuedArgs needs a concrete args type, not the interface backlog.JobArgs")
}

// RequireEnqueuedArgsTx sees what a transaction enqueued before it
// commits, with pgx and with database/sql.
func TestRequireEnqueuedArgsTx(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	pool := testdb.Pool(tt)

	tx, err := pool.Begin(ctx)
	require.NoError(tt, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = q.EnqueueArgsTx(ctx, tx, invoiceArgs{Invoice: 3})
	require.NoError(tt, err)
	got := backlogtest.RequireEnqueuedArgsTx[invoiceArgs](ctx, tt, q, tx, nil)
	require.Equal(tt, 3, got.Args.Invoice)
	fails(tt, func(tb backlogtest.TB) { backlogtest.RequireEnqueuedArgs[invoiceArgs](ctx, tb, q, nil) }) // not committed

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(tt, err)
	defer stx.Rollback() //nolint:errcheck
	_, err = q.EnqueueArgsTx(ctx, stx, invoiceArgs{Invoice: 4})
	require.NoError(tt, err)
	got = backlogtest.RequireEnqueuedArgsTx[invoiceArgs](ctx, tt, q, stx, nil)
	require.Equal(tt, 4, got.Args.Invoice)
	require.Equal(tt, "invoice:4", got.Job.UniqueKey)
}

// A typed handler on a Mux runs under DrainUntilIdle like any other.
func TestDrainUntilIdleTyped(tt *testing.T) {
	ctx := context.Background()
	q := newQ(tt)
	var mu sync.Mutex
	var seen []int
	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a invoiceArgs) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, a.Invoice)
		return nil
	})
	mux.HandleFunc("audit", func(context.Context, *backlog.Job) error { return nil })
	_, err := q.EnqueueMany(ctx, []backlog.JobSpec{backlog.Spec(invoiceArgs{Invoice: 1}), {Type: "audit"}, backlog.Spec(invoiceArgs{Invoice: 2})})
	require.NoError(tt, err)
	s := backlogtest.DrainUntilIdle(ctx, tt, q, mux, nil)
	require.Equal(tt, 3, s.Count(backlog.OutcomeCompleted))
	mu.Lock()
	require.ElementsMatch(tt, []int{1, 2}, seen)
	mu.Unlock()
	for _, e := range backlogtest.EnqueuedArgs[invoiceArgs](ctx, tt, q, nil) {
		require.Equal(tt, backlog.StateCompleted, e.Job.State)
	}
}
