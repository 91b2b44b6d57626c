package backlog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// ScheduleKind says how a schedule was registered.
type ScheduleKind string

// The kinds of schedule.
const (
	ScheduleEvery ScheduleKind = "every" // registered with Queue.Every
	ScheduleCron  ScheduleKind = "cron"  // registered with Queue.Cron
)

// How the schedules table learns which schedules are still registered:
// each process confirms its own every scheduleConfirm (jittered by ±20 %);
// a schedule nobody confirmed for scheduleStaleConfirms of those is stale.
const (
	scheduleConfirm       = 5 * time.Minute
	scheduleStaleConfirms = 3
	// scheduleRetry is the pause after recording schedules failed.
	scheduleRetry = 10 * time.Second
)

// ScheduleInfo is a periodic schedule as the processes that register it
// (Every, Cron) recorded it, with its latest and next plans.
type ScheduleInfo struct {
	// Name is the schedule's name.
	Name string
	// Kind is how it was registered.
	Kind ScheduleKind
	// Spec is, for Every, the interval as time.Duration prints it
	// ("1h0m0s"); for Cron, the expression as given ("*/5 * * * *",
	// "@every 90s").
	Spec string
	// Type and Args are the job each plan enqueues.
	Type string
	Args json.RawMessage
	// The job's options: Tags (nil: none), Priority, MaxAttempts, Timeout
	// (0: none), OrderingKey and UniqueKey ("": none); and CatchUp, the
	// schedule's.
	Tags        map[string]string
	Priority    int
	MaxAttempts int
	Timeout     time.Duration
	OrderingKey string
	UniqueKey   string
	CatchUp     int
	// LastPlan is the plan time of the latest job enqueued for the
	// schedule, and LastJobID that job's ID (zero: none yet).
	LastPlan  time.Time
	LastJobID uuid.UUID
	// NextPlan is the first plan time after both LastPlan and the
	// database's now(): when the next job will be enqueued, as long as a
	// running process registers the schedule. Zero when the spec has no
	// further plan.
	NextPlan time.Time
	// CreatedAt is when the schedule was first registered, and UpdatedAt
	// when its definition last changed (database clock).
	CreatedAt time.Time
	UpdatedAt time.Time
	// RegisteredAt is when a process last registered the schedule or
	// confirmed it (each process running it does every 5 minutes), and
	// RegisteredBy the worker ID of the process that last registered it.
	RegisteredAt time.Time
	RegisteredBy string
	// Stale reports that no process has confirmed the schedule for 15
	// minutes: no running process registers it any more, so no plan is
	// enqueued (NextPlan says when one would be). A stale schedule stays
	// listed until its row in the schedules table is deleted by hand; a
	// process that registers it again makes it current.
	Stale bool
}

// scheduleOptions is the options column of the schedules table.
type scheduleOptions struct {
	Priority    int    `json:"priority"`
	MaxAttempts int    `json:"max_attempts"`
	TimeoutMS   int64  `json:"timeout_ms"`
	OrderingKey string `json:"ordering_key,omitempty"`
	UniqueKey   string `json:"unique_key,omitempty"`
	CatchUp     int    `json:"catch_up"`
}

// scheduleDef is the row a registration writes.
func scheduleDef(name string, kind ScheduleKind, spec string, job store.GraphJob, catchUp int, by string) store.Schedule {
	opts, _ := json.Marshal(scheduleOptions{Priority: int(job.Priority), MaxAttempts: int(job.MaxAttempts),
		TimeoutMS: job.Timeout.Milliseconds(), OrderingKey: job.OrderingKey, UniqueKey: job.UniqueKey, CatchUp: catchUp}) // cannot fail
	return store.Schedule{Name: name, Kind: string(kind), Spec: spec, Type: job.Type, Args: job.Args, Tags: job.Tags,
		Options: opts, RegisteredBy: by}
}

// planOf returns the planner of a stored schedule.
func planOf(kind ScheduleKind, spec string) (planner, error) {
	switch kind {
	case ScheduleEvery:
		d, err := time.ParseDuration(spec)
		if err != nil {
			return nil, invalid("interval", "%q: %v", spec, err)
		}
		return planEvery(d)
	case ScheduleCron:
		return planCron(spec)
	}
	return nil, invalid("schedule kind", "unknown kind %q", kind)
}

