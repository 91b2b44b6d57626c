package faults_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// The stress test's invariants, checked from the database (jobs, edges,
// periodic runs), the handlers' execution log, and what the workload
// recorded.

type stJob struct {
	ID                   uuid.UUID
	Type, State          string
	Attempt, MaxAttempts int
	BlockedBy            int
	RunAt                time.Time
	FinishedAt           *time.Time
	UniqueKey, OrderKey  string
	LastError            string
	Tags                 map[string]string
	Args                 stressArgs
	Result               *stressResult
	Errors               []backlog.AttemptError
	Execs                []stExec // by start time
}

type stExec struct {
	Attempt          int
	Worker           string
	Tags             map[string]string // of the Work call that ran it
	Nth              int
	Planned, Outcome string
	Started          time.Time
	Ended            *time.Time
}

type stressStats struct {
	lost, terminated, midJobKills, legitLive, plans, rerunTotal, heldWaited int
	reruns                                                                  map[string]int
	// unwrittenAtKill is the longest a killed child held an outcome
	// unwritten: from its handler's end to the kill.
	unwrittenAtKill time.Duration
}

// stressData is the end state of a run.
type stressData struct {
	s       *stress
	now     time.Time // database clock at load
	jobs    map[uuid.UUID]*stJob
	edges   map[uuid.UUID][]uuid.UUID // pending edges: job -> prerequisites
	runs    map[time.Time]uuid.UUID   // periodic plans of stressTick
	reaped  map[string]time.Time      // killed child -> reaped (database clock)
	states  map[string]int
	planned map[string]int // executions by planned outcome
	execs   int
	stats   stressStats
}

func (s *stress) load() *stressData {
	t, ctx, e := s.t, context.Background(), s.e
	d := &stressData{s: s, now: e.dbNow(), jobs: map[uuid.UUID]*stJob{}, edges: map[uuid.UUID][]uuid.UUID{},
		runs: map[time.Time]uuid.UUID{}, reaped: map[string]time.Time{}, states: map[string]int{}, planned: map[string]int{},
		stats: stressStats{reruns: map[string]int{}}}
	for _, k := range s.kills {
		d.reaped[k.worker] = k.reaped
	}
	rows, err := e.ctl.Query(ctx, `SELECT id, type, state, attempt, max_attempts, blocked_by, run_at, finished_at,
		COALESCE(unique_key, ''), COALESCE(ordering_key, ''), COALESCE(last_error, ''), tags, args, result, errors FROM `+e.table("jobs")+`
		UNION ALL
		SELECT id, type, state, attempt, max_attempts, 0, run_at, finished_at,
		COALESCE(unique_key, ''), COALESCE(ordering_key, ''), COALESCE(last_error, ''), tags, args, result, errors FROM `+e.table("job_history"))
	require.NoError(t, err)
	for rows.Next() {
		j := &stJob{}
		var args, result []byte
		require.NoError(t, rows.Scan(&j.ID, &j.Type, &j.State, &j.Attempt, &j.MaxAttempts, &j.BlockedBy, &j.RunAt, &j.FinishedAt,
			&j.UniqueKey, &j.OrderKey, &j.LastError, &j.Tags, &args, &result, &j.Errors))
		require.NoError(t, json.Unmarshal(args, &j.Args), "args of %s", j.ID)
		if result != nil {
			j.Result = &stressResult{}
			require.NoError(t, json.Unmarshal(result, j.Result), "result of %s", j.ID)
		}
		d.jobs[j.ID] = j
		d.states[j.State]++
	}
	require.NoError(t, rows.Err())
	logDB, logTable := e.ctl, e.table(stressExecTable)
	if s.logDB != nil {
		logDB, logTable = s.logDB, s.logTable
	}
	rows, err = logDB.Query(ctx, `SELECT job_id, attempt, worker, tags, nth, planned, COALESCE(outcome, ''), started_at, ended_at
		FROM `+logTable+` ORDER BY started_at, id`)
	require.NoError(t, err)
	for rows.Next() {
		var id uuid.UUID
		var x stExec
		require.NoError(t, rows.Scan(&id, &x.Attempt, &x.Worker, &x.Tags, &x.Nth, &x.Planned, &x.Outcome, &x.Started, &x.Ended))
		d.execs++
		d.planned[x.Planned]++
		j := d.jobs[id]
		require.NotNil(t, j, "execution of unknown job %s", id)
		j.Execs = append(j.Execs, x)
	}
	require.NoError(t, rows.Err())
	rows, err = e.ctl.Query(ctx, `SELECT prereq, job FROM `+e.table("job_edges"))
	require.NoError(t, err)
	for rows.Next() {
		var p, j uuid.UUID
		require.NoError(t, rows.Scan(&p, &j))
		d.edges[j] = append(d.edges[j], p)
	}
	require.NoError(t, rows.Err())
	rows, err = e.ctl.Query(ctx, `SELECT plan_time, job_id FROM `+e.table("periodic_runs")+` WHERE name = $1`, stressTick)
	require.NoError(t, err)
	for rows.Next() {
		var p time.Time
		var id uuid.UUID
		require.NoError(t, rows.Scan(&p, &id))
		d.runs[p] = id
	}
	require.NoError(t, rows.Err())
	return d
}

