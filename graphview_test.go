package backlog_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

func TestGraphReadsNeighboursAndChain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a, err := e.q.Enqueue(ctx, "a", nil, backlog.OrderingKey("k"), backlog.UniqueKey("u-a"))
	require.NoError(t, err)
	b, err := e.q.Enqueue(ctx, "b", nil, backlog.DependsOn(a))
	require.NoError(t, err)
	c, err := e.q.Enqueue(ctx, "c", nil, backlog.OrderingKey("k"))
	require.NoError(t, err)

	g, err := e.q.Graph(ctx, a)
	require.NoError(t, err)
	require.Equal(t, "k", g.OrderingKey)
	require.Equal(t, "u-a", g.UniqueKey)
	require.Empty(t, g.Prerequisites)
	require.Len(t, g.Dependents, 2)
	byID := map[string]backlog.GraphNode{}
	for _, d := range g.Dependents {
		byID[d.ID.String()] = d
	}
	require.Equal(t, backlog.GraphNode{ID: b, Type: "b", State: backlog.StateBlocked}, byID[b.String()])
	require.Equal(t, backlog.GraphNode{ID: c, Type: "c", State: backlog.StateBlocked, Order: true}, byID[c.String()])
	require.Len(t, g.Chain, 2)
	require.Equal(t, a, g.Chain[0].ID)
	require.Equal(t, c, g.Chain[1].ID)

	g, err = e.q.Graph(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []backlog.GraphNode{{ID: a, Type: "a", State: backlog.StateAvailable}}, g.Prerequisites)
	require.Empty(t, g.Chain)

	_, err = e.q.Graph(ctx, backlog.NewID())
	require.True(t, errors.Is(err, backlog.ErrNotFound), "%v", err)
}

// TestGraphOfFinishedJobs: once prerequisites finish (and the finished
// jobs have moved to job_history), the graph still shows them, with their
// final states, from both sides: dependencies that completed, one that
// failed (and cancelled its dependent), and the ordering key's order.
func TestGraphOfFinishedJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	enq := func(typ string, opts ...backlog.EnqueueOption) uuid.UUID {
		t.Helper()
		id, err := e.q.Enqueue(ctx, typ, nil, opts...)
		require.NoError(t, err)
		return id
	}
	a := enq("a")
	x := enq("x") // never worked: stays available
	b := enq("b", backlog.DependsOn(a))
	c := enq("c", backlog.DependsOn(b)) // never worked: available once b completed
	d := enq("d", backlog.DependsOn(a, x))
	k1 := enq("k", backlog.OrderingKey("key"))
	k2 := enq("k", backlog.OrderingKey("key"))
	f := enq("f")
	g := enq("g", backlog.DependsOn(f))

	stop := work(t, e.q, backlog.HandlerFunc(func(_ context.Context, job *backlog.Job) error {
		if job.Type == "f" {
			return backlog.Permanent(errors.New("boom"))
		}
		return nil
	}), backlog.Types("a", "b", "k", "f"))
	defer func() { require.NoError(t, stop()) }()
	for id, st := range map[uuid.UUID]backlog.State{a: backlog.StateCompleted, b: backlog.StateCompleted,
		k1: backlog.StateCompleted, k2: backlog.StateCompleted, f: backlog.StateFailed, g: backlog.StateCancelled,
		c: backlog.StateAvailable, d: backlog.StateBlocked} {
		e.waitState(id, 20*time.Second, st)
	}
	// Every finished job has left the hot table.
	deadline := time.Now().Add(20 * time.Second)
	for e.countLive("state IN ('completed', 'failed', 'cancelled')") > 0 {
		require.True(t, time.Now().Before(deadline), "finished jobs not moved to job_history")
		<-time.After(10 * time.Millisecond)
	}

	node := func(id uuid.UUID, typ string, st backlog.State) backlog.GraphNode {
		return backlog.GraphNode{ID: id, Type: typ, State: st}
	}
	order := func(n backlog.GraphNode) backlog.GraphNode { n.Order = true; return n }
	graph := func(id uuid.UUID) *backlog.JobGraph {
		t.Helper()
		gr, err := e.q.Graph(ctx, id)
		require.NoError(t, err)
		return gr
	}
	byID := func(ns ...backlog.GraphNode) []backlog.GraphNode {
		sort.Slice(ns, func(i, j int) bool { return ns[i].ID.String() < ns[j].ID.String() })
		return ns
	}
	// A finished job: its finished prerequisite, its live dependent.
	gb := graph(b)
	require.Equal(t, []backlog.GraphNode{node(a, "a", backlog.StateCompleted)}, gb.Prerequisites)
	require.Equal(t, []backlog.GraphNode{node(c, "c", backlog.StateAvailable)}, gb.Dependents)
	// A finished prerequisite: its finished and its blocked dependents.
	require.Equal(t, byID(node(b, "b", backlog.StateCompleted), node(d, "d", backlog.StateBlocked)), graph(a).Dependents)
	// Live dependents whose prerequisites (some or all) finished.
	require.Equal(t, []backlog.GraphNode{node(b, "b", backlog.StateCompleted)}, graph(c).Prerequisites)
	require.Equal(t, byID(node(a, "a", backlog.StateCompleted), node(x, "x", backlog.StateAvailable)), graph(d).Prerequisites)
	// A failed prerequisite and the dependent it cancelled.
	require.Equal(t, []backlog.GraphNode{node(g, "g", backlog.StateCancelled)}, graph(f).Dependents)
	require.Equal(t, []backlog.GraphNode{node(f, "f", backlog.StateFailed)}, graph(g).Prerequisites)
	// The ordering key's edge, both finished.
	require.Equal(t, []backlog.GraphNode{order(node(k2, "k", backlog.StateCompleted))}, graph(k1).Dependents)
	require.Equal(t, []backlog.GraphNode{order(node(k1, "k", backlog.StateCompleted))}, graph(k2).Prerequisites)
	require.Empty(t, graph(k1).Prerequisites)
	require.Empty(t, graph(k2).Dependents)

	// A prerequisite deleted (as retention does) is still listed, as
	// deleted, with its type while its result is kept for d.
	require.NoError(t, e.q.Delete(ctx, a))
	gone := backlog.GraphNode{ID: a, Type: "a", Deleted: true}
	require.Equal(t, []backlog.GraphNode{gone}, graph(b).Prerequisites)
	require.Equal(t, byID(gone, node(x, "x", backlog.StateAvailable)), graph(d).Prerequisites)
}

