package faults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog"
)

// The stress test's workload: enqueuers of every kind, cancels and waits,
// each in its own goroutine with its own random stream derived from the
// seed. What every call did is recorded for the invariants.

// enqRec is one enqueue call (or transaction) and what became of it.
type enqRec struct {
	via        string
	seqs       []int64
	ids        []uuid.UUID // IDs returned (or set up front)
	err        error       // the call's (or the commit's) error
	libErr     bool        // err came from backlog (must be ErrRetryable)
	acked      bool        // everything succeeded: ids must exist
	rolledBack bool        // never committed: seqs must not exist
}

type cancelRec struct {
	id    uuid.UUID
	state backlog.State
	err   error
	at    time.Time // database clock after Cancel returned
}

type waitRec struct {
	id      uuid.UUID
	info    *backlog.JobInfo
	err     error
	retried []error // ErrRetryable errors Wait returned before
}

// stressTagSets are the tags jobs get; every set is matched by an
// in-process worker (see TestStress), so no job depends on the child.
var stressTagSets = []backlog.Tags{nil, nil, nil, {"region": "eu"}, {"region": "us"}, {"region": "us", "gpu": "yes"}}

// genJob draws a job: type, args (plan, work time) and options (tags,
// priority, delay, attempts, timeout). Dependencies, keys and the like
// are the caller's.
func (s *stress) genJob(r *rand.Rand, via string) (string, stressArgs, []backlog.EnqueueOption) {
	a := stressArgs{Seq: s.seq.Add(1), Ms: r.IntN(40), Snooze: 50 + r.IntN(350), Via: via}
	var opts []backlog.EnqueueOption
	timeout := false
	switch w := r.IntN(100); {
	case w < 45:
		a.Plan = []string{planOK}
	case w < 53:
		a.Plan = []string{planErr, planOK}
	case w < 58:
		a.Plan = []string{planErr, planErr, planErr, planErr, planErr, planErr}
	case w < 63:
		a.Plan = []string{planPerm}
	case w < 67:
		a.Plan = []string{planNul}
	case w < 73:
		a.Plan = []string{planSnooze, planOK}
	case w < 78:
		a.Plan = []string{planPanic, planOK}
	case w < 83:
		a.Plan, timeout = []string{planTimeout, planOK}, true
	case w < 86:
		a.Plan = []string{planLong}
	default:
		mix := []string{planOK, planErr, planSnooze, planPanic, planTimeout}
		for range 1 + r.IntN(3) {
			p := mix[r.IntN(len(mix))]
			timeout = timeout || p == planTimeout
			a.Plan = append(a.Plan, p)
		}
	}
	if timeout {
		opts = append(opts, backlog.Timeout(stressTimeout))
	} else if r.IntN(4) == 0 {
		opts = append(opts, backlog.Timeout(30*time.Second))
	}
	opts = append(opts, backlog.MaxAttempts(2+r.IntN(4)), backlog.Priority(r.IntN(4)))
	if tags := stressTagSets[r.IntN(len(stressTagSets))]; tags != nil {
		opts = append(opts, tags)
	}
	switch r.IntN(20) {
	case 0, 1:
		opts = append(opts, backlog.Delay(time.Duration(r.IntN(3000))*time.Millisecond))
	case 2:
		opts = append(opts, backlog.RunAt(time.Now().Add(time.Duration(r.IntN(2000))*time.Millisecond)))
	}
	return stressTypes[r.IntN(len(stressTypes))], a, opts
}

// deps picks up to n earlier acknowledged jobs as prerequisites.
func (s *stress) deps(r *rand.Rand, n int) []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uuid.UUID
	for range n {
		if len(s.recent) == 0 {
			break
		}
		id := s.recent[r.IntN(len(s.recent))]
		dup := false
		for _, d := range out {
			dup = dup || d == id
		}
		if !dup {
			out = append(out, id)
		}
	}
	return out
}

// withDeps adds DependsOn to a job's options and args.
func withDeps(a *stressArgs, opts []backlog.EnqueueOption, ids []uuid.UUID) []backlog.EnqueueOption {
	if len(ids) == 0 {
		return opts
	}
	for _, id := range ids {
		a.Deps = append(a.Deps, id.String())
	}
	return append(opts, backlog.DependsOn(ids...))
}

