package backlog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// chargeArgs is a typed job with default options, one of them (the
// unique key) computed from its fields.
type chargeArgs struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

func (chargeArgs) Kind() string { return "order.charge" }

func (a chargeArgs) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{
		backlog.Priority(3),
		backlog.MaxAttempts(7),
		backlog.Timeout(45 * time.Second),
		backlog.Tags{"region": "eu", "team": "billing"},
		backlog.UniqueKey("charge:" + a.OrderID),
		backlog.ConcurrencyKey("order:" + a.OrderID),
	}
}

// plainArgs is a typed job without default options.
type plainArgs struct {
	N int `json:"n"`
}

func (plainArgs) Kind() string { return "plain" }

// ptrArgs is a typed job whose methods have pointer receivers.
type ptrArgs struct {
	Name string `json:"name"`
}

func (*ptrArgs) Kind() string { return "ptr" }

// badKind returns whatever kind it is given, to try invalid kinds.
type badKind struct{ K string }

func (a badKind) Kind() string { return a.K }

// otherCharge claims the kind of chargeArgs with another args type.
type otherCharge struct{}

func (otherCharge) Kind() string { return "order.charge" }

// TestEnqueueArgsAppliesTheArgsDefaults: the kind and the default options
// of an args type reach the job, the unique and concurrency keys computed
// from its fields.
func TestEnqueueArgsAppliesTheArgsDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	id, err := e.q.EnqueueArgs(ctx, chargeArgs{OrderID: "A-1", Cents: 4200})
	require.NoError(t, err)
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "order.charge", info.Type)
	require.JSONEq(t, `{"order_id": "A-1", "cents": 4200}`, string(info.Args))
	require.Equal(t, 3, info.Priority)
	require.Equal(t, 7, info.MaxAttempts)
	require.Equal(t, 45*time.Second, info.Timeout)
	require.Equal(t, map[string]string{"region": "eu", "team": "billing"}, info.Tags)
	require.Equal(t, "charge:A-1", info.UniqueKey)
	require.Equal(t, "order:A-1", info.ConcurrencyKey)

	// The unique key computed from the fields does its work: the same
	// order again is the same job, another order a new one.
	again, err := e.q.EnqueueArgs(ctx, chargeArgs{OrderID: "A-1", Cents: 4200})
	require.NoError(t, err)
	require.Equal(t, id, again)
	other, err := e.q.EnqueueArgs(ctx, chargeArgs{OrderID: "B-2", Cents: 100})
	require.NoError(t, err)
	require.NotEqual(t, id, other)

	// Without defaults: the package's.
	pid, err := e.q.EnqueueArgs(ctx, plainArgs{N: 1})
	require.NoError(t, err)
	pinfo, err := e.q.Job(ctx, pid)
	require.NoError(t, err)
	require.Equal(t, "plain", pinfo.Type)
	require.Equal(t, backlog.DefaultPriority, pinfo.Priority)
	require.Equal(t, backlog.DefaultMaxAttempts, pinfo.MaxAttempts)
	require.Empty(t, pinfo.Tags)

	// Defaults declared on the pointer apply to a pointer.
	oid, err := e.q.EnqueueArgs(ctx, &ptrOptionArgs{})
	require.NoError(t, err)
	oinfo, err := e.q.Job(ctx, oid)
	require.NoError(t, err)
	require.Equal(t, 9, oinfo.Priority)

	// A pointer args type.
	rid, err := e.q.EnqueueArgs(ctx, &ptrArgs{Name: "x"})
	require.NoError(t, err)
	rinfo, err := e.q.Job(ctx, rid)
	require.NoError(t, err)
	require.Equal(t, "ptr", rinfo.Type)
	require.JSONEq(t, `{"name": "x"}`, string(rinfo.Args))
}

