package backlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// MaxGraphNeighbours bounds each list of a JobGraph.
const MaxGraphNeighbours = 100

// GraphNode is a job in a JobGraph.
type GraphNode struct {
	ID    uuid.UUID
	Type  string
	State State
	// Order is true when the edge is the ordering key's chain (the job
	// follows its key's predecessor) rather than a DependsOn dependency.
	Order bool
}

// JobGraph is the graph around one job, for operators (Queue.Graph).
type JobGraph struct {
	// OrderingKey and UniqueKey are the job's keys ("" when it has none).
	OrderingKey, UniqueKey string
	// Prerequisites are the jobs it still waits for, Dependents the jobs
	// still waiting for it (at most MaxGraphNeighbours each, by ID). An
	// edge is forgotten once its prerequisite has finished, so a finished
	// job has no dependents, and a job whose prerequisites all finished
	// has no prerequisites.
	Prerequisites, Dependents []GraphNode
	// Chain is the live (blocked, scheduled, available, running) jobs of
	// its ordering key in the order they run, oldest first (at most
	// MaxGraphNeighbours); empty without an ordering key.
	Chain []GraphNode
}

// Graph returns the keys of a job, its pending prerequisites and
// dependents with their states, and the live chain of its ordering key.
// An unknown job returns ErrNotFound. It reads a handful of indexed rows
// (a finished job is found as Job finds it).
func (q *Queue) Graph(ctx context.Context, id uuid.UUID) (*JobGraph, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	n, err := q.store.Graph(ctx, id, MaxGraphNeighbours)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading the graph of job %s: %w", id, err))
	}
	conv := func(in []store.Neighbour) []GraphNode {
		out := make([]GraphNode, len(in))
		for i, nb := range in {
			out[i] = GraphNode{ID: nb.ID, Type: nb.Type, State: State(nb.State), Order: nb.Kind == "order"}
		}
		return out
	}
	return &JobGraph{OrderingKey: n.OrderingKey, UniqueKey: n.UniqueKey, Prerequisites: conv(n.Prereqs),
		Dependents: conv(n.Dependents), Chain: conv(n.Chain)}, nil
}