// record keeps an enqueue call; waitable acknowledged jobs become
// candidates for prerequisites, cancels and waits.
func (s *stress) record(rec *enqRec, waitable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, rec)
	if rec.acked && waitable {
		s.recent = append(s.recent, rec.ids...)
		if len(s.recent) > 200 {
			s.recent = s.recent[len(s.recent)-200:]
		}
	}
}

// queueFor picks where an enqueue or a cancel goes: the NOTIFY queue and
// the poll-only queue under fault, or the control queue.
func (s *stress) queueFor(r *rand.Rand) *backlog.Queue {
	return []*backlog.Queue{s.qa, s.qb, s.e.q}[r.IntN(3)]
}

// pause waits d, or less when the run stops (load shaping only).
func (s *stress) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// enqueueSingles: one Enqueue at a time, with dependencies, unique keys,
// and now and then a job due in an hour (with a dependent), which must
// still be waiting at the end.
func (s *stress) enqueueSingles(r *rand.Rand) {
	ctx := context.Background()
	for s.pause(time.Duration(30+r.IntN(60)) * time.Millisecond) {
		typ, a, opts := s.genJob(r, "enqueue")
		waitable := true
		switch w := r.IntN(100); {
		case w < 20:
			opts = withDeps(&a, opts, s.deps(r, 1+r.IntN(3)))
		case w < 28:
			a.Unique = fmt.Sprintf("u%d", r.IntN(6))
			opts = append(opts, backlog.UniqueKey(a.Unique))
		case w < 29:
			a.Future, waitable = true, false
			opts = append(opts, backlog.RunAt(time.Now().Add(time.Hour)))
		}
		id, err := s.queueFor(r).Enqueue(ctx, typ, a, opts...)
		s.record(&enqRec{via: "enqueue", seqs: []int64{a.Seq}, ids: []uuid.UUID{id}, err: err, libErr: true, acked: err == nil}, waitable)
		if a.Future && err == nil {
			typ, d, opts := s.genJob(r, "enqueue-after-future")
			opts = withDeps(&d, opts, []uuid.UUID{id})
			id, err := s.e.q.Enqueue(ctx, typ, d, opts...)
			s.record(&enqRec{via: d.Via, seqs: []int64{d.Seq}, ids: []uuid.UUID{id}, err: err, libErr: true, acked: err == nil}, false)
		}
	}
}

// enqueueBatches: EnqueueMany with diamonds (A; B and C after A; D after
// both), a failing prerequisite now and then, and links to earlier jobs.
func (s *stress) enqueueBatches(r *rand.Rand) {
	ctx := context.Background()
	for s.pause(time.Duration(150+r.IntN(300)) * time.Millisecond) {
		var specs []backlog.JobSpec
		var seqs []int64
		add := func(a stressArgs, typ string, opts []backlog.EnqueueOption) uuid.UUID {
			id := backlog.NewID()
			specs = append(specs, backlog.JobSpec{ID: id, Type: typ, Args: a, Options: opts})
			seqs = append(seqs, a.Seq)
			return id
		}
		for range 1 + r.IntN(3) {
			if r.IntN(2) == 0 { // a diamond
				typ, a, opts := s.genJob(r, "many")
				if r.IntN(3) == 0 {
					a.Plan = []string{planPerm} // its dependents are cancelled
				}
				opts = withDeps(&a, opts, s.deps(r, r.IntN(2)))
				top := add(a, typ, opts)
				var mid []uuid.UUID
				for range 2 {
					typ, a, opts := s.genJob(r, "many")
					mid = append(mid, add(a, typ, withDeps(&a, opts, []uuid.UUID{top})))
				}
				typ, a, opts = s.genJob(r, "many")
				add(a, typ, withDeps(&a, opts, mid))
			} else {
				typ, a, opts := s.genJob(r, "many")
				add(a, typ, opts)
			}
		}
		ids, err := s.queueFor(r).EnqueueMany(ctx, specs)
		if err == nil && len(ids) != len(specs) {
			err = fmt.Errorf("EnqueueMany returned %d IDs for %d jobs", len(ids), len(specs))
		}
		for i := 0; err == nil && i < len(ids); i++ {
			if ids[i] != specs[i].ID {
				err = fmt.Errorf("EnqueueMany returned ID %s for job %d, set up as %s", ids[i], i, specs[i].ID)
			}
		}
		rec := &enqRec{via: "many", seqs: seqs, err: err, libErr: true, acked: err == nil}
		for _, sp := range specs {
			rec.ids = append(rec.ids, sp.ID)
		}
		s.record(rec, true)
	}
}