// TestEnqueueArgsExplicitOptionsWin: options given at enqueue override the
// args' defaults, the last value winning; tags merge key by key; a key
// option with "" removes a default key; the string API with a JobArgs
// behaves the same.
func TestEnqueueArgsExplicitOptionsWin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	id, err := e.q.EnqueueArgs(ctx, chargeArgs{OrderID: "A-1"},
		backlog.Priority(9), backlog.MaxAttempts(2), backlog.Timeout(0),
		backlog.Tags{"region": "us"}, backlog.UniqueKey(""), backlog.ConcurrencyKey("tenant:9"))
	require.NoError(t, err)
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 9, info.Priority)
	require.Equal(t, 2, info.MaxAttempts)
	require.Zero(t, info.Timeout)
	require.Equal(t, map[string]string{"region": "us", "team": "billing"}, info.Tags)
	require.Empty(t, info.UniqueKey)
	require.Equal(t, "tenant:9", info.ConcurrencyKey)

	// No unique key: the same order is a second job.
	second, err := e.q.EnqueueArgs(ctx, chargeArgs{OrderID: "A-1"}, backlog.UniqueKey(""))
	require.NoError(t, err)
	require.NotEqual(t, id, second)

	// The string API with a JobArgs: an empty type is the kind, the same
	// type is accepted, and the defaults apply before the options.
	for _, typ := range []string{"", "order.charge"} {
		sid, err := e.q.Enqueue(ctx, typ, chargeArgs{OrderID: "S-" + typ}, backlog.Priority(50))
		require.NoError(t, err)
		sinfo, err := e.q.Job(ctx, sid)
		require.NoError(t, err)
		require.Equal(t, "order.charge", sinfo.Type)
		require.Equal(t, 50, sinfo.Priority)
		require.Equal(t, 7, sinfo.MaxAttempts)
		require.Equal(t, "charge:S-"+typ, sinfo.UniqueKey)
	}
}

// TestEnqueueArgsTx: a typed job enqueued in a pgx transaction or a
// database/sql one exists only if it commits, with its defaults.
func TestEnqueueArgsTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	// pgx: rolled back, then committed.
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	gone, err := e.q.EnqueueArgsTx(ctx, tx, chargeArgs{OrderID: "R-1"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = e.q.Job(ctx, gone)
	require.ErrorIs(t, err, backlog.ErrNotFound)

	var id uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		id, err = e.q.EnqueueArgsTx(ctx, tx, chargeArgs{OrderID: "C-1"}, backlog.Priority(1))
		return err
	}))
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "order.charge", info.Type)
	require.Equal(t, 1, info.Priority)
	require.Equal(t, 7, info.MaxAttempts)
	require.Equal(t, "charge:C-1", info.UniqueKey)

	// database/sql, with a bad kind first: the transaction stays usable.
	db := stdlibDB(t)
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = stx.Rollback() }()
	_, err = e.q.EnqueueArgsTx(ctx, stx, badKind{})
	requireInputField(t, err, "type", "empty kind in a database/sql tx")
	sid, err := e.q.EnqueueArgsTx(ctx, stx, plainArgs{N: 2})
	require.NoError(t, err)
	require.NoError(t, stx.Commit())
	sinfo, err := e.q.Job(ctx, sid)
	require.NoError(t, err)
	require.Equal(t, "plain", sinfo.Type)
	require.JSONEq(t, `{"n": 2}`, string(sinfo.Args))
}