// violations collects broken invariants by kind.
type violations struct{ by map[string][]string }

func (v *violations) add(kind, format string, args ...any) {
	if v.by == nil {
		v.by = map[string][]string{}
	}
	v.by[kind] = append(v.by[kind], fmt.Sprintf(format, args...))
}

func (v *violations) report(t testing.TB) {
	kinds := make([]string, 0, len(v.by))
	for k := range v.by {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		list := v.by[k]
		t.Errorf("invariant %q broken %d times; first: \n\t%s", k, len(list), strings.Join(list[:min(len(list), 10)], "\n\t"))
	}
}

var farFuture = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)

// end returns when an execution ended: logged by the handler, or (for a
// killed process, whose last statements may land late) when it was
// reaped.
func (d *stressData) end(x stExec) (time.Time, bool) {
	if x.Ended != nil {
		return *x.Ended, true
	}
	if r, ok := d.reaped[x.Worker]; ok {
		if x.Started.After(r) {
			return x.Started, true
		}
		return r, true
	}
	return farFuture, false
}

// span returns a job's first execution start and last execution end.
func (d *stressData) span(j *stJob) (first, last time.Time) {
	for i, x := range j.Execs {
		if i == 0 {
			first = x.Started
		}
		if end, _ := d.end(x); end.After(last) {
			last = end
		}
	}
	return first, last
}

// check runs every check of the stress test: the invariants, then what
// the stress workload's own calls and faults must have left.
func (d *stressData) check(v *violations) {
	d.checkInvariants(v)
	d.checkCalls(v)
	d.checkFaults(v)
}

// checkInvariants runs the checks of the end state that hold for any run
// of the mixed workload, whatever the faults: TestHAMixed runs them too,
// so a new invariant belongs here to reach both.
func (d *stressData) checkInvariants(v *violations) {
	d.checkLive(v)
	d.checkEnqueues(v)
	d.checkExecutions(v)
	d.checkOutcomes(v)
	d.checkDependencies(v)
	d.checkOrdering(v)
	d.checkUnique(v)
	d.checkPeriodic(v)
}

// checkLive: every job is terminal, or due far in the future, or blocked
// behind such a job with blocked_by matching its pending edges.
func (d *stressData) checkLive(v *violations) {
	memo := map[uuid.UUID]bool{}
	var legit func(j *stJob, depth int) bool
	legit = func(j *stJob, depth int) bool {
		if ok, seen := memo[j.ID]; seen {
			return ok
		}
		ok := false
		switch {
		case depth > 100:
		case j.State == "scheduled":
			ok = j.Args.Future && j.RunAt.After(d.now.Add(10*time.Minute))
		case j.State == "blocked":
			ok = len(d.edges[j.ID]) > 0 && len(d.edges[j.ID]) == j.BlockedBy
			for _, p := range d.edges[j.ID] {
				pj := d.jobs[p]
				ok = ok && pj != nil && legit(pj, depth+1)
			}
		}
		memo[j.ID] = ok
		return ok
	}
	for _, j := range d.jobs {
		switch j.State {
		case "blocked", "scheduled", "available", "running":
			if legit(j, 0) {
				d.stats.legitLive++
			} else {
				v.add("live", "job %s is %s (blocked_by %d, pending edges %v, run_at %s, attempt %d/%d, last error %q, args %+v)",
					j.ID, j.State, j.BlockedBy, d.edges[j.ID], j.RunAt, j.Attempt, j.MaxAttempts, j.LastError, j.Args)
			}
		}
	}
}

