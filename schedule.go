package backlog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"

	"github.com/backlogq/backlog/internal/periodic"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
)

// maxCatchUp bounds CatchUp (its doc states the number).
const maxCatchUp = 1000

// CatchUp, given to Every or Cron, enqueues up to n plans missed while no
// process was running the schedule (the most recent ones). Must be in
// [1, 1000]. Defaults to 1: only the most recent missed plan. It is not
// valid for a plain enqueue.
func CatchUp(n int) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.catchUp = n })
}

// Every registers (or replaces) the schedule name: a job of type typ with
// args and opts is enqueued at every multiple of interval (plan times are
// aligned to the Unix epoch on the database clock, so every process agrees).
// The interval must be at least one second. The schedule is also recorded
// in the database, for Queue.Schedules. As with Enqueue, args may be a
// JobArgs with typ "": its Kind is the type and its default options apply
// before opts.
func (q *Queue) Every(name string, interval time.Duration, typ string, args any, opts ...EnqueueOption) error {
	p, err := planEvery(interval)
	if err != nil {
		return err
	}
	return q.addSchedule(name, ScheduleEvery, interval.String(), p, typ, args, opts)
}

// Cron registers (or replaces) the schedule name with a standard 5-field
// cron expression ("*/5 * * * *") or a descriptor (@hourly, @daily,
// @every 90s…), evaluated in UTC unless it starts with CRON_TZ=<zone>. The
// schedule is also recorded in the database, for Queue.Schedules.
//
// "@every d" plans like Every(d): at multiples of d since the Unix epoch, so
// processes that registered it at different times share the same plans.
func (q *Queue) Cron(name, spec, typ string, args any, opts ...EnqueueOption) error {
	p, err := planCron(spec)
	if err != nil {
		return err
	}
	return q.addSchedule(name, ScheduleCron, spec, p, typ, args, opts)
}

// planEvery returns the planner of Every(interval).
func planEvery(interval time.Duration) (periodic.Planner, error) {
	if interval < time.Second {
		return nil, invalid("interval", "must be at least 1s, got %s", interval)
	}
	return periodic.Every(interval), nil
}

// planCron returns the planner of Cron(spec).
func planCron(spec string) (periodic.Planner, error) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, invalid("cron spec", "%q: %v", spec, err)
	}
	if every, ok := s.(cron.ConstantDelaySchedule); ok {
		if every.Delay < time.Second {
			return nil, invalid("cron spec", "%q: @every must be at least 1s", spec)
		}
		return periodic.Every(every.Delay), nil
	}
	return periodic.Cron{S: s}, nil
}

func (q *Queue) addSchedule(name string, kind ScheduleKind, spec string, p periodic.Planner, typ string, args any, opts []EnqueueOption) error {
	if err := validateText("schedule name", name, maxTypeBytes, false); err != nil {
		return err
	}
	// The options as the job gets them: an args type's defaults first,
	// so that a CatchUp or DependsOn among them is seen too.
	js := JobSpec{Type: typ, Args: args, Options: opts}.resolve()
	if js.err != nil {
		return js.err
	}
	c := enqueueConfig{}
	for _, o := range js.options() {
		if o != nil {
			o.applyEnqueue(&c)
		}
	}
	catchUp := c.catchUp
	if catchUp == 0 {
		catchUp = 1
	}
	if catchUp < 1 || catchUp > maxCatchUp {
		return invalid("catch up", "must be in [1, %d], got %d", maxCatchUp, c.catchUp)
	}
	// CatchUp is the schedule's, not the job's: reset it for the job.
	jobOpts := append(append([]EnqueueOption(nil), opts...), CatchUp(0))
	if len(c.dependsOn) > 0 {
		return invalid("depends on", "periodic jobs cannot depend on other jobs")
	}
	// Validate the job once now, so bad input fails at registration.
	js.Options = jobOpts
	job, err := buildJob(js)
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	q.sched.Add(&periodic.Schedule{Name: name, Planner: p, CatchUp: catchUp,
		Job: scheduledJob{q: q, typ: typ, args: args, opts: jobOpts}, Def: scheduleDef(name, kind, spec, job, catchUp, q.cfg.workerID)})
	q.startLocked(q.sched.Start)
	return nil
}

// scheduledJob is what a schedule's plans are enqueued as (a
// periodic.Job).
type scheduledJob struct {
	q    *Queue
	typ  string
	args any
	opts []EnqueueOption
}

// Enqueue inserts the jobs of the schedule's due plans inside the
// scheduler's transaction tx and returns their postings.
func (j scheduledJob) Enqueue(ctx context.Context, tx pgx.Tx, plans []periodic.Plan) ([]posting.Posting, error) {
	specs := make([]JobSpec, len(plans))
	for i, p := range plans {
		opts := append(append([]EnqueueOption(nil), j.opts...), RunAt(p.At))
		specs[i] = JobSpec{ID: p.ID, Type: j.typ, Args: j.args, Options: opts}
	}
	_, posts, err := j.q.insert(ctx, tx, true, specs)
	return posts, err
}

// ScheduleKind says how a schedule was registered.
type ScheduleKind string

// The kinds of schedule.
const (
	ScheduleEvery ScheduleKind = "every" // registered with Queue.Every
	ScheduleCron  ScheduleKind = "cron"  // registered with Queue.Cron
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
func planOf(kind ScheduleKind, spec string) (periodic.Planner, error) {
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
	rows, now, err := q.readsFor(ctx).Schedules(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("listing schedules: %w", err))
	}
	staleAfter := periodic.StaleConfirms * q.sched.ConfirmInterval()
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
			info.NextPlan = periodic.NextPlan(p, info.LastPlan, now)
		}
		out = append(out, info)
	}
	return out, nil
}