// TestEnqueueArgsBatch: typed specs (Spec, or JobSpec with a JobArgs)
// mix with string ones in one batch, in one transaction or not, keep
// their defaults, refer to each other by ID, and InsertMany reports a
// duplicate of a default unique key.
func TestEnqueueArgsBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	first := backlog.Spec(plainArgs{N: 1}, backlog.Priority(4))
	first.ID = backlog.NewID()
	ids, err := e.q.EnqueueMany(ctx, []backlog.JobSpec{
		first,
		backlog.Spec(chargeArgs{OrderID: "M-1"}, backlog.DependsOn(first.ID)),
		{Args: plainArgs{N: 3}},
		{Type: "audit.log", Args: map[string]int{"n": 4}},
	})
	require.NoError(t, err)
	require.Len(t, ids, 4)
	want := []struct {
		typ      string
		args     string
		priority int
		state    backlog.State
	}{
		{"plain", `{"n": 1}`, 4, backlog.StateAvailable},
		{"order.charge", `{"order_id": "M-1", "cents": 0}`, 3, backlog.StateBlocked},
		{"plain", `{"n": 3}`, 0, backlog.StateAvailable},
		{"audit.log", `{"n": 4}`, 0, backlog.StateAvailable},
	}
	for i, w := range want {
		info, err := e.q.Job(ctx, ids[i])
		require.NoError(t, err)
		require.Equal(t, w.typ, info.Type, "job %d", i)
		require.JSONEq(t, w.args, string(info.Args), "job %d", i)
		require.Equal(t, w.priority, info.Priority, "job %d", i)
		require.Equal(t, w.state, info.State, "job %d", i)
	}

	// In a transaction, with InsertMany: the order's default unique key
	// makes the second charge of M-1 a duplicate of the first batch's.
	var got []backlog.Inserted
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		got, err = e.q.InsertMany(ctx, tx, []backlog.JobSpec{
			backlog.Spec(chargeArgs{OrderID: "M-1"}),
			backlog.Spec(chargeArgs{OrderID: "M-2"}),
		})
		return err
	}))
	require.Equal(t, []backlog.Inserted{{ID: ids[1], Duplicate: true}, {ID: got[1].ID}}, got)

	// EnqueueManyTx.
	var txIDs []uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		txIDs, err = e.q.EnqueueManyTx(ctx, tx, []backlog.JobSpec{backlog.Spec(plainArgs{N: 5}), backlog.Spec(plainArgs{N: 6})})
		return err
	}))
	require.Len(t, txIDs, 2)
	require.Equal(t, 2, e.count(`type = 'plain' AND args->>'n' IN ('5', '6')`))
}

// TestEnqueueArgsBadKindWritesNothing: a Kind that is not a valid job
// type, a type that contradicts the Kind, a nil args value and a nil
// option among the defaults are *InputErrors naming the field and the Go
// type, and nothing is written, alone, in a batch or in a transaction.
func TestEnqueueArgsBadKindWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	cases := []struct {
		name  string
		spec  backlog.JobSpec
		field string
		text  string
	}{
		{"empty kind", backlog.Spec(badKind{}), "type", `the Kind of backlog_test.badKind, "": must not be empty`},
		{"NUL in kind", backlog.Spec(badKind{K: "a\x00b"}), "type", "contains a NUL byte"},
		{"long kind", backlog.Spec(badKind{K: strings.Repeat("k", 201)}), "type", "exceeds the 200-byte limit"},
		{"invalid UTF-8", backlog.Spec(badKind{K: "\xff"}), "type", "not valid UTF-8"},
		{"type differs", backlog.JobSpec{Type: "refund", Args: chargeArgs{}}, "type",
			`"refund" differs from the Kind of its args, backlog_test.chargeArgs: "order.charge"`},
		{"nil pointer", backlog.Spec((*ptrArgs)(nil)), "args", "nil *backlog_test.ptrArgs"},
		{"nil default option", backlog.Spec(nilOptionArgs{}), "options", "EnqueueOptions of backlog_test.nilOptionArgs"},
		{"defaults on the pointer", backlog.Spec(ptrOptionArgs{}), "options",
			"backlog_test.ptrOptionArgs declares EnqueueOptions on its pointer, *backlog_test.ptrOptionArgs, which a backlog_test.ptrOptionArgs value does not have"},
	}
	for _, c := range cases {
		check := func(err error, how string) {
			t.Helper()
			requireInputField(t, err, c.field, c.name+" "+how)
			require.ErrorIs(t, err, backlog.ErrInvalid)
			require.Contains(t, err.Error(), c.text, "%s %s", c.name, how)
		}
		_, err := e.q.Enqueue(ctx, c.spec.Type, c.spec.Args, c.spec.Options...)
		check(err, "Enqueue")
		if a, ok := c.spec.Args.(backlog.JobArgs); ok && c.spec.Type == "" {
			_, err = e.q.EnqueueArgs(ctx, a)
			check(err, "EnqueueArgs")
		}
		_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{backlog.Spec(plainArgs{N: 1}), c.spec})
		check(err, "EnqueueMany")
		require.Contains(t, err.Error(), "job 1:", c.name)
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = e.q.EnqueueManyTx(ctx, tx, []backlog.JobSpec{backlog.Spec(plainArgs{N: 1}), c.spec})
		check(err, "EnqueueManyTx")
		// The transaction is still usable.
		_, err = e.q.EnqueueArgsTx(ctx, tx, plainArgs{N: 2})
		require.NoError(t, err, c.name)
		require.NoError(t, tx.Rollback(ctx))
	}
	_, err := e.q.EnqueueArgs(ctx, nil)
	requireInputField(t, err, "args", "nil JobArgs")
	_, err = e.q.EnqueueArgsTx(ctx, e.pool, nil)
	requireInputField(t, err, "args", "nil JobArgs in a tx")
	require.Zero(t, e.count(`true`))
}