// checkEnqueues: no job lost, none from a rolled-back transaction, none
// inserted twice, none that no call enqueued; every error retryable.
func (d *stressData) checkEnqueues(v *violations) {
	bySeq := map[int64][]*stJob{}
	for _, j := range d.jobs {
		if j.Type != stressTick {
			bySeq[j.Args.Seq] = append(bySeq[j.Args.Seq], j)
		}
	}
	known := map[int64]bool{}
	for _, rec := range d.s.recs {
		if rec.err != nil && rec.libErr && !errors.Is(rec.err, backlog.ErrRetryable) {
			v.add("enqueue error", "%s: a non-retryable error: %v", rec.via, rec.err)
		}
		for _, seq := range rec.seqs {
			known[seq] = true
			if rec.rolledBack && len(bySeq[seq]) > 0 {
				v.add("rolled back", "%s: seq %d was rolled back (err %v) but job %s exists", rec.via, seq, rec.err, bySeq[seq][0].ID)
			}
		}
		if rec.acked {
			for _, id := range rec.ids {
				if d.jobs[id] == nil {
					d.stats.lost++
					v.add("lost", "%s: acknowledged job %s (seqs %v) does not exist", rec.via, id, rec.seqs)
				}
			}
		}
	}
	for seq, js := range bySeq {
		if len(js) > 1 {
			v.add("inserted twice", "seq %d: jobs %s and %s", seq, js[0].ID, js[1].ID)
		}
		if !known[seq] {
			v.add("phantom", "job %s (seq %d) was enqueued by no recorded call", js[0].ID, seq)
		}
	}
}

// justifiedRerun names why an execution that was not a job's last may be
// followed by another, or "" when nothing justifies it.
func (d *stressData) justifiedRerun(j *stJob, x stExec) string {
	switch {
	case x.Ended == nil && !d.reaped[x.Worker].IsZero():
		return "SIGKILLed mid-handler"
	case x.Ended == nil:
		return ""
	case x.Outcome == planErr || x.Outcome == planPanic || x.Outcome == planSnooze:
		return "planned " + x.Outcome
	case strings.Contains(x.Outcome, "job timeout"):
		return "planned timeout"
	case strings.Contains(x.Outcome, "shutting down"):
		return "released at shutdown"
	case strings.Contains(x.Outcome, "lease lost"):
		return "lease lost"
	}
	// It ended as planned but its outcome did not stick: its process was
	// killed before writing it, or the write was refused; either way the
	// sweep recorded that attempt's lease as expired.
	for _, ae := range j.Errors {
		if ae.Attempt != x.Attempt || !strings.Contains(ae.Error, "lease") {
			continue
		}
		if r := d.reaped[x.Worker]; !r.IsZero() && !x.Ended.After(r) {
			d.stats.unwrittenAtKill = max(d.stats.unwrittenAtKill, r.Sub(*x.Ended))
			return "SIGKILLed before its outcome was written"
		}
		d.s.t.Logf("job %s: the outcome %q of attempt %d on %s (ended %s) did not stick: %q at %s",
			j.ID, x.Outcome, x.Attempt, x.Worker, x.Ended.Format(time.StampMicro), ae.Error, ae.At.Format(time.StampMicro))
		return "outcome refused after the lease was lost"
	}
	return ""
}

// checkExecutions: a job runs only on workers with its tags; executions
// of one (job, attempt) never overlap; the attempt a handler sees
// increases from one execution to the next (equal only after a snooze or
// a release); every execution ended unless its process was killed; every
// re-execution has a reason.
func (d *stressData) checkExecutions(v *violations) {
	for _, j := range d.jobs {
		for i, x := range j.Execs {
			for k, val := range j.Tags {
				if got, ok := x.Tags[k]; !ok || got != val {
					v.add("tags", "job %s (tags %v) ran on %s with worker tags %v", j.ID, j.Tags, x.Worker, x.Tags)
					break
				}
			}
			end, ok := d.end(x)
			if !ok {
				v.add("unended", "job %s: execution %d (attempt %d on %s, started %s) never ended and its process was not killed",
					j.ID, x.Nth, x.Attempt, x.Worker, x.Started.Format(time.StampMicro))
			}
			for _, y := range j.Execs[i+1:] {
				if y.Attempt == x.Attempt && y.Started.Before(end) {
					v.add("overlap", "job %s attempt %d: executions on %s and %s overlap (%s–%s, %s)", j.ID, x.Attempt,
						x.Worker, y.Worker, x.Started.Format(time.StampMicro), end.Format(time.StampMicro), y.Started.Format(time.StampMicro))
				}
			}
			if i == len(j.Execs)-1 {
				continue
			}
			next := j.Execs[i+1]
			if next.Attempt < x.Attempt || next.Attempt == x.Attempt && x.Outcome != planSnooze && !strings.Contains(x.Outcome, "shutting down") {
				v.add("attempt order", "job %s: attempt %d (%s, outcome %q) then attempt %d: %+v", j.ID, x.Attempt, x.Worker,
					x.Outcome, next.Attempt, j.Execs)
			}
			why := d.justifiedRerun(j, x)
			if why == "" {
				v.add("unjustified re-run", "job %s ran again after execution %d (attempt %d on %s, outcome %q): errors %+v, execs %+v",
					j.ID, x.Nth, x.Attempt, x.Worker, x.Outcome, j.Errors, j.Execs)
			}
			d.stats.reruns[why]++
			d.stats.rerunTotal++
		}
	}
}

