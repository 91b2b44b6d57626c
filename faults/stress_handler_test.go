package faults_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// The stress test's jobs and their handler. The handler is shared by the
// test process and its SIGKILLable child (stressChildMain), so everything a
// job does is decided when it is enqueued and carried in its args: the
// child needs no seed, and a job behaves the same wherever it runs.

// Job types of the stress test. The workers take all of them (several
// types per Work call); stressTick is the periodic schedule's.
const (
	stressTick = "st.tick"
)

var stressTypes = []string{"st.a", "st.b", "st.c"}

// Planned outcomes of one execution of a stress job.
const (
	planOK      = "ok"      // complete, with a result
	planNul     = "nul"     // complete with a result holding a NUL byte: the job must fail, saying why
	planErr     = "err"     // an error: retried
	planPerm    = "perm"    // backlog.Permanent: failed at once
	planSnooze  = "snooze"  // backlog.Snooze: runs again, no attempt spent
	planPanic   = "panic"   // a panic: retried
	planTimeout = "timeout" // wait for the job's Timeout, then ignore ctx for a bit: retried
	planLong    = "long"    // run for longer than the lease (it must be renewed), then complete
)

// allPlans lists the outcomes the test requires to have happened.
var allPlans = []string{planOK, planNul, planErr, planPerm, planSnooze, planPanic, planTimeout, planLong}

// Durations of the stress handler.
const (
	stressLease     = 3 * time.Second
	stressLongRun   = 4 * time.Second        // > lease: renewed at least once
	stressTimeout   = 400 * time.Millisecond // Timeout of jobs planned to time out
	stressIgnoreCtx = 150 * time.Millisecond // how long a timed-out handler ignores ctx (< lease/5)
)

// stressArgs are a stress job's args: its plan and what the invariants
// need to know about how it was enqueued.
type stressArgs struct {
	Seq    int64    `json:"seq"`            // unique per enqueued job (0: periodic)
	Plan   []string `json:"plan,omitempty"` // outcome of the n-th execution; "ok" past the end
	Ms     int      `json:"ms,omitempty"`   // work per execution
	Snooze int      `json:"snooze,omitempty"`
	Deps   []string `json:"deps,omitempty"` // DependsOn
	Key    string   `json:"key,omitempty"`  // OrderingKey
	KeySeq int      `json:"kseq,omitempty"` // position in the key's enqueue order
	Unique string   `json:"ukey,omitempty"` // UniqueKey
	Future bool     `json:"future,omitempty"`
	Held   bool     `json:"held,omitempty"` // prerequisite of a transaction held open
	Via    string   `json:"via"`            // how it was enqueued
}

// stressResult is what a completed stress job stores.
type stressResult struct {
	Seq int64 `json:"seq"`
	Nth int   `json:"nth"`
}

// stressExecTable is the execution log every handler writes: a row when an
// execution starts (with its planned outcome), ended_at and outcome just
// before it returns (after any ctx-ignoring), so the row's interval covers
// the handler's.
const stressExecTable = "stress_exec"

func createStressExec(ctx context.Context, db *pgxpool.Pool, schema string) error {
	_, err := db.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, stressExecTable}.Sanitize()+` (
		id         bigserial   PRIMARY KEY,
		job_id     uuid        NOT NULL,
		attempt    integer     NOT NULL,
		worker     text        NOT NULL,
		tags       jsonb       NOT NULL, -- the WorkerTags of the Work call that ran it
		nth        integer     NOT NULL,
		planned    text        NOT NULL,
		started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
		ended_at   timestamptz,
		outcome    text);
	CREATE INDEX ON `+pgx.Identifier{schema, stressExecTable}.Sanitize()+` (job_id)`)
	return err
}

// stressWorker is the handler of every stress job type. log is a pool no
// fault is injected into, so the log is complete except for executions
// of killed processes.
type stressWorker struct {
	log    *pgxpool.Pool
	table  string
	worker string
	tags   backlog.WorkerTags
}

// newStressMux returns the handlers for one Work call of worker (the
// Queue's worker ID) with tags (its WorkerTags).
func newStressMux(log *pgxpool.Pool, schema, worker string, tags backlog.WorkerTags) *backlog.Mux {
	if tags == nil {
		tags = backlog.WorkerTags{}
	}
	w := &stressWorker{log: log, table: pgx.Identifier{schema, stressExecTable}.Sanitize(), worker: worker, tags: tags}
	mux := backlog.NewMux()
	for _, typ := range append([]string{stressTick}, stressTypes...) {
		mux.Handle(typ, w)
	}
	return mux
}

// Work runs one execution as planned for it.
func (w *stressWorker) Work(ctx context.Context, job *backlog.Job) (err error) {
	var a stressArgs
	if err := json.Unmarshal(job.Args, &a); err != nil {
		return backlog.Permanent(fmt.Errorf("stress args: %w", err))
	}
	var id int64
	var nth int
	var planned string
	bg := context.WithoutCancel(ctx)
	if err := w.log.QueryRow(bg, `INSERT INTO `+w.table+` (job_id, attempt, worker, tags, nth, planned)
		SELECT $1, $2, $3, $5, c.n, COALESCE(($4::text[])[c.n + 1], 'ok')
		FROM (SELECT count(*)::int AS n FROM `+w.table+` WHERE job_id = $1) c
		RETURNING id, nth, planned`, job.ID, job.Attempt, w.worker, a.Plan, map[string]string(w.tags)).Scan(&id, &nth, &planned); err != nil {
		return fmt.Errorf("logging the execution: %w", err)
	}
	outcome := planned
	defer func() {
		p := recover()
		if p != nil {
			outcome = planPanic
		}
		uctx, cancel := context.WithTimeout(bg, 30*time.Second)
		defer cancel()
		if _, uerr := w.log.Exec(uctx, `UPDATE `+w.table+` SET ended_at = clock_timestamp(), outcome = $2 WHERE id = $1`,
			id, outcome); uerr != nil && err == nil && p == nil {
			err = fmt.Errorf("logging the end of the execution: %w", uerr)
		}
		if p != nil {
			panic(p)
		}
	}()
	// stopped records why ctx ended the execution early.
	stopped := func() error {
		cause := context.Cause(ctx)
		outcome = "ctx: " + cause.Error()
		return cause
	}
	work := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	ms := time.Duration(a.Ms) * time.Millisecond
	switch planned {
	case planOK, planLong:
		if planned == planLong {
			ms = stressLongRun
		}
		if !work(ms) {
			return stopped()
		}
		return job.SetResult(stressResult{Seq: a.Seq, Nth: nth})
	case planNul:
		_ = job.SetResult("bad\x00result") // refused; the job fails whatever the handler returns
		return nil
	case planErr:
		if !work(ms) {
			return stopped()
		}
		return fmt.Errorf("planned error (seq %d, execution %d)", a.Seq, nth)
	case planPerm:
		return backlog.Permanent(errors.New("planned permanent failure"))
	case planSnooze:
		return backlog.Snooze(time.Duration(a.Snooze) * time.Millisecond)
	case planPanic:
		panic(fmt.Sprintf("planned panic (seq %d)", a.Seq))
	case planTimeout:
		if work(time.Minute) {
			return errors.New("planned timeout: the job's Timeout never fired")
		}
		// Ignore ctx for a bit, as a handler stuck in a call would.
		t := time.NewTimer(stressIgnoreCtx)
		<-t.C
		return stopped()
	}
	return backlog.Permanent(fmt.Errorf("unknown plan %q", planned))
}