// ptrOptionArgs declares its defaults on its pointer: a value has none.
type ptrOptionArgs struct{}

func (ptrOptionArgs) Kind() string { return "ptr.option" }
func (*ptrOptionArgs) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{backlog.Priority(9)}
}

type nilOptionArgs struct{}

func (nilOptionArgs) Kind() string                            { return "nil.option" }
func (nilOptionArgs) EnqueueOptions() []backlog.EnqueueOption { return []backlog.EnqueueOption{nil} }

// TestHandleArgsDuplicateKindPanics: a kind registered twice on one Mux,
// by HandleArgs for the same or another args type, or by HandleArgs and
// Handle in either order, panics with a message naming the kind and both
// registrations; so do an invalid kind, an interface type and a nil
// function.
func TestHandleArgsDuplicateKindPanics(t *testing.T) {
	t.Parallel()
	charge := func(context.Context, *backlog.Job, chargeArgs) error { return nil }
	other := func(context.Context, *backlog.Job, otherCharge) error { return nil }
	str := func(context.Context, *backlog.Job) error { return nil }
	panicText := func(f func()) (msg string) {
		defer func() {
			r := recover()
			require.NotNil(t, r, "no panic")
			msg = fmt.Sprint(r)
		}()
		f()
		return ""
	}
	const both = "backlog: handler for type \"order.charge\" registered twice: "
	cases := map[string]struct {
		first, second func(*backlog.Mux)
		want          string
	}{
		"same args type": {func(m *backlog.Mux) { backlog.HandleArgs(m, charge) }, func(m *backlog.Mux) { backlog.HandleArgs(m, charge) },
			both + "by HandleArgs for args backlog_test.chargeArgs, then by HandleArgs for args backlog_test.chargeArgs"},
		"other args type": {func(m *backlog.Mux) { backlog.HandleArgs(m, charge) }, func(m *backlog.Mux) { backlog.HandleArgs(m, other) },
			both + "by HandleArgs for args backlog_test.chargeArgs, then by HandleArgs for args backlog_test.otherCharge"},
		"typed then string": {func(m *backlog.Mux) { backlog.HandleArgs(m, charge) }, func(m *backlog.Mux) { m.HandleFunc("order.charge", str) },
			both + "by HandleArgs for args backlog_test.chargeArgs, then by Handle"},
		"string then typed": {func(m *backlog.Mux) { m.HandleFunc("order.charge", str) }, func(m *backlog.Mux) { backlog.HandleArgs(m, other) },
			both + "by Handle, then by HandleArgs for args backlog_test.otherCharge"},
	}
	for name, c := range cases {
		m := backlog.NewMux()
		c.first(m)
		require.Equal(t, c.want, panicText(func() { c.second(m) }), name)
		require.Equal(t, []string{"order.charge"}, m.Types(), name)
	}

	m := backlog.NewMux()
	require.Contains(t, panicText(func() {
		backlog.HandleArgs(m, func(context.Context, *backlog.Job, badKind) error { return nil })
	}), `backlog: invalid type: the Kind of backlog_test.badKind, "": must not be empty`)
	require.Contains(t, panicText(func() {
		backlog.HandleArgs(m, func(context.Context, *backlog.Job, backlog.JobArgs) error { return nil })
	}), "HandleArgs needs a concrete args type, not the interface backlog.JobArgs")
	require.Contains(t, panicText(func() {
		backlog.HandleArgs[chargeArgs](m, nil)
	}), `nil handler for kind "order.charge" (backlog_test.chargeArgs)`)
	require.Empty(t, m.Types())
}