// cancelRequested reports whether a Cancel call reached the job while it
// was live, or may have (it failed with a transient error, which can
// come after the commit).
func (d *stressData) cancelRequested(id uuid.UUID) bool {
	for _, c := range d.s.cancels {
		if c.id == id && (c.err != nil || c.state == backlog.StateRunning || c.state == backlog.StateCancelled) {
			return true
		}
	}
	return false
}

// checkOutcomes: a terminal job's state and error follow from its last
// execution; failed jobs say why.
func (d *stressData) checkOutcomes(v *violations) {
	for _, j := range d.jobs {
		var last *stExec
		if len(j.Execs) > 0 {
			last = &j.Execs[len(j.Execs)-1]
		}
		switch j.State {
		case "completed":
			switch {
			case last == nil || last.Ended == nil:
				v.add("outcome", "job %s completed without a finished execution: %+v", j.ID, j.Execs)
			case last.Outcome != planOK && last.Outcome != planLong:
				v.add("outcome", "job %s completed, but its last execution's outcome was %q", j.ID, last.Outcome)
			case j.Attempt != last.Attempt || j.Result == nil || j.Result.Seq != j.Args.Seq || j.Result.Nth != last.Nth:
				v.add("outcome", "job %s completed at attempt %d with result %+v; last execution: %+v", j.ID, j.Attempt, j.Result, *last)
			}
		case "failed":
			want := "lease" // attempts used up by lost leases (killed, cut off)
			if last != nil && last.Ended != nil && last.Attempt == j.Attempt {
				switch o := last.Outcome; {
				case o == planNul:
					want = "NUL"
				case o == planPerm:
					want = "planned permanent failure"
				case o == planErr:
					want = "planned error"
				case o == planPanic:
					want = "planned panic"
				case strings.Contains(o, "job timeout"):
					want = "job timeout"
				}
				if want != "lease" && want != "NUL" && want != "planned permanent failure" && j.Attempt != j.MaxAttempts {
					v.add("outcome", "job %s failed at attempt %d of %d after a retryable %q", j.ID, j.Attempt, j.MaxAttempts, last.Outcome)
				}
			}
			// Its process killed before the last outcome was written, the
			// attempt ends with the sweep's reason instead.
			killed := last != nil && last.Ended != nil && !d.reaped[last.Worker].IsZero() && !last.Ended.After(d.reaped[last.Worker])
			if !strings.Contains(j.LastError, want) && !(killed && strings.Contains(j.LastError, "lease expired: worker "+last.Worker)) {
				v.add("failed without its reason", "job %s failed with %q; expected it to say %q (last execution %+v)", j.ID, j.LastError, want, last)
			}
		case "cancelled":
			prereqBad := false
			for _, p := range j.Args.Deps {
				pj := d.jobs[uuid.MustParse(p)]
				prereqBad = prereqBad || pj != nil && (pj.State == "failed" || pj.State == "cancelled")
			}
			if !prereqBad && !d.cancelRequested(j.ID) {
				v.add("cancelled", "job %s was cancelled, but neither Cancel nor a failed prerequisite asked for it (%q)", j.ID, j.LastError)
			}
			// A cancelled job's last error says so, also when the cancel
			// turned a retry (or an expired lease) into cancelled.
			if !strings.Contains(j.LastError, "cancel") {
				v.add("cancelled", "job %s was cancelled with last error %q", j.ID, j.LastError)
			}
		}
	}
}