// enqueueTxs: EnqueueTx in the caller's transaction (on the control pool
// or on a pool under fault), committed or rolled back.
func (s *stress) enqueueTxs(r *rand.Rand) {
	ctx := context.Background()
	for s.pause(time.Duration(100+r.IntN(200)) * time.Millisecond) {
		q, pool := s.e.q, s.e.ctl
		if r.IntN(2) == 0 {
			q, pool = s.qa, s.qaPool
		}
		rec := &enqRec{via: "tx"}
		tx, err := pool.Begin(ctx)
		if err != nil {
			rec.err, rec.rolledBack = err, true
			s.record(rec, true)
			continue
		}
		for range 1 + r.IntN(3) {
			typ, a, opts := s.genJob(r, "tx")
			if r.IntN(4) == 0 {
				opts = withDeps(&a, opts, s.deps(r, 1))
			}
			rec.seqs = append(rec.seqs, a.Seq)
			id, err := q.EnqueueTx(ctx, tx, typ, a, opts...)
			if err != nil {
				rec.err, rec.libErr = err, true
				break
			}
			rec.ids = append(rec.ids, id)
		}
		switch {
		case rec.err != nil || r.IntN(10) < 3:
			rec.via = "tx-rollback"
			_ = tx.Rollback(ctx)
			rec.rolledBack = true
		default:
			rec.err = tx.Commit(ctx)
			rec.acked = rec.err == nil // on error the outcome is unknown
		}
		s.record(rec, true)
	}
}

// enqueueOrdered enqueues jobs with ordering keys one at a time from one
// goroutine, so enqueue order is call order (KeySeq).
func (s *stress) enqueueOrdered(r *rand.Rand) {
	ctx := context.Background()
	kseq := map[string]int{}
	for s.pause(time.Duration(50+r.IntN(100)) * time.Millisecond) {
		typ, a, opts := s.genJob(r, "ordered")
		a.Key = fmt.Sprintf("k%d", r.IntN(5))
		kseq[a.Key]++
		a.KeySeq = kseq[a.Key]
		opts = append(opts, backlog.OrderingKey(a.Key))
		if r.IntN(10) == 0 {
			opts = withDeps(&a, opts, s.deps(r, 1))
		}
		id, err := s.queueFor(r).Enqueue(ctx, typ, a, opts...)
		s.record(&enqRec{via: "ordered", seqs: []int64{a.Seq}, ids: []uuid.UUID{id}, err: err, libErr: true, acked: err == nil}, true)
	}
}

// cancelJobs cancels recent jobs, the newest half of the time (as they
// arrive).
func (s *stress) cancelJobs(r *rand.Rand) {
	ctx := context.Background()
	for s.pause(time.Duration(100+r.IntN(300)) * time.Millisecond) {
		s.mu.Lock()
		if len(s.recent) == 0 {
			s.mu.Unlock()
			continue
		}
		id := s.recent[len(s.recent)-1]
		if r.IntN(2) == 0 {
			id = s.recent[r.IntN(len(s.recent))]
		}
		s.mu.Unlock()
		st, err := s.queueFor(r).Cancel(ctx, id)
		rec := cancelRec{id: id, state: st, err: err}
		if qerr := s.e.ctl.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&rec.at); qerr != nil {
			s.t.Errorf("reading the database clock: %v", qerr)
		}
		s.mu.Lock()
		s.cancels = append(s.cancels, rec)
		s.mu.Unlock()
	}
}

// waitJobs starts a Queue.Wait on a recent job every few seconds (on the
// NOTIFY queue or the poll-only one); they end on their own.
func (s *stress) waitJobs(r *rand.Rand) {
	for s.pause(time.Duration(2000+r.IntN(3000)) * time.Millisecond) {
		s.mu.Lock()
		if len(s.recent) == 0 {
			s.mu.Unlock()
			continue
		}
		id := s.recent[r.IntN(len(s.recent))]
		s.mu.Unlock()
		q := s.qa
		if r.IntN(2) == 0 {
			q = s.qb
		}
		s.waitWG.Go(func() {
			ctx, cancel := context.WithTimeout(s.waitCtx, 3*time.Minute)
			defer cancel()
			rec := waitRec{id: id}
			// Wait polls through transient errors itself (see
			// TestWaitSurvivesTerminatedConnections): an ErrRetryable here
			// is a violation, counted by the invariants.
			rec.info, rec.err = q.Wait(ctx, id)
			if errors.Is(rec.err, backlog.ErrRetryable) {
				rec.retried = append(rec.retried, rec.err)
			}
			s.mu.Lock()
			s.waits = append(s.waits, rec)
			s.mu.Unlock()
		})
	}
}