// TestTypedAndStringHandlersInOneWork: one Mux with typed handlers (a
// value and a pointer args type) and a string handler, served by one Work
// call: each typed handler gets its decoded value and the Job's metadata.
func TestTypedAndStringHandlersInOneWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	var mu sync.Mutex
	got := map[string]string{}
	record := func(k, v string) {
		mu.Lock()
		defer mu.Unlock()
		got[k] = v
	}
	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a chargeArgs) error {
		record("charge", fmt.Sprintf("%s %d attempt=%d/%d region=%s id=%s", a.OrderID, a.Cents, job.Attempt, job.MaxAttempts, job.Tags["region"], job.ID))
		return job.SetResult(map[string]string{"charged": a.OrderID})
	})
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a *ptrArgs) error {
		record("ptr", a.Name)
		return nil
	})
	mux.HandleFunc("audit.log", func(ctx context.Context, job *backlog.Job) error {
		record("audit", string(job.Args))
		return nil
	})
	require.Equal(t, []string{"audit.log", "order.charge", "ptr"}, mux.Types())

	charge, err := e.q.EnqueueArgs(ctx, chargeArgs{OrderID: "W-1", Cents: 990})
	require.NoError(t, err)
	ptr, err := e.q.EnqueueArgs(ctx, &ptrArgs{Name: "pointer"})
	require.NoError(t, err)
	audit, err := e.q.Enqueue(ctx, "audit.log", map[string]string{"who": "ada"})
	require.NoError(t, err)

	stop := work(t, e.q, mux, backlog.Concurrency(2), backlog.WorkerTags{"region": "eu", "team": "billing"})
	for _, id := range []uuid.UUID{charge, ptr, audit} {
		e.waitState(id, 10*time.Second, backlog.StateCompleted)
	}
	require.NoError(t, stop())
	info, err := e.q.Job(ctx, charge)
	require.NoError(t, err)
	require.JSONEq(t, `{"charged": "W-1"}`, string(info.Result))
	require.Equal(t, map[string]string{
		"charge": "W-1 990 attempt=1/7 region=eu id=" + charge.String(),
		"ptr":    "pointer",
		"audit":  `{"who": "ada"}`,
	}, got)
}

