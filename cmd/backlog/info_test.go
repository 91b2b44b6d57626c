package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/backlogq/backlog"
)

// poll calls cond until it holds or within passes (the library records
// processes and schedules from its own goroutines).
func poll(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		<-tick.C
	}
}

// TestProcessesAndSchedules: a running worker process and a registered
// schedule, as the CLI lists them.
func TestProcessesAndSchedules(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	q := c.queue(backlog.WithWorkerID("cli-test-worker"))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
			backlog.Types("report", "email"), backlog.Concurrency(3), backlog.Prefetch(5), backlog.WorkerTags{"region": "eu"})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	if err := q.Cron("nightly", "0 3 * * *", "report", map[string]string{"kind": "daily"}, backlog.Priority(4)); err != nil {
		t.Fatal(err)
	}
	ctx2 := context.Background()
	poll(t, 20*time.Second, "process and schedule recorded", func() bool {
		ps, err1 := q.Processes(ctx2)
		ss, err2 := q.Schedules(ctx2)
		return err1 == nil && err2 == nil && len(ps) == 1 && len(ss) == 1
	})

	var procs []struct {
		WorkerID string `json:"worker_id"`
		PID      int    `json:"pid"`
		Works    []struct {
			Types       []string          `json:"types"`
			Tags        map[string]string `json:"tags"`
			Concurrency int               `json:"concurrency"`
			Prefetch    int               `json:"prefetch"`
		} `json:"works"`
	}
	c.json(&procs, "processes")
	if len(procs) != 1 || procs[0].WorkerID != "cli-test-worker" || procs[0].PID == 0 || len(procs[0].Works) != 1 ||
		procs[0].Works[0].Concurrency != 3 || procs[0].Works[0].Prefetch != 5 || procs[0].Works[0].Tags["region"] != "eu" ||
		strings.Join(procs[0].Works[0].Types, ",") != "email,report" {
		t.Fatalf("processes: %+v", procs)
	}
	out := c.ok("processes")
	if !strings.Contains(out, "cli-test-worker") || !strings.Contains(out, "email,report 3/5 [region=eu]") {
		t.Fatalf("processes table:\n%s", out)
	}

	var scheds []struct {
		Name     string          `json:"name"`
		Kind     string          `json:"kind"`
		Spec     string          `json:"spec"`
		Type     string          `json:"type"`
		Args     json.RawMessage `json:"args"`
		Priority int             `json:"priority"`
		NextPlan *time.Time      `json:"next_plan"`
		Stale    bool            `json:"stale"`
	}
	c.json(&scheds, "schedules")
	if len(scheds) != 1 || scheds[0].Name != "nightly" || scheds[0].Kind != "cron" || scheds[0].Spec != "0 3 * * *" ||
		scheds[0].Priority != 4 || compact(t, scheds[0].Args) != `{"kind":"daily"}` || scheds[0].NextPlan == nil || scheds[0].Stale {
		t.Fatalf("schedules: %+v", scheds)
	}
	golden(t, c.ok("schedules"), `
NAME     KIND  SPEC       TYPE    LAST PLAN  NEXT PLAN             REGISTERED BY    STALE
nightly  cron  0 3 * * *  report  -          YYYY-MM-DDTHH:MM:SSZ  cli-test-worker  no
`)
}

// TestStatsNothingWaiting: with no available job, stats says that nothing
// waits rather than that the oldest job has waited 0s.
func TestStatsNothingWaiting(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	c.ok("enqueue", "later", "--run-at", "+1h")
	out := c.ok("stats")
	if !strings.Contains(out, "\nno available job is waiting\n") || strings.Contains(out, "oldest available job waiting") {
		t.Fatalf("stats with nothing available:\n%s", out)
	}
	c.ok("enqueue", "now")
	if out := c.ok("stats"); !strings.Contains(out, "\noldest available job waiting: ") {
		t.Fatalf("stats with a job available:\n%s", out)
	}
}
