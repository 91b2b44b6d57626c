package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// TestShowGraph: show prints the graph around a job, finished neighbours
// with their final states, and counts what a long list leaves out.
// graphNeighbours is how many jobs Queue.Graph lists on each side (the
// JobGraph doc's 100).
const graphNeighbours = 100

func TestShowGraph(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	q := c.queue()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	enq := func(typ string, opts ...backlog.EnqueueOption) uuid.UUID {
		t.Helper()
		id, err := q.Enqueue(ctx, typ, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a := enq("extract")
	b := enq("transform", backlog.DependsOn(a))
	later := enq("load", backlog.DependsOn(b)) // never worked
	f := enq("charge", backlog.MaxAttempts(1))
	g := enq("receipt", backlog.DependsOn(f))
	specs := make([]backlog.JobSpec, graphNeighbours+3)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "load", Options: []backlog.EnqueueOption{backlog.DependsOn(a)}}
	}
	if _, err := q.EnqueueMany(ctx, specs); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
			if j.Type == "charge" {
				return backlog.Permanent(errors.New("card declined"))
			}
			return nil
		}), backlog.Types("extract", "transform", "charge"))
	}()
	for id, want := range map[uuid.UUID]backlog.State{b: backlog.StateCompleted, g: backlog.StateCancelled} {
		if info, err := q.Wait(ctx, id); err != nil || info.State != want {
			t.Fatalf("job %s: %+v %v, want %s", id, info, err, want)
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	golden(t, c.ok("show", b.String()), `
ID:          xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
Type:        transform
State:       completed
Priority:    0
Attempt:     1 of 25
Timeout:     -
Tags:        -
Worker:      `+workerOf(t, q, b)+`
Created:     YYYY-MM-DDTHH:MM:SSZ
Run at:      YYYY-MM-DDTHH:MM:SSZ
Started:     YYYY-MM-DDTHH:MM:SSZ
Finished:    YYYY-MM-DDTHH:MM:SSZ
Last error:  -

Args:
  null

Prerequisites:
ID                                    TYPE     STATE      EDGE
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  extract  completed  depends

Dependents:
ID                                    TYPE  STATE      EDGE
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  load  available  depends
`)
	var show showJSON
	c.json(&show, "show", b.String())
	if len(show.Prerequisites) != 1 || show.Prerequisites[0] != (nodeJSON{ID: a, Type: "extract", State: backlog.StateCompleted, Edge: "depends"}) ||
		len(show.Dependents) != 1 || show.Dependents[0] != (nodeJSON{ID: later, Type: "load", State: backlog.StateAvailable, Edge: "depends"}) {
		t.Fatalf("show --json of b: %+v", show)
	}
	c.json(&show, "show", f.String())
	if show.State != backlog.StateFailed || len(show.Dependents) != 1 ||
		show.Dependents[0] != (nodeJSON{ID: g, Type: "receipt", State: backlog.StateCancelled, Edge: "depends"}) {
		t.Fatalf("show --json of the failed job: %+v", show)
	}
	c.json(&show, "show", g.String())
	if len(show.Prerequisites) != 1 || show.Prerequisites[0] != (nodeJSON{ID: f, Type: "charge", State: backlog.StateFailed, Edge: "depends"}) {
		t.Fatalf("show --json of the cancelled job: %+v", show)
	}
	// A fan-out: a page of dependents, and how many more.
	out := c.ok("show", a.String())
	if !strings.Contains(out, "\nand 4 more\n") {
		t.Fatalf("show of a prerequisite of 104 jobs does not count the ones left out:\n%s", out)
	}
	c.json(&show, "show", a.String())
	if len(show.Dependents) != graphNeighbours || show.MoreDependents != 4 || show.MoreDependentsAtLeast {
		t.Fatalf("show --json of the fan-out: %d dependents, %d more (at least: %v)", len(show.Dependents), show.MoreDependents,
			show.MoreDependentsAtLeast)
	}
	// A deleted prerequisite is named as such.
	if err := q.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	c.json(&show, "show", b.String())
	if len(show.Prerequisites) != 1 || show.Prerequisites[0] != (nodeJSON{ID: a, Type: "extract", Edge: "depends", Deleted: true}) {
		t.Fatalf("show --json after the prerequisite was deleted: %+v", show.Prerequisites)
	}
	if out := c.ok("show", b.String()); !strings.Contains(out, "  extract  deleted  depends\n") {
		t.Fatalf("show after the prerequisite was deleted:\n%s", out)
	}
}

func workerOf(t *testing.T, q *backlog.Queue, id uuid.UUID) string {
	t.Helper()
	info, err := q.Job(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return info.Worker
}