// TestHandleArgsDecodeErrors: args that do not decode into the handler's
// type (a wrong JSON type, null, a value that is not an object) fail the
// attempt at once, without retries, with an error naming ErrArgsDecode's
// text, the job, its kind and the Go type; the handler is not called.
// Unknown fields are ignored and the handler gets the rest.
func TestHandleArgsDecodeErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	var mu sync.Mutex
	var calls []plainArgs
	var hookErrs []error
	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a plainArgs) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, a)
		return nil
	})
	q := e.queue(e.pool, backlog.WithHooks(backlog.Hooks{Finished: func(_ context.Context, job *backlog.Job, ev backlog.JobEvent) {
		if ev.Err != nil {
			mu.Lock()
			hookErrs = append(hookErrs, ev.Err)
			mu.Unlock()
		}
	}}))

	bad := map[string]json.RawMessage{
		"wrong type": json.RawMessage(`{"n": "seven"}`),
		"null":       json.RawMessage(`null`),
		"array":      json.RawMessage(`[1, 2]`),
	}
	ids := map[string]uuid.UUID{}
	for name, args := range bad {
		id, err := e.q.Enqueue(ctx, "plain", args, backlog.MaxAttempts(5))
		require.NoError(t, err)
		ids[name] = id
	}
	extra, err := e.q.Enqueue(ctx, "plain", json.RawMessage(`{"n": 8, "added_later": true}`))
	require.NoError(t, err)

	stop := work(t, q, mux, backlog.Concurrency(2))
	for name, id := range ids {
		info := e.waitState(id, 10*time.Second, backlog.StateFailed)
		require.Equal(t, 1, info.Attempt, name)
		require.Contains(t, info.LastError, "backlog: args do not decode: job "+id.String()+` (kind "plain")`, name)
		require.Contains(t, info.LastError, "backlog_test.plainArgs", name)
	}
	e.waitState(extra, 10*time.Second, backlog.StateCompleted)
	require.NoError(t, stop())

	info, err := e.q.Job(ctx, ids["wrong type"])
	require.NoError(t, err)
	require.Contains(t, info.LastError, "cannot unmarshal string into Go struct field plainArgs.n of type int")
	info, err = e.q.Job(ctx, ids["null"])
	require.NoError(t, err)
	require.Contains(t, info.LastError, "has null args, which would leave a backlog_test.plainArgs unset")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []plainArgs{{N: 8}}, calls)
	require.Len(t, hookErrs, len(bad))
	for _, err := range hookErrs {
		require.ErrorIs(t, err, backlog.ErrArgsDecode)
		require.True(t, backlog.IsPermanent(err))
	}
}

// TestTypedEnqueueHooksAndSchedules: the Enqueuing hook reports a typed
// job's kind, and a schedule registered with a JobArgs and no type runs
// jobs of its kind with its defaults.
func TestTypedEnqueueHooksAndSchedules(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var types []string
	e := newEnv(t, backlog.WithHooks(backlog.Hooks{Enqueuing: func(ctx context.Context, ev backlog.EnqueueEvent) (context.Context, map[string]string) {
		mu.Lock()
		types = append(types, ev.Type)
		mu.Unlock()
		return ctx, nil
	}}))
	ctx := context.Background()
	_, err := e.q.EnqueueArgs(ctx, plainArgs{N: 1})
	require.NoError(t, err)
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{backlog.Spec(plainArgs{N: 2}), {Type: "plain", Args: plainArgs{N: 3}}})
	require.NoError(t, err)
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{backlog.Spec(plainArgs{N: 2}), backlog.Spec(chargeArgs{})})
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, []string{"plain", "plain", ""}, types)
	mu.Unlock()

	require.NoError(t, e.q.Every("charges", time.Second, "", chargeArgs{OrderID: "P-1"}, backlog.Priority(8)))
	requireInputField(t, e.q.Every("bad", time.Second, "", badKind{}), "type", "a schedule of an empty kind")
	ss := waitSchedules(t, e.q, 10*time.Second, "the first plan enqueued", func(ss []backlog.ScheduleInfo) bool {
		return len(ss) == 1 && ss[0].LastJobID != uuid.Nil
	})
	s := ss[0]
	require.Equal(t, "order.charge", s.Type)
	require.Equal(t, 8, s.Priority)
	require.Equal(t, 7, s.MaxAttempts)
	require.Equal(t, "charge:P-1", s.UniqueKey)
	info, err := e.q.Job(ctx, s.LastJobID)
	require.NoError(t, err)
	require.Equal(t, "order.charge", info.Type)
	require.Equal(t, map[string]string{"region": "eu", "team": "billing"}, info.Tags)
	require.Equal(t, 8, info.Priority)
}