// Schedules lists the periodic schedules registered with Every or Cron by
// any process of the queue's schema, by name, with their latest and next
// plans. Each process records the schedules it registers in the schedules
// table (at registration, and confirms them every 5 minutes while it
// runs), so any Queue can list them, one that registers none too. When
// processes register different definitions under one name, the one
// registered last is listed. A schedule that no process confirms any more
// is listed as Stale; it is never deleted automatically.
func (q *Queue) Schedules(ctx context.Context) ([]ScheduleInfo, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	rows, now, err := q.store.Schedules(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("listing schedules: %w", err))
	}
	staleAfter := scheduleStaleConfirms * q.sched.confirmEvery
	out := make([]ScheduleInfo, 0, len(rows))
	for _, r := range rows {
		var opts scheduleOptions
		if err := json.Unmarshal(r.Options, &opts); err != nil {
			return nil, fmt.Errorf("decoding the options of schedule %s: %w", r.Name, err)
		}
		info := ScheduleInfo{Name: r.Name, Kind: ScheduleKind(r.Kind), Spec: r.Spec, Type: r.Type, Args: r.Args,
			Priority: opts.Priority, MaxAttempts: opts.MaxAttempts, Timeout: time.Duration(opts.TimeoutMS) * time.Millisecond,
			OrderingKey: opts.OrderingKey, UniqueKey: opts.UniqueKey, CatchUp: opts.CatchUp, LastJobID: r.LastJobID,
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, RegisteredAt: r.RegisteredAt, RegisteredBy: r.RegisteredBy,
			Stale: now.Sub(r.RegisteredAt) > staleAfter}
		if err := json.Unmarshal(r.Tags, &info.Tags); err != nil {
			return nil, fmt.Errorf("decoding the tags of schedule %s: %w", r.Name, err)
		}
		if len(info.Tags) == 0 {
			info.Tags = nil
		}
		if r.LastPlan != nil {
			info.LastPlan = *r.LastPlan
		}
		// A row this version cannot read (written by hand, or by a later
		// version) is listed without a next plan.
		if p, err := planOf(info.Kind, info.Spec); err == nil {
			info.NextPlan = nextPlan(p, info.LastPlan, now)
		}
		out = append(out, info)
	}
	return out, nil
}

// record writes the definitions of the schedules registered since it last
// ran and, every confirm interval, confirms the others (re-writing those
// whose row was deleted). It returns when it must run next. Failing only
// delays the listing: plans are enqueued all the same.
func (s *scheduler) record(ctx context.Context) time.Duration {
	now := time.Now()
	s.mu.Lock()
	if now.Before(s.retryAt) {
		s.mu.Unlock()
		return time.Until(s.retryAt)
	}
	var confirm []string
	if !now.Before(s.confirmAt) {
		for n, sc := range s.schedules {
			if sc.stored {
				confirm = append(confirm, n)
			}
		}
	}
	s.mu.Unlock()
	failed := func(what string, err error) time.Duration {
		if ctx.Err() == nil && !s.faults.failed("schedules", err) {
			s.log.Warn("backlog: "+what+" failed; Schedules lists them once it succeeds", "err", classify(err))
		}
		s.mu.Lock()
		s.retryAt = time.Now().Add(scheduleRetry)
		s.mu.Unlock()
		return scheduleRetry
	}
	if len(confirm) > 0 {
		missing, err := s.store.ConfirmSchedules(ctx, confirm)
		if err != nil {
			return failed("confirming periodic schedules", err)
		}
		s.mu.Lock()
		for _, n := range missing {
			if sc := s.schedules[n]; sc != nil {
				sc.stored = false
			}
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	if !now.Before(s.confirmAt) {
		s.confirmAt = now.Add(jitter(s.confirmEvery))
	}
	var defs []store.Schedule
	var scs []*schedule
	for _, sc := range s.schedules {
		if !sc.stored {
			defs = append(defs, sc.def)
			scs = append(scs, sc)
		}
	}
	s.mu.Unlock()
	if len(defs) > 0 {
		if err := s.store.RegisterSchedules(ctx, defs); err != nil {
			return failed("recording periodic schedules", err)
		}
		s.mu.Lock()
		for _, sc := range scs {
			sc.stored = true // a schedule replaced meanwhile is another, not yet stored
		}
		s.mu.Unlock()
	}
	s.faults.ok("schedules")
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Until(s.confirmAt)
}
