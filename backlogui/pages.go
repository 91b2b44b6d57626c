package backlogui

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// Each page reads what it shows through the operator API, a few bounded
// queries: Stats reads the live table and per-minute counters, List one
// keyset page, Job and Graph a handful of indexed rows.

type stateCount struct {
	State backlog.State
	Count int64
	Note  string
}

type typeRow struct {
	Type                                   string
	Blocked, Scheduled, Available, Running int64
	Completed, Failed, Cancelled           int64 // last 24 hours
	FailedHour                             int64
	AvgWait, AvgRun                        time.Duration
	HasTimes                               bool
	Paused                                 bool
	PausedAt                               time.Time
	Limit                                  *backlog.Limit // flow control (types page only); nil: none
	// Percentiles of wait and run time over the last hour and day (types
	// page only); nil: no finished job counted.
	Hour, Day *backlog.Latency
}

type overviewData struct {
	States          []stateCount
	OldestAvailable time.Duration
	Waiting         int64
	Chart           *chart
	Day             bool
	Types           []typeRow
	OldTx           *backlog.OldTransaction
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	day := false
	switch rg := r.URL.Query().Get("range"); rg {
	case "", "hour":
	case "day":
		day = true
	default:
		h.fail(w, r, badRequest("range: want hour or day, got "+rg))
		return
	}
	ctx := r.Context()
	st, err := h.q.Stats(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	now := time.Now()
	hourStart := now.Truncate(time.Minute).Add(-59 * time.Minute)
	hour, err := h.q.Throughput(ctx, hourStart, time.Minute)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	series, start, n, step := hour, hourStart, 60, time.Minute
	if day {
		start, n, step = now.Truncate(time.Hour).Add(-23*time.Hour), 24, time.Hour
		if series, err = h.q.Throughput(ctx, start, time.Hour); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	d := &overviewData{OldestAvailable: st.OldestAvailable, Day: day, Chart: buildChart(series, start, n, step)}
	if tx := st.OldestTransaction; tx != nil && tx.Age >= backlog.OldTransactionWarning {
		d.OldTx = tx
	}
	for _, s := range allStates {
		sc := stateCount{State: s, Count: st.ByState[s]}
		if s.Terminal() {
			sc.Note = "last 24h"
		}
		d.States = append(d.States, sc)
	}
	d.Waiting = st.ByState[backlog.StateAvailable]
	d.Types = typeRows(st, hour, nil)
	h.render(w, r, h.newView(w, r, "overview", "Overview", d))
}

// typeRows builds the per-type table from Stats, the last hour's
// throughput and the paused types.
func typeRows(st *backlog.Stats, hour []backlog.Throughput, paused []backlog.PausedType) []typeRow {
	rows := map[string]*typeRow{}
	get := func(t string) *typeRow {
		if rows[t] == nil {
			rows[t] = &typeRow{Type: t}
		}
		return rows[t]
	}
	for t, by := range st.ByType {
		tr := get(t)
		tr.Blocked, tr.Scheduled, tr.Available, tr.Running = by[backlog.StateBlocked], by[backlog.StateScheduled],
			by[backlog.StateAvailable], by[backlog.StateRunning]
		tr.Completed, tr.Failed, tr.Cancelled = by[backlog.StateCompleted], by[backlog.StateFailed], by[backlog.StateCancelled]
	}
	waits, runs, ns := map[string]time.Duration{}, map[string]time.Duration{}, map[string]int64{}
	for _, p := range hour {
		tr := get(p.Type)
		tr.FailedHour += p.Failed
		n := p.Completed + p.Failed + p.Cancelled
		waits[p.Type] += p.AvgWait * time.Duration(n)
		runs[p.Type] += p.AvgRun * time.Duration(n)
		ns[p.Type] += n
	}
	for t, n := range ns {
		if n > 0 {
			tr := get(t)
			tr.AvgWait, tr.AvgRun, tr.HasTimes = waits[t]/time.Duration(n), runs[t]/time.Duration(n), true
		}
	}
	for _, t := range st.Paused {
		get(t).Paused = true
	}
	for _, p := range paused {
		tr := get(p.Type)
		tr.Paused, tr.PausedAt = true, p.PausedAt
	}
	out := make([]typeRow, 0, len(rows))
	for _, tr := range rows {
		out = append(out, *tr)
	}
	slices.SortFunc(out, func(a, b typeRow) int {
		switch {
		case a.Type < b.Type:
			return -1
		case a.Type > b.Type:
			return 1
		}
		return 0
	})
	return out
}

type jobsData struct {
	Q      *jobsQuery
	Page   *backlog.ListPage
	States []backlog.State
	Query  string // the filter, encoded
	Back   string // this page, to come back to after an action
	First  bool
}

func (h *handler) jobs(w http.ResponseWriter, r *http.Request) {
	q, err := parseJobsQuery(r.URL.Query())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page, err := h.q.List(r.Context(), q.filter, q.opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	back := "/jobs"
	if r.URL.RawQuery != "" {
		back += "?" + r.URL.RawQuery
	}
	d := &jobsData{Q: q, Page: page, States: allStates, Query: q.Encode(), Back: back, First: q.Cursor == ""}
	h.render(w, r, h.newView(w, r, "jobs", "Jobs", d))
}

// A bulk confirmation counts the matching jobs a page at a time, and stops
// at countCap jobs or once countBudget has passed, showing "at least n":
// the page stays fast however many jobs match.
const (
	countCap     = 10_000
	countBudget  = 40 * time.Millisecond
	countTimeout = 2 * time.Second
)

type confirmData struct {
	Q       *jobsQuery
	Action  string
	Verb    string
	Count   int
	AtLeast bool
	Query   string
}

var bulkVerbs = map[string]string{"retry": "Retry", "cancel": "Cancel", "delete": "Delete"}

func (h *handler) confirmBulk(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	action := v.Get("action")
	verb, ok := bulkVerbs[action]
	if !ok {
		h.fail(w, r, badRequest("action: want retry, cancel or delete"))
		return
	}
	if h.cfg.readOnly {
		h.fail(w, r, forbidden("The dashboard is read-only: actions are disabled."))
		return
	}
	q, err := parseJobsQuery(v)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	f := bulkFilter(q.filter, action)
	n, atLeast, err := h.count(r.Context(), f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, h.newView(w, r, "confirm", verb+" matching jobs",
		&confirmData{Q: q, Action: action, Verb: verb, Count: n, AtLeast: atLeast, Query: q.Encode()}))
}

// bulkFilter narrows f to the states an action applies to, as the bulk
// operations default them, so the count shown is the count acted on.
func bulkFilter(f backlog.Filter, action string) backlog.Filter {
	var allowed []backlog.State
	switch action {
	case "retry":
		allowed = []backlog.State{backlog.StateFailed, backlog.StateCancelled}
		if slices.Contains(f.States, backlog.StateCompleted) {
			allowed = append(allowed, backlog.StateCompleted)
		}
	case "cancel":
		allowed = []backlog.State{backlog.StateBlocked, backlog.StateScheduled, backlog.StateAvailable, backlog.StateRunning}
	case "delete":
		allowed = []backlog.State{backlog.StateBlocked, backlog.StateScheduled, backlog.StateAvailable,
			backlog.StateCompleted, backlog.StateFailed, backlog.StateCancelled}
	}
	if len(f.States) == 0 {
		f.States = allowed
		return f
	}
	var keep []backlog.State
	for _, s := range f.States {
		if slices.Contains(allowed, s) {
			keep = append(keep, s)
		}
	}
	f.States = keep
	return f
}

// count counts the jobs f selects, up to countCap or countBudget; atLeast
// reports that it stopped before the end. It reads the primary, as the
// bulk action will: a lagging read pool would show a count the action
// does not find (none at all for jobs that failed a moment ago).
func (h *handler) count(ctx context.Context, f backlog.Filter) (n int, atLeast bool, err error) {
	if len(f.States) == 0 {
		return 0, false, nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(backlog.ReadPrimary(ctx), countTimeout)
	defer cancel()
	opts := backlog.ListOptions{Limit: backlog.MaxListLimit}
	for {
		page, err := h.q.List(ctx, f, opts)
		if err != nil {
			if ctx.Err() != nil && n > 0 {
				return n, true, nil
			}
			return 0, false, err
		}
		n += len(page.Jobs)
		if page.Next == "" {
			return n, false, nil
		}
		if n >= countCap || time.Since(start) > countBudget {
			return n, true, nil
		}
		opts.Cursor = page.Next
	}
}

type jobData struct {
	Job                            *backlog.JobInfo
	Attempts                       []attemptRow
	Progress                       *progressView
	Graph                          *backlog.JobGraph
	Draw                           *graphDrawing
	Chain                          []chainNode
	CanRetry, CanCancel, CanDelete bool
	Back                           string
}

type chainNode struct {
	backlog.GraphNode
	Self bool
}

func (h *handler) job(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, badRequest("not a job ID: "+r.PathValue("id")))
		return
	}
	ctx := r.Context()
	info, err := h.q.Job(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	g, err := h.q.Graph(ctx, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := &jobData{Job: info, Graph: g, Draw: drawGraph(info, g, h.cfg.base), Back: "/jobs/" + id.String(),
		Attempts: attemptRows(info, time.Now()), Progress: progressOf(info.Progress)}
	for _, n := range g.Chain {
		d.Chain = append(d.Chain, chainNode{GraphNode: n, Self: n.ID == id})
	}
	switch info.State {
	case backlog.StateCompleted, backlog.StateFailed, backlog.StateCancelled:
		d.CanRetry, d.CanDelete = true, true
	case backlog.StateScheduled, backlog.StateAvailable:
		d.CanRetry, d.CanCancel, d.CanDelete = true, true, true
	case backlog.StateBlocked:
		d.CanCancel, d.CanDelete = true, true
	case backlog.StateRunning:
		d.CanCancel = true
	}
	h.render(w, r, h.newView(w, r, "job", info.Type+" "+id.String(), d))
}

type typesData struct {
	Types []typeRow
}

func (h *handler) types(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	st, err := h.q.Stats(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	hour, err := h.q.Throughput(ctx, time.Now().Truncate(time.Minute).Add(-59*time.Minute), time.Minute)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	paused, err := h.q.Paused(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// Types that live workers take but that have no jobs yet can be paused
	// too.
	procs, err := h.q.Processes(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for _, p := range procs {
		for _, wk := range p.Works {
			for _, t := range wk.Types {
				if st.ByType[t] == nil {
					st.ByType[t] = map[backlog.State]int64{}
				}
			}
		}
	}
	limits, err := h.q.Limits(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// Limited types without jobs are listed too, with their limits.
	for _, l := range limits {
		if st.ByType[l.Type] == nil {
			st.ByType[l.Type] = map[backlog.State]int64{}
		}
	}
	lhour, lday, err := h.latencies(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rows := typeRows(st, hour, paused)
	for i := range rows {
		for _, l := range limits {
			if l.Type == rows[i].Type {
				rows[i].Limit = &l.Limit
			}
		}
		rows[i].Hour, rows[i].Day = latencyOf(lhour, rows[i].Type), latencyOf(lday, rows[i].Type)
	}
	h.render(w, r, h.newView(w, r, "types", "Types", &typesData{Types: rows}))
}

// latencyTTL is how long the types page reuses the percentiles it read:
// they sum a histogram per counter row (a few thousand rows for a day of
// ten types), and move little in seconds, while the page refreshes every
// two.
const latencyTTL = 10 * time.Second

// latencies returns the percentiles of the last hour and day, read at
// most once per latencyTTL.
func (h *handler) latencies(ctx context.Context) (hour, day []backlog.Latency, err error) {
	h.lat.mu.Lock()
	defer h.lat.mu.Unlock()
	if !h.lat.at.IsZero() && time.Since(h.lat.at) < latencyTTL {
		return h.lat.hour, h.lat.day, nil
	}
	now := time.Now()
	if hour, err = h.q.Latency(ctx, now.Add(-time.Hour)); err != nil {
		return nil, nil, err
	}
	if day, err = h.q.Latency(ctx, now.Add(-24*time.Hour)); err != nil {
		return nil, nil, err
	}
	h.lat.at, h.lat.hour, h.lat.day = now, hour, day
	return hour, day, nil
}

// latencyOf is typ's entry in ls (nil when none counted a job).
func latencyOf(ls []backlog.Latency, typ string) *backlog.Latency {
	for i := range ls {
		if ls[i].Type == typ && (ls[i].Waited > 0 || ls[i].Ran > 0) {
			return &ls[i]
		}
	}
	return nil
}

func (h *handler) schedules(w http.ResponseWriter, r *http.Request) {
	s, err := h.q.Schedules(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, h.newView(w, r, "schedules", "Schedules", s))
}

// maxRunningShown bounds the running jobs the processes page lists.
const maxRunningShown = 200

type processRow struct {
	backlog.ProcessInfo
	Jobs []*backlog.JobInfo
}

type processesData struct {
	Processes []processRow
	Other     []*backlog.JobInfo // running under a worker not listed
	More      bool
}

func (h *handler) processes(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ps, err := h.q.Processes(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	page, err := h.q.List(ctx, backlog.Filter{States: []backlog.State{backlog.StateRunning}},
		backlog.ListOptions{Limit: maxRunningShown, Oldest: true})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := &processesData{More: page.Next != ""}
	idx := map[string]int{}
	for i, p := range ps {
		idx[p.WorkerID] = i
		d.Processes = append(d.Processes, processRow{ProcessInfo: p})
	}
	for _, j := range page.Jobs {
		if i, ok := idx[j.Worker]; ok {
			d.Processes[i].Jobs = append(d.Processes[i].Jobs, j)
		} else {
			d.Other = append(d.Other, j)
		}
	}
	h.render(w, r, h.newView(w, r, "processes", "Processes", d))
}
