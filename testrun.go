package backlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/internal/claim"
	"github.com/backlogq/backlog/internal/maintain"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testbridge"
)

// The test runs of package backlogtest (Work, DrainUntilIdle): a handler
// runs on one job in the caller's goroutine, claimed by the claim
// statement and recorded by the completer's fenced finish, as under Work,
// only without the acquirer and its worker goroutines. Reached through internal/testbridge, so that
// package backlog exports nothing for it; so are the typed args' kind and
// decoding, so that backlogtest's typed assertions find and decode jobs as
// HandleArgs does.
func init() {
	testbridge.Pool = func(q any) *pgxpool.Pool { return q.(*Queue).pool }
	testbridge.NewInline = newTestRun
	testbridge.ArgsKind = argsKind
	testbridge.UnmarshalArgs = unmarshalArgs
}

// testRun implements testbridge.Inline.
type testRun struct {
	q    *Queue
	w    *workCall
	cl   *claim.Claimer[*heldLease]
	stop func() bool             // stops watching the caller's ctx
	halt context.CancelCauseFunc // cancels the handlers' context

	mu    sync.Mutex
	waits map[*claimed]chan bool // per job run: hears whether its outcome was written
}

func newTestRun(ctx context.Context, qa, ha, oa any) (testbridge.Inline, error) {
	q, _ := qa.(*Queue)
	if q == nil {
		return nil, invalid("queue", "must not be nil")
	}
	h, _ := ha.(Handler)
	opts, _ := oa.([]WorkOption)
	w, err := q.prepareWork(ctx, h, opts, workConfig{concurrency: 1, grace: defaultGracePeriod}, true)
	if errors.Is(err, errStoppedEarly) {
		return nil, context.Cause(ctx)
	}
	if err != nil {
		return nil, err
	}
	hard, halt := context.WithCancelCause(context.WithoutCancel(ctx))
	in := &testRun{q: q, cl: q.claim, halt: halt, waits: map[*claimed]chan bool{}}
	in.stop = context.AfterFunc(ctx, func() { halt(ErrShutdown) })
	w.hard, w.written = hard, in.settled
	in.w = w
	return in, nil
}

func (in *testRun) Close() {
	in.stop()
	in.halt(nil)
	in.q.works.Done()
}

// Work claims job id and runs the handler on it.
func (in *testRun) Work(ctx context.Context, id uuid.UUID) (testbridge.Run, error) {
	q := in.q
	r, err := q.store.Get(ctx, q.pool, id)
	if errors.Is(err, store.ErrNotFound) {
		return testbridge.Run{}, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return testbridge.Run{}, q.readErr(ctx, fmt.Errorf("reading job %s: %w", id, err))
	}
	if in.w.mux != nil && !slices.Contains(in.w.mux.Types(), r.Type) {
		return testbridge.Run{}, fmt.Errorf("job %s is of type %q, which the Mux does not handle (it handles %q)", id, r.Type, in.w.mux.Types())
	}
	if State(r.State) != StateAvailable {
		why := ""
		switch State(r.State) {
		case StateScheduled:
			why = fmt.Sprintf(" (due at %s)", r.RunAt.Format("2006-01-02T15:04:05.000Z07:00"))
		case StateBlocked:
			why = " (waiting for its prerequisites or its ordering key's predecessor)"
		}
		return testbridge.Run{}, fmt.Errorf("job %s (%s) is %s%s, not available: only an available job can be claimed", id, r.Type, r.State, why)
	}
	spec, err := newDomainSpec([]string{r.Type}, r.Tags)
	if err != nil {
		return testbridge.Run{}, err
	}
	// The claim takes the type's first due job: every other one is held
	// locked (the claim skips it) until the claim has returned.
	tx, err := q.pool.Begin(ctx)
	if err != nil {
		return testbridge.Run{}, classify(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := q.store.LockOthers(ctx, tx, r.Type, id); err != nil {
		return testbridge.Run{}, classify(err)
	}
	res, err := in.cl.Claim(ctx, spec.types, spec.tagsJ, 1, 1, false, 0)
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if err != nil {
		return testbridge.Run{}, classify(err)
	}
	switch {
	case len(res.Jobs) == 1 && res.Jobs[0].ID == id:
		return in.run(ctx, res.Jobs[0])
	case len(res.Jobs) > 0:
		in.cl.Release(res.Jobs)
		return testbridge.Run{}, fmt.Errorf("job %s (%s): the claim took job %s instead", id, r.Type, res.Jobs[0].ID)
	case res.Limited != store.LimitedNone:
		return testbridge.Run{}, fmt.Errorf("job %s (%s) was not claimed: a limit of its type (SetLimit) holds it back", id, r.Type)
	default:
		return testbridge.Run{}, fmt.Errorf("job %s (%s) was not claimed: its type is paused, or another transaction holds its row", id, r.Type)
	}
}

// Next claims the next due job of the handler's types and runs it.
func (in *testRun) Next(ctx context.Context, all bool) (testbridge.Run, bool, bool, error) {
	q, spec := in.q, in.w.spec
	if spec == nil {
		return testbridge.Run{}, false, false, invalid("types", "draining needs at least one job type (register handlers on a Mux or pass backlog.Types)")
	}
	if all {
		if err := q.store.MakeDue(ctx, spec.types, spec.tagsJ); err != nil {
			return testbridge.Run{}, false, false, classify(err)
		}
	}
	for {
		p, err := q.store.Promote(ctx, maintain.PromoteBatch)
		q.announce.committed(posting.OfAvail(p.Avail))
		if err != nil {
			return testbridge.Run{}, false, false, classify(fmt.Errorf("promoting scheduled jobs: %w", err))
		}
		if !p.More || p.Jobs < maintain.PromoteBatch {
			break
		}
	}
	res, err := in.cl.Claim(ctx, spec.types, spec.tagsJ, 1, 1, false, 0)
	if err != nil {
		return testbridge.Run{}, false, false, classify(err)
	}
	if len(res.Jobs) == 0 {
		busy, err := q.store.Busy(ctx, spec.types, spec.tagsJ)
		return testbridge.Run{}, false, busy, classify(err)
	}
	r, err := in.run(ctx, res.Jobs[0])
	return r, true, false, err
}

// settled hears from the completer whether c's outcome was written.
func (in *testRun) settled(c *claimed, ok bool) {
	in.mu.Lock()
	ch := in.waits[c]
	delete(in.waits, c)
	in.mu.Unlock()
	if ch != nil {
		ch <- ok // buffered
	}
}

// run runs the handler on job as a Work call's worker does and waits until
// its outcome is written (or refused by the fence). Once ctx is done, it
// waits for the write at most the grace period (at least a second), as
// Work does.
func (in *testRun) run(ctx context.Context, c *claimed) (testbridge.Run, error) {
	ch := make(chan bool, 1)
	in.mu.Lock()
	in.waits[c] = ch
	in.mu.Unlock()
	job, f, herr := in.w.run(c)
	if job == nil { // not started: given back or cancelled
		job = in.w.jobOf(c)
	}
	r := testbridge.Run{Job: job, Outcome: string(outcomeOf(f, herr)), Err: herr}
	select {
	case r.Written = <-ch:
	case <-ctx.Done():
		t := time.NewTimer(max(in.w.cfg.grace, time.Second))
		defer t.Stop()
		select {
		case r.Written = <-ch:
		case <-t.C:
			return r, fmt.Errorf("job %s: its outcome was not written within the grace period after the context ended: %w",
				job.ID, context.Cause(ctx))
		}
	}
	if !r.Written {
		r.Outcome = string(OutcomeLeaseLost)
	}
	return r, nil
}
