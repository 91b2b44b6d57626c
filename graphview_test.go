package backlog_test

import (
	"context"
	"errors"
	"testing"

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
