package backlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
)

// Enqueue inserts one job and returns its ID. The job is visible to workers
// as soon as Enqueue returns. When args is a JobArgs, typ may be "" (its
// Kind is the type; another typ is an *InputError) and its default options
// apply before opts: EnqueueArgs says the same with the compiler's check.
func (q *Queue) Enqueue(ctx context.Context, typ string, args any, opts ...EnqueueOption) (uuid.UUID, error) {
	ids, err := q.enqueue(ctx, nil, []JobSpec{{Type: typ, Args: args, Options: opts}})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

// EnqueueTx inserts one job inside the caller's transaction: the job exists,
// and workers are notified, only if tx commits. tx is a pgx.Tx or a
// database/sql transaction (*sql.Tx, *sqlx.Tx, bun.Tx, …; see Tx); any
// other value, or nil, returns an *InputError naming "tx". The wake-up is
// a NOTIFY sent inside tx, which PostgreSQL delivers at its commit to every
// listening process, this one included.
//
// Bad input returns an *InputError and leaves tx usable, with nothing
// written and none of the enqueue's locks held: validation runs before any
// statement, and a job that the database judges after taking locks (one
// with dependencies, an ordering or unique key, or an ID set by the
// caller) is inserted inside a savepoint, rolled back when it is rejected.
func (q *Queue) EnqueueTx(ctx context.Context, tx Tx, typ string, args any, opts ...EnqueueOption) (uuid.UUID, error) {
	db, err := callerTx(tx)
	if err != nil {
		return uuid.Nil, err
	}
	ids, err := q.enqueue(ctx, db, []JobSpec{{Type: typ, Args: args, Options: opts}})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

// EnqueueMany inserts many jobs in one statement (one round trip) and
// returns their IDs in order. Either all are inserted or none: one invalid
// spec rejects the batch with an error naming its index and field.
func (q *Queue) EnqueueMany(ctx context.Context, specs []JobSpec) ([]uuid.UUID, error) {
	return q.enqueue(ctx, nil, specs)
}

// EnqueueManyTx is EnqueueMany inside the caller's transaction, a pgx.Tx
// or a database/sql one (see Tx and EnqueueTx).
func (q *Queue) EnqueueManyTx(ctx context.Context, tx Tx, specs []JobSpec) ([]uuid.UUID, error) {
	db, err := callerTx(tx)
	if err != nil {
		return nil, err
	}
	return q.enqueue(ctx, db, specs)
}

// callerTx is txDB for a transaction that must be given.
func callerTx(tx Tx) (store.DB, error) {
	if tx == nil {
		return nil, invalid("tx", "must not be nil")
	}
	return txDB(tx)
}

// Inserted reports one job of InsertMany.
type Inserted struct {
	ID uuid.UUID
	// Duplicate is set when the job had a UniqueKey and a live job with the
	// same key existed: ID is that job's, and nothing was inserted.
	Duplicate bool
}

// InsertMany is EnqueueMany (tx nil) or EnqueueManyTx (tx a pgx.Tx or a
// database/sql transaction; see Tx) that also reports which unique jobs
// were duplicates.
func (q *Queue) InsertMany(ctx context.Context, tx Tx, specs []JobSpec) ([]Inserted, error) {
	db, err := txDB(tx)
	if err != nil {
		return nil, err
	}
	out, _, err := q.insert(ctx, db, false, specs)
	return out, err
}

func (q *Queue) enqueue(ctx context.Context, tx store.DB, specs []JobSpec) ([]uuid.UUID, error) {
	res, _, err := q.insert(ctx, tx, false, specs)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids, nil
}

// insert is insertSpecs with the Enqueuing and Enqueued hooks. The specs'
// args are asked for their Kind and default options once, here, for both.
func (q *Queue) insert(ctx context.Context, tx store.DB, queueTx bool, specs []JobSpec) (out []Inserted, posts []posting.Posting, err error) {
	rs := resolveAll(specs)
	if hooks := q.cfg.hooks; hooks.Enqueuing != nil || hooks.Enqueued != nil {
		enqueued := q.enqueueHooks(ctx, rs)
		defer func() { enqueued(out, err) }()
	}
	return q.insertSpecs(ctx, tx, queueTx, rs)
}

// enqueueHooks calls the Enqueuing hook for specs and adds the metadata
// it gave to them, and returns the function that calls the Enqueued hook
// with the insert's outcome (with the context Enqueuing returned).
func (q *Queue) enqueueHooks(ctx context.Context, specs []resolvedSpec) func([]Inserted, error) {
	hooks := q.cfg.hooks
	typ := ""
	for i, s := range specs {
		if i == 0 {
			typ = s.typ
		} else if s.typ != typ {
			typ = ""
			break
		}
	}
	hctx := ctx
	if h := hooks.Enqueuing; h != nil {
		c, meta := h(ctx, EnqueueEvent{Type: typ, Jobs: len(specs)})
		if c != nil {
			hctx = c
		}
		withMetadata(specs, meta)
	}
	start := time.Now()
	n := len(specs)
	return func(out []Inserted, err error) {
		h := hooks.Enqueued
		if h == nil {
			return
		}
		ev := EnqueueEvent{Type: typ, Jobs: n, Duration: time.Since(start), Err: err}
		for _, r := range out {
			if r.Duplicate {
				ev.Duplicates++
			}
		}
		h(hctx, ev)
	}
}

// withMetadata puts meta before each spec's options (after its args'
// defaults), so that the jobs' own Metadata options win. The caller's
// slices of options are not changed.
func withMetadata(specs []resolvedSpec, meta map[string]string) {
	if len(meta) == 0 {
		return
	}
	opt := Metadata(meta)
	for i := range specs {
		specs[i].Options = append([]EnqueueOption{opt}, specs[i].Options...)
	}
}

// insertSpecs validates and inserts specs: in tx when given (the caller's,
// or, with queueTx, one of the Queue's whose commit the caller announces with
// the returned postings), else in a statement of its own.
func (q *Queue) insertSpecs(ctx context.Context, tx store.DB, queueTx bool, specs []resolvedSpec) ([]Inserted, []posting.Posting, error) {
	if q.isClosed() {
		return nil, nil, ErrClosed
	}
	if len(specs) == 0 {
		return nil, nil, invalid("jobs", "no jobs given")
	}
	jobs, graph, err := buildBatch(specs)
	if err != nil {
		return nil, nil, err
	}
	if err := q.checkSchema(ctx); err != nil {
		return nil, nil, err
	}
	if err := q.checkIDs(ctx, tx, specs); err != nil {
		return nil, nil, err
	}
	if tx != nil && !queueTx && (graph || slices.ContainsFunc(specs, func(s resolvedSpec) bool { return s.ID != uuid.Nil })) {
		// The database judges some of this input (an unknown prerequisite,
		// an ID taken since checkIDs) after the batch's statements took
		// locks or wrote rows: in a savepoint, a rejected batch leaves the
		// caller's transaction usable and holding none of them.
		var out []Inserted
		err := q.store.Savepoint(ctx, tx, func() (err error) {
			out, _, err = q.insertJobs(ctx, tx, false, jobs, graph)
			return err
		})
		if err != nil {
			return nil, nil, classify(err)
		}
		return out, nil, nil
	}
	return q.insertJobs(ctx, tx, queueTx, jobs, graph)
}

// insertJobs inserts a validated batch (see insertSpecs).
func (q *Queue) insertJobs(ctx context.Context, tx store.DB, queueTx bool, jobs []store.GraphJob, graph bool) ([]Inserted, []posting.Posting, error) {
	if graph {
		return q.insertGraph(ctx, tx, queueTx, jobs)
	}
	rows := make([]store.NewJob, len(jobs))
	out := make([]Inserted, len(jobs))
	avail := make([]posting.Posting, 0, 1) // if the database makes them available
	for i, j := range jobs {
		rows[i], out[i] = j.NewJob, Inserted{ID: j.ID}
		avail = append(avail, posting.Of(j.Type, j.Tags))
	}
	avail = posting.Dedupe(avail)
	// The postings of what the database decided: available now, or
	// scheduled (by its clock).
	postsOf := func(r store.InsertResult) []posting.Posting {
		var ps []posting.Posting
		if r.Available > 0 {
			ps = avail
		}
		if r.SchedIn >= 0 {
			ps = append(ps[:len(ps):len(ps)], posting.Sched(r.SchedIn))
		}
		return ps
	}

	if tx != nil {
		r, err := q.store.Insert(ctx, tx, rows, nil)
		if err != nil {
			return nil, nil, q.enqueueErr(len(rows), err)
		}
		if queueTx {
			return out, postsOf(r), nil
		}
		// Delivered only if the caller's transaction commits.
		if err := q.announce.inTx(ctx, tx, postsOf(r)); err != nil {
			return nil, nil, q.enqueueErr(len(rows), err)
		}
		return out, nil, nil
	}
	// A quiet process's insert carries its own NOTIFY, saving the
	// notifier's round trip.
	carry, payloads, done := q.announce.carry(avail)
	r, err := q.store.Insert(ctx, q.pool, rows, payloads)
	if done != nil {
		done()
	}
	if err != nil {
		return nil, nil, q.enqueueErr(len(rows), err)
	}
	if carry {
		q.announce.local(postsOf(r))
	} else {
		q.announce.committed(postsOf(r))
	}
	return out, nil, nil
}

// checkIDs refuses IDs the caller set that name an existing job: a
// finished job's ID would otherwise be taken again (finished jobs are out
// of the jobs table and its primary key). Generated IDs are new.
func (q *Queue) checkIDs(ctx context.Context, tx store.DB, specs []resolvedSpec) error {
	var ids []uuid.UUID
	for _, s := range specs {
		if s.ID != uuid.Nil {
			ids = append(ids, s.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	var db store.DB = q.pool
	if tx != nil {
		db = tx
	}
	taken, err := q.store.ExistingIDs(ctx, db, ids)
	if err != nil {
		return classify(fmt.Errorf("checking job IDs: %w", err))
	}
	if len(taken) > 0 {
		return invalid("id", "job %s exists already", taken[0])
	}
	return nil
}

// enqueueErr wraps a failed insert's error.
func (q *Queue) enqueueErr(n int, err error) error {
	if pgerr.DuplicateKey(err, "jobs_pkey") {
		return invalid("id", "a job with this ID exists already")
	}
	return classify(fmt.Errorf("enqueueing %d job(s): %w", n, err))
}

// insertGraph inserts jobs with dependencies, ordering keys or unique keys
// in one transaction: the caller's, or one of its own.
func (q *Queue) insertGraph(ctx context.Context, tx store.DB, queueTx bool, jobs []store.GraphJob) ([]Inserted, []posting.Posting, error) {
	var out []Inserted
	var posts []posting.Posting
	run := func(tx store.DB, announceInTx bool) error {
		res, err := q.store.InsertGraph(ctx, tx, jobs)
		switch {
		case errors.Is(err, store.ErrUnknownPrerequisites):
			if q.cfg.discardAll || len(q.cfg.discard) > 0 {
				return invalid("depends on", "%v (this Queue deletes completed jobs nobody needs kept, WithDiscardCompleted: "+
					"one that completed before its dependent was enqueued is gone; enqueue dependents with their prerequisites "+
					"in one EnqueueMany, or leave the prerequisite's type out)", err)
			}
			return invalid("depends on", "%v", err)
		case pgerr.DuplicateKey(err, "jobs_pkey"):
			return invalid("id", "a job with this ID exists already")
		case errors.Is(err, store.ErrUniqueKeyContention), errors.Is(err, store.ErrSnapshot):
			return &retryableError{err: fmt.Errorf("enqueueing %d job(s): %w", len(jobs), err)}
		case err != nil:
			return fmt.Errorf("enqueueing %d job(s): %w", len(jobs), err)
		}
		out, posts = make([]Inserted, len(res.Jobs)), posting.OfAvail(res.Locked)
		for i, r := range res.Jobs {
			out[i] = Inserted{ID: r.ID, Duplicate: r.Duplicate}
			switch {
			case r.Duplicate:
			case r.State == string(StateAvailable):
				posts = append(posts, posting.Of(r.Type, r.Tags))
			case r.State == string(StateScheduled):
				posts = append(posts, posting.Sched(r.In))
			}
		}
		posts = posting.Dedupe(posts)
		if !announceInTx {
			return nil // announced after the commit
		}
		return q.announce.inTx(ctx, tx, posts)
	}
	if tx != nil {
		if err := run(tx, !queueTx); err != nil {
			return nil, nil, classify(err)
		}
		if queueTx {
			return out, posts, nil
		}
		return out, nil, nil
	}
	if err := pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error { return run(tx, false) }); err != nil {
		return nil, nil, classify(err)
	}
	q.announce.committed(posts)
	return out, nil, nil
}