// countedArgs counts the calls of its Kind and EnqueueOptions (only
// TestTypedEnqueueAsksItsArgsOnce uses it).
type countedArgs struct{ N int }

var countedKind, countedOptions atomic.Int32

func (countedArgs) Kind() string { countedKind.Add(1); return "counted" }

func (countedArgs) EnqueueOptions() []backlog.EnqueueOption {
	countedOptions.Add(1)
	return []backlog.EnqueueOption{backlog.Priority(3)}
}

// TestTypedEnqueueAsksItsArgsOnce: a typed enqueue asks its args for
// their Kind and default options once per job, with the enqueue hooks
// set, which report the kind.
func TestTypedEnqueueAsksItsArgsOnce(t *testing.T) {
	t.Parallel()
	var types []string
	e := newEnv(t, backlog.WithHooks(backlog.Hooks{
		Enqueuing: func(ctx context.Context, ev backlog.EnqueueEvent) (context.Context, map[string]string) {
			return ctx, nil
		},
		Enqueued: func(_ context.Context, ev backlog.EnqueueEvent) { types = append(types, ev.Type) },
	}))
	ctx := context.Background()
	id, err := e.q.EnqueueArgs(ctx, countedArgs{N: 1})
	require.NoError(t, err)
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{backlog.Spec(countedArgs{N: 2}), backlog.Spec(countedArgs{N: 3})})
	require.NoError(t, err)
	require.Equal(t, int32(3), countedKind.Load(), "Kind calls for 3 jobs")
	require.Equal(t, int32(3), countedOptions.Load(), "EnqueueOptions calls for 3 jobs")
	require.Equal(t, []string{"counted", "counted"}, types)
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 3, info.Priority)
}

// strictArgs refuses fields it does not know, as docs/typed-jobs.md shows.
type strictArgs struct {
	N int `json:"n"`
}

func (strictArgs) Kind() string { return "strict" }

func (a *strictArgs) UnmarshalJSON(b []byte) error {
	type plain strictArgs // without the method: no recursion
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode((*plain)(a))
}

// TestHandleArgsStrictDecoding: an args type's own UnmarshalJSON decides
// what decodes; its error fails the attempt like any decode error.
func TestHandleArgsStrictDecoding(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var mu sync.Mutex
	var got []int
	mux := backlog.NewMux()
	backlog.HandleArgs(mux, func(ctx context.Context, job *backlog.Job, a strictArgs) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, a.N)
		return nil
	})
	ok, err := e.q.EnqueueArgs(ctx, strictArgs{N: 1})
	require.NoError(t, err)
	extra, err := e.q.Enqueue(ctx, "strict", json.RawMessage(`{"n": 2, "added_later": true}`))
	require.NoError(t, err)
	stop := work(t, e.q, mux)
	e.waitState(ok, 10*time.Second, backlog.StateCompleted)
	info := e.waitState(extra, 10*time.Second, backlog.StateFailed)
	require.NoError(t, stop())
	require.Contains(t, info.LastError, `into backlog_test.strictArgs: json: unknown field "added_later"`)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1}, got)
}

// dependentArgs declares a dependency among its default options.
type dependentArgs struct{}

func (dependentArgs) Kind() string { return "dependent" }

func (dependentArgs) EnqueueOptions() []backlog.EnqueueOption {
	return []backlog.EnqueueOption{backlog.DependsOn(backlog.NewID())}
}

// A periodic job registered with args whose default options depend on
// another job is refused as one given the option explicitly is: the
// schedule's checks see the args type's defaults.
func TestEveryRefusesDependsOnAmongTheArgsDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	err := e.q.Every("dep", time.Hour, "", dependentArgs{})
	requireInputField(t, err, "depends on", "Every with DependsOn among the defaults")
}
