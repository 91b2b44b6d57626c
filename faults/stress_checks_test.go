package faults_test

import (
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// More of the stress test's invariants: dependencies, ordering and unique
// keys, the periodic schedule, what Cancel and Wait returned, and that
// every injected fault happened.

// checkDependencies: a dependent starts only after all its prerequisites
// completed (and their handlers returned); a failed or cancelled
// prerequisite cancels it.
func (d *stressData) checkDependencies(v *violations) {
	for _, j := range d.jobs {
		first, _ := d.span(j)
		for _, p := range j.Args.Deps {
			pj := d.jobs[uuid.MustParse(p)]
			if pj == nil {
				v.add("dependency", "job %s depends on %s, which does not exist", j.ID, p)
				continue
			}
			_, pEnd := d.span(pj)
			switch {
			case len(j.Execs) > 0 && pj.State != "completed":
				v.add("dependency", "job %s ran although its prerequisite %s is %s", j.ID, p, pj.State)
			case len(j.Execs) > 0 && (pj.FinishedAt == nil || first.Before(*pj.FinishedAt) || first.Before(pEnd)):
				v.add("dependency", "job %s started at %s, before its prerequisite %s completed (finished %v, last execution ended %s)",
					j.ID, first.Format(time.StampMicro), p, pj.FinishedAt, pEnd.Format(time.StampMicro))
			case (pj.State == "failed" || pj.State == "cancelled") && j.State != "cancelled":
				v.add("dependency", "job %s is %s although its prerequisite %s is %s", j.ID, j.State, p, pj.State)
			}
		}
	}
}

// checkOrdering: jobs of one ordering key ran one at a time, in enqueue
// order.
func (d *stressData) checkOrdering(v *violations) {
	byKey := map[string][]*stJob{}
	for _, j := range d.jobs {
		if j.Args.Key != "" {
			byKey[j.Args.Key] = append(byKey[j.Args.Key], j)
			if j.OrderKey != j.Args.Key {
				v.add("ordering", "job %s has ordering key %q, enqueued with %q", j.ID, j.OrderKey, j.Args.Key)
			}
		}
	}
	for key, js := range byKey {
		sort.Slice(js, func(a, b int) bool { return js[a].Args.KeySeq < js[b].Args.KeySeq })
		var prevEnd time.Time
		var prev *stJob
		for _, j := range js {
			if len(j.Execs) == 0 {
				continue
			}
			first, last := d.span(j)
			if prev != nil && first.Before(prevEnd) {
				v.add("ordering", "key %s: job #%d (%s) started %s, before job #%d (%s) ended %s", key, j.Args.KeySeq, j.ID,
					first.Format(time.StampMicro), prev.Args.KeySeq, prev.ID, prevEnd.Format(time.StampMicro))
			}
			if last.After(prevEnd) {
				prevEnd, prev = last, j
			}
		}
	}
}

// checkUnique: never two live jobs of one unique key (sampled during the
// run, and at the end), and their executions never overlap.
func (d *stressData) checkUnique(v *violations) {
	for _, dup := range d.s.uniqueDups {
		v.add("unique", "sampled two live jobs of one unique key: %s", dup)
	}
	byKey := map[string][]*stJob{}
	for _, j := range d.jobs {
		if j.UniqueKey != "" {
			byKey[j.UniqueKey] = append(byKey[j.UniqueKey], j)
		}
	}
	for key, js := range byKey {
		live := 0
		var ran []*stJob
		for _, j := range js {
			if j.State == "blocked" || j.State == "scheduled" || j.State == "available" || j.State == "running" {
				live++
			}
			if len(j.Execs) > 0 {
				ran = append(ran, j)
			}
		}
		if live > 1 {
			v.add("unique", "key %s has %d live jobs at the end", key, live)
		}
		sort.Slice(ran, func(a, b int) bool { return ran[a].Execs[0].Started.Before(ran[b].Execs[0].Started) })
		var prev *stJob
		var prevEnd time.Time
		for _, j := range ran {
			first, last := d.span(j)
			if prev != nil && first.Before(prevEnd) {
				v.add("unique", "key %s: job %s ran from %s, before job %s had ended (%s)", key, j.ID,
					first.Format(time.StampMicro), prev.ID, prevEnd.Format(time.StampMicro))
			}
			if last.After(prevEnd) {
				prev, prevEnd = j, last
			}
		}
	}
	d.s.mu.Lock()
	samples := d.s.uniqueSamples
	d.s.mu.Unlock()
	if samples == 0 {
		v.add("unique", "the unique-key sampler never ran")
	}
}

// checkPeriodic: exactly one job per plan time, plans on the 1 s grid,
// each job at its plan time.
func (d *stressData) checkPeriodic(v *violations) {
	perJob := map[uuid.UUID]int{}
	for plan, id := range d.runs {
		perJob[id]++
		if !plan.Equal(plan.Truncate(time.Second)) {
			v.add("periodic", "plan %s is not on the 1 s grid", plan.Format(time.StampMicro))
		}
		if j := d.jobs[id]; j == nil || j.Type != stressTick || !j.RunAt.Equal(plan) {
			v.add("periodic", "plan %s: job %s missing, of another type, or not due at the plan time (%+v)", plan, id, j)
		}
	}
	for _, j := range d.jobs {
		if j.Type == stressTick && perJob[j.ID] != 1 {
			v.add("periodic", "periodic job %s (run_at %s) belongs to %d plans", j.ID, j.RunAt, perJob[j.ID])
		}
	}
	d.stats.plans = len(d.runs)
	if min := int(d.s.dur/time.Second) / 2; len(d.runs) < min {
		v.add("periodic", "only %d plans in a %s run (want at least %d)", len(d.runs), d.s.dur, min)
	}
}

// checkCalls: what Cancel and Wait returned agrees with the end state;
// the held-open transactions cost their prerequisite nothing.
func (d *stressData) checkCalls(v *violations) {
	for _, c := range d.s.cancels {
		j := d.jobs[c.id]
		switch {
		case c.err != nil:
			if !errors.Is(c.err, backlog.ErrRetryable) {
				v.add("cancel", "Cancel(%s): a non-retryable error: %v", c.id, c.err)
			}
		case j == nil:
			v.add("cancel", "Cancel(%s) returned %s for a job that does not exist", c.id, c.state)
		case c.state == backlog.StateRunning:
			if j.State != "cancelled" && j.State != "completed" && j.State != "failed" {
				v.add("cancel", "job %s: Cancel returned running, the job ended %s", c.id, j.State)
			}
		case string(c.state) != j.State:
			v.add("cancel", "job %s: Cancel returned %s, the job ended %s", c.id, c.state, j.State)
		case c.state == backlog.StateCancelled:
			for _, x := range j.Execs {
				if x.Started.After(c.at) {
					v.add("cancel", "job %s ran at %s, after Cancel returned cancelled (%s)", c.id, x.Started.Format(time.StampMicro), c.at.Format(time.StampMicro))
				}
			}
		}
	}
	for _, w := range d.s.waits {
		j := d.jobs[w.id]
		switch {
		case w.err != nil:
			v.add("wait", "Wait(%s): %v", w.id, w.err)
		case j == nil || !w.info.State.Terminal() || string(w.info.State) != j.State:
			v.add("wait", "Wait(%s) returned %s; the job ended %+v", w.id, w.info.State, j)
		}
	}
	for _, h := range d.s.helds {
		p, dj := d.jobs[h.p], d.jobs[h.d]
		switch {
		case h.err != nil:
			v.add("held", "the held transaction on %s failed: %v", h.p, h.err)
		case p == nil || p.State != "completed" || len(p.Execs) != 1 || len(p.Errors) != 0:
			v.add("held", "prerequisite %s of a held-open transaction did not complete at once: %+v", h.p, p)
		case h.committed && dj == nil:
			v.add("held", "the dependent %s of %s was committed but does not exist", h.d, h.p)
		case !h.committed && dj != nil:
			v.add("held", "the dependent %s of %s was rolled back but exists", h.d, h.p)
		case p.Execs[0].Ended != nil && p.Execs[0].Ended.Before(h.end):
			d.stats.heldWaited++ // P's outcome had to wait for the transaction's row lock
		}
	}
}

// checkFaults: every fault the run claims happened did.
func (d *stressData) checkFaults(v *violations) {
	s := d.s
	for _, tr := range s.terms {
		d.stats.terminated += tr.backends
		if tr.backends == 0 {
			v.add("fault", "a termination round of %v ended no backend (%d tries)", tr.targets, tr.tries)
		}
	}
	for _, k := range s.kills {
		if k.held > 0 {
			d.stats.midJobKills++
		}
	}
	swept := 0
	for _, j := range d.jobs {
		for _, ae := range j.Errors {
			if strings.Contains(ae.Error, "lease expired: worker child.") {
				swept++
			}
		}
	}
	nul := 0
	for _, j := range d.jobs {
		if j.State == "failed" && strings.Contains(j.LastError, "NUL") {
			nul++
		}
	}
	for what, n := range map[string]int{"termination rounds": len(s.terms), "SIGKILLs": len(s.kills),
		"SIGKILLs of a child holding a running job": d.stats.midJobKills, "leases of killed children swept": swept,
		"transactions held open on a running prerequisite":      len(s.helds),
		"prerequisites finishing while a transaction held them": d.stats.heldWaited, "jobs failed by a NUL result": nul,
		"cancels": len(s.cancels), "waits": len(s.waits)} {
		if n == 0 {
			v.add("fault", "no %s happened", what)
		}
	}
	for _, p := range allPlans {
		if d.planned[p] == 0 {
			v.add("fault", "no execution was planned to %q", p)
		}
	}
}