// heldRec is one transaction held open after EnqueueTx(DependsOn(P))
// while P was running.
type heldRec struct {
	p, d       uuid.UUID
	committed  bool
	begin, end time.Time // database clock: P running and the dependent enqueued; commit or rollback
	err        error
}

// holdTransactions: P (a 2 s job, run only by the held worker, which no
// fault touches) is enqueued; once P runs, a transaction enqueues a
// dependent of P and stays open 3-5 s, so P's handler returns while the
// transaction holds its row. P must keep its lease and complete once.
func (s *stress) holdTransactions(r *rand.Rand) {
	ctx := context.Background()
	for s.pause(time.Duration(4000+r.IntN(4000)) * time.Millisecond) {
		typ, a, opts := s.genJob(r, "held-p")
		a.Plan, a.Ms, a.Held = []string{planOK}, 2000, true
		opts = append(opts[:0:0], backlog.Tags{"held": "yes"}, backlog.MaxAttempts(5))
		p, err := s.e.q.Enqueue(ctx, typ, a, opts...)
		s.record(&enqRec{via: a.Via, seqs: []int64{a.Seq}, ids: []uuid.UUID{p}, err: err, libErr: true, acked: err == nil}, false)
		if err != nil {
			s.t.Errorf("enqueueing a held prerequisite on the control queue: %v", err)
			continue
		}
		running := false
		for i := 0; i < 200 && !running && s.pause(50*time.Millisecond); i++ {
			var st string
			if err := s.e.ctl.QueryRow(ctx, `SELECT state FROM `+s.e.table("all_jobs")+` WHERE id = $1`, p).Scan(&st); err != nil {
				s.t.Errorf("reading a held prerequisite: %v", err)
				return
			}
			running = st == "running"
		}
		if !running {
			continue // stopping, or P never started in time: no hold this time
		}
		h := heldRec{p: p}
		rec := &enqRec{via: "held-tx"}
		h.err = pgx.BeginFunc(ctx, s.e.ctl, func(tx pgx.Tx) error {
			typ, d, opts := s.genJob(r, "held-tx")
			d.Plan = []string{planOK}
			opts = withDeps(&d, opts, []uuid.UUID{p})
			rec.seqs = []int64{d.Seq}
			id, err := s.e.q.EnqueueTx(ctx, tx, typ, d, opts...)
			if err != nil {
				rec.libErr = true
				return err
			}
			h.d, rec.ids = id, []uuid.UUID{id}
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&h.begin); err != nil {
				return err
			}
			hold := time.NewTimer(time.Duration(3000+r.IntN(2000)) * time.Millisecond)
			<-hold.C // the fault: the transaction stays open
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&h.end); err != nil {
				return err
			}
			if r.IntN(4) == 0 {
				return errRollBack
			}
			return nil
		})
		h.committed = h.err == nil
		rec.acked, rec.rolledBack = h.committed, !h.committed
		if errors.Is(h.err, errRollBack) {
			h.err, rec.via = nil, "held-tx-rollback"
		} else {
			rec.err = h.err
		}
		s.record(rec, true)
		s.mu.Lock()
		s.helds = append(s.helds, h)
		s.mu.Unlock()
	}
}

var errRollBack = errors.New("rolled back on purpose")

// sampleUnique checks, twice a second, that no unique key has two live
// jobs (a sample that fails is counted, not a sample).
func (s *stress) sampleUnique() {
	ctx := context.Background()
	for s.pause(500 * time.Millisecond) {
		var dups []string
		rows, err := s.e.ctl.Query(ctx, `SELECT unique_key || ': ' || count(*) FROM `+s.e.table("jobs")+`
			WHERE unique_key IS NOT NULL AND state IN ('blocked', 'scheduled', 'available', 'running') GROUP BY unique_key HAVING count(*) > 1`)
		if err == nil {
			dups, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		s.mu.Lock()
		if err != nil {
			s.sampleErrs++
			if !s.tolerateSampleErrs {
				s.t.Errorf("sampling unique keys: %v", err)
			}
			s.mu.Unlock()
			continue
		}
		s.uniqueSamples++
		s.uniqueDups = append(s.uniqueDups, dups...)
		s.mu.Unlock()
	}
}
