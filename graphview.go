package backlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// maxGraphNeighbours bounds each list of a JobGraph (its fields' docs
// state the number).
const maxGraphNeighbours = 100

// maxGraphCount bounds the counting of a job's dependents beyond the
// maxGraphNeighbours listed (JobGraph.MoreDependents): each place a
// dependent is found (pending edges, finished dependents, dependents it
// cancelled) is counted up to this many.
const maxGraphCount = 10_000

// GraphNode is a job in a JobGraph.
type GraphNode struct {
	ID   uuid.UUID
	Type string // "" when Deleted and its type was not kept
	// State is the job's state now: a live one, or the final one of a
	// finished job (completed, failed, cancelled); "" when Deleted.
	State State
	// Order is true when the edge is the ordering key's chain (the job
	// follows its key's predecessor) rather than a DependsOn dependency.
	Order bool
	// Deleted: the job is known only by its ID, which its neighbour
	// recorded; its row is gone (retention, or Delete).
	Deleted bool
}

// JobGraph is the graph around one job, for operators (Queue.Graph).
type JobGraph struct {
	// OrderingKey and UniqueKey are the job's keys ("" when it has none).
	OrderingKey, UniqueKey string
	// Prerequisites are the jobs it depends on (DependsOn) and the job
	// before it in its ordering key; Dependents the jobs that depend on it
	// and the job after it in its key. Pending and finished alike, each
	// with its state, by ID, at most 100 of each.
	//
	// What is known of an edge once its prerequisite has ended: a
	// dependency that completed (recorded by the dependent); the
	// dependency that failed or was cancelled and so cancelled the
	// dependent (named by its reason; the dependent's other prerequisites
	// are not recorded once it is cancelled); and the order of an
	// ordering key, read as the jobs next to each other in the key among
	// those kept. A prerequisite whose row retention or Delete removed is
	// listed Deleted; a removed dependent or key neighbour is not listed.
	Prerequisites, Dependents []GraphNode
	// MorePrerequisites and MoreDependents count the neighbours the lists
	// leave out. When DependentsAtLeast, counting stopped at 10,000
	// and MoreDependents is a lower bound.
	MorePrerequisites, MoreDependents int
	DependentsAtLeast                 bool
	// Chain is the live (blocked, scheduled, available, running) jobs of
	// its ordering key in the order they run, oldest first (at most
	// 100); empty without an ordering key.
	Chain []GraphNode
}

// Graph returns the keys of a job, its prerequisites and dependents
// (pending or finished) with their states, and the live chain of its
// ordering key. A finished job's graph is kept as long as the jobs are.
// An unknown job returns ErrNotFound. It reads indexed rows only: a few
// per neighbour listed, plus the counting of a large fan-out (bounded by
// 10,000 a place), whatever the number of finished jobs kept.
func (q *Queue) Graph(ctx context.Context, id uuid.UUID) (*JobGraph, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	n, err := q.readsFor(ctx).Graph(ctx, id, maxGraphNeighbours, maxGraphCount)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading the graph of job %s: %w", id, err))
	}
	conv := func(in []store.Neighbour) []GraphNode {
		out := make([]GraphNode, len(in))
		for i, nb := range in {
			out[i] = GraphNode{ID: nb.ID, Type: nb.Type, State: State(nb.State), Order: nb.Kind == "order", Deleted: nb.Deleted}
		}
		return out
	}
	return &JobGraph{OrderingKey: n.OrderingKey, UniqueKey: n.UniqueKey, Prerequisites: conv(n.Prereqs),
		Dependents: conv(n.Dependents), MorePrerequisites: n.MorePrereqs, MoreDependents: n.MoreDependents,
		DependentsAtLeast: n.DependentsCapped, Chain: conv(n.Chain)}, nil
}
