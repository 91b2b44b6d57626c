package backlogui

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

func TestBuildChartBuckets(t *testing.T) {
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	c := buildChart([]backlog.Throughput{
		{At: start, Type: "a", Completed: 4},
		{At: start, Type: "b", Completed: 2, Failed: 2},
		{At: start.Add(59 * time.Minute), Type: "a", Failed: 1},
		{At: start.Add(-time.Minute), Type: "a", Completed: 100}, // before the chart
		{At: start.Add(time.Hour), Type: "a", Completed: 100},    // after it
	}, start, 60, time.Minute)
	if len(c.Bars) != 60 || c.Max != 8 || c.Completed != 6 || c.Failed != 3 {
		t.Fatalf("bars %d, max %d, completed %d, failed %d", len(c.Bars), c.Max, c.Completed, c.Failed)
	}
	b := c.Bars[0]
	if b.HC+b.HF != chartH-4 || b.YF != 4 || b.YC != chartH-b.HC {
		t.Errorf("the tallest bar: %+v", b)
	}
	if c.Bars[59].Failed != 1 || c.Bars[30].HC != 0 {
		t.Errorf("bars 59 and 30: %+v %+v", c.Bars[59], c.Bars[30])
	}
	if e := buildChart(nil, start, 24, time.Hour); !e.Empty || e.Step != "hour" {
		t.Errorf("empty day chart: %+v", e)
	}
}

func TestDrawGraphLayout(t *testing.T) {
	info := &backlog.JobInfo{ID: uuid.New(), Type: "mid", State: backlog.StateBlocked}
	var deps []backlog.GraphNode
	for range maxDrawn + 3 {
		deps = append(deps, backlog.GraphNode{ID: uuid.New(), Type: "dep", State: backlog.StateBlocked})
	}
	g := &backlog.JobGraph{Prerequisites: []backlog.GraphNode{{ID: uuid.New(), Type: "pre", State: backlog.StateRunning, Order: true}},
		Dependents: deps}
	d := drawGraph(info, g, "/base")
	if d.Empty || len(d.Nodes) != maxDrawn+2 || len(d.Edges) != maxDrawn+1 || len(d.More) != 1 || d.More[0].Text != "+3 more" {
		t.Fatalf("nodes %d, edges %d, more %+v", len(d.Nodes), len(d.Edges), d.More)
	}
	self := d.Nodes[len(d.Nodes)-1]
	if !self.Self || self.Href != "/base/jobs/"+info.ID.String() {
		t.Errorf("self node %+v", self)
	}
	if !d.Edges[0].Order || d.Edges[0].X2 != self.X || d.Edges[1].X1 != self.X+nodeW {
		t.Errorf("edges %+v %+v", d.Edges[0], d.Edges[1])
	}
	for _, n := range d.Nodes {
		if n.Y < 0 || n.Y+nodeH > d.H {
			t.Errorf("node %+v outside the drawing (height %v)", n, d.H)
		}
	}
	if e := drawGraph(info, &backlog.JobGraph{}, ""); !e.Empty {
		t.Error("a job without neighbours is not Empty")
	}
	// Counted beyond the lists; a deleted prerequisite has no link.
	g.MoreDependents, g.DependentsAtLeast, g.MorePrerequisites = 100, true, 2
	g.Prerequisites[0].Deleted = true
	d = drawGraph(info, g, "/base")
	if len(d.More) != 2 || d.More[0].Text != "+2 more" || d.More[1].Text != "+103 or more" {
		t.Errorf("more %+v", d.More)
	}
	if !d.Nodes[0].Deleted || d.Nodes[0].Href != "" {
		t.Errorf("deleted node %+v", d.Nodes[0])
	}
}