// TestGraphBoundsAFanOut: a job with more dependents, or prerequisites,
// than a list holds lists MaxGraphNeighbours of them and counts the rest.
func TestGraphBoundsAFanOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	root, err := e.q.Enqueue(ctx, "root", nil)
	require.NoError(t, err)
	const n = backlog.MaxGraphNeighbours + 20
	specs := make([]backlog.JobSpec, n)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "leaf", Options: []backlog.EnqueueOption{backlog.DependsOn(root)}}
	}
	leaves, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	sink, err := e.q.Enqueue(ctx, "sink", nil, backlog.DependsOn(leaves...))
	require.NoError(t, err)
	stop := work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("root"))
	e.waitState(leaves[n-1], 20*time.Second, backlog.StateAvailable)
	require.NoError(t, stop())

	g, err := e.q.Graph(ctx, root)
	require.NoError(t, err)
	require.Len(t, g.Dependents, backlog.MaxGraphNeighbours)
	require.Equal(t, 20, g.MoreDependents)
	require.False(t, g.DependentsAtLeast)
	for _, d := range g.Dependents {
		require.Equal(t, backlog.StateAvailable, d.State)
	}
	g, err = e.q.Graph(ctx, sink)
	require.NoError(t, err)
	require.Len(t, g.Prerequisites, backlog.MaxGraphNeighbours)
	require.Equal(t, 20, g.MorePrerequisites)
	g, err = e.q.Graph(ctx, leaves[0])
	require.NoError(t, err)
	require.Equal(t, []backlog.GraphNode{{ID: root, Type: "root", State: backlog.StateCompleted}}, g.Prerequisites)
	require.Equal(t, []backlog.GraphNode{{ID: sink, Type: "sink", State: backlog.StateBlocked}}, g.Dependents)
	require.Zero(t, g.MoreDependents)
}
