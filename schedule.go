package backlog

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"
)

// MaxCatchUp bounds CatchUp.
const MaxCatchUp = 1000

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
// in the database, for Queue.Schedules.
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
func planEvery(interval time.Duration) (planner, error) {
	if interval < time.Second {
		return nil, invalid("interval", "must be at least 1s, got %s", interval)
	}
	return everyPlanner(interval), nil
}

// planCron returns the planner of Cron(spec).
func planCron(spec string) (planner, error) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, invalid("cron spec", "%q: %v", spec, err)
	}
	if every, ok := s.(cron.ConstantDelaySchedule); ok {
		if every.Delay < time.Second {
			return nil, invalid("cron spec", "%q: @every must be at least 1s", spec)
		}
		return everyPlanner(every.Delay), nil
	}
	return cronPlanner{s}, nil
}

func (q *Queue) addSchedule(name string, kind ScheduleKind, spec string, p planner, typ string, args any, opts []EnqueueOption) error {
	if err := validateText("schedule name", name, MaxTypeBytes, false); err != nil {
		return err
	}
	c := enqueueConfig{}
	for _, o := range opts {
		if o != nil {
			o.applyEnqueue(&c)
		}
	}
	catchUp := c.catchUp
	if catchUp == 0 {
		catchUp = 1
	}
	if catchUp < 1 || catchUp > MaxCatchUp {
		return invalid("catch up", "must be in [1, %d], got %d", MaxCatchUp, c.catchUp)
	}
	// CatchUp is the schedule's, not the job's: reset it for the job.
	jobOpts := append(append([]EnqueueOption(nil), opts...), CatchUp(0))
	if len(c.dependsOn) > 0 {
		return invalid("depends on", "periodic jobs cannot depend on other jobs")
	}
	// Validate the job once now, so bad input fails at registration.
	job, err := buildJob(JobSpec{Type: typ, Args: args, Options: jobOpts})
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	if q.sched.enqueue == nil { // before the scheduler starts
		q.sched.enqueue = func(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]posting, error) {
			_, posts, err := q.insert(ctx, tx, true, specs)
			return posts, err
		}
	}
	q.sched.add(&schedule{name: name, planner: p, typ: typ, args: args, opts: jobOpts, catchUp: catchUp,
		def: scheduleDef(name, kind, spec, job, catchUp, q.cfg.workerID)})
	q.announce.start()
	q.sched.start()
	return nil
}
