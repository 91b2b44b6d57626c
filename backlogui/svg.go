package backlogui

import (
	"fmt"
	"time"

	"github.com/backlogq/backlog"
)

// The overview's throughput chart and the job page's dependency graph are
// SVG drawn here, as numbers for the templates (no style attributes: the
// CSP forbids them; classes carry the colours).

type bar struct {
	X, W              float64
	YC, HC, YF, HF    float64 // completed and failed parts (y from the top)
	At                time.Time
	Completed, Failed int64
	Cancelled         int64
}

type chart struct {
	W, H      float64
	Bars      []bar
	Max       int64
	Start     time.Time
	End       time.Time
	Step      string
	Completed int64
	Failed    int64
	Empty     bool
}

const chartW, chartH = 720.0, 160.0

// buildChart buckets the throughput (all types together) into n slots of
// step from start.
func buildChart(ts []backlog.Throughput, start time.Time, n int, step time.Duration) *chart {
	c := &chart{W: chartW, H: chartH, Start: start, End: start.Add(time.Duration(n) * step), Step: "minute"}
	if step >= time.Hour {
		c.Step = "hour"
	}
	bars := make([]bar, n)
	for i := range bars {
		bars[i].At = start.Add(time.Duration(i) * step)
	}
	for _, p := range ts {
		i := int(p.At.Sub(start) / step)
		if i < 0 || i >= n {
			continue
		}
		bars[i].Completed += p.Completed
		bars[i].Failed += p.Failed
		bars[i].Cancelled += p.Cancelled
	}
	for _, b := range bars {
		c.Max = max(c.Max, b.Completed+b.Failed)
		c.Completed += b.Completed
		c.Failed += b.Failed
	}
	c.Empty = c.Max == 0
	scale := 0.0
	if c.Max > 0 {
		scale = (chartH - 4) / float64(c.Max)
	}
	w := chartW / float64(n)
	for i := range bars {
		b := &bars[i]
		b.X, b.W = float64(i)*w+0.5, max(w-1, 1)
		b.HC = float64(b.Completed) * scale
		b.HF = float64(b.Failed) * scale
		b.YC = chartH - b.HC
		b.YF = b.YC - b.HF
	}
	c.Bars = bars
	return c
}

type gnode struct {
	X, Y    float64
	Href    string
	Type    string
	State   backlog.State
	ID      string
	Self    bool
	Deleted bool // known by its ID only: no page to link to
}

type gedge struct {
	X1, Y1, X2, Y2 float64
	Order          bool
}

type graphDrawing struct {
	W, H  float64
	Nodes []gnode
	Edges []gedge
	More  []gmore
	Empty bool
	NodeW float64
	NodeH float64
}

type gmore struct {
	X, Y float64
	Text string
}

const (
	nodeW, nodeH   = 200.0, 44.0
	colGap, rowGap = 80.0, 14.0
	maxDrawn       = 12
)

// drawGraph lays the job out in three columns: its prerequisites, itself,
// its dependents; edges run left to right (dashed: ordering-key edges).
// Finished neighbours are drawn like live ones, in their final state; a
// column with more than maxDrawn ends with how many more there are (those
// drawn, and those the graph only counted).
func drawGraph(info *backlog.JobInfo, g *backlog.JobGraph, base string) *graphDrawing {
	d := &graphDrawing{NodeW: nodeW, NodeH: nodeH, Empty: len(g.Prerequisites) == 0 && len(g.Dependents) == 0}
	rows := max(min(len(g.Prerequisites), maxDrawn), min(len(g.Dependents), maxDrawn), 1)
	d.W = 3*nodeW + 2*colGap
	d.H = float64(rows)*(nodeH+rowGap) + rowGap + 20
	col := func(i int) float64 { return float64(i) * (nodeW + colGap) }
	rowY := func(i, n int) float64 {
		total := float64(n)*(nodeH+rowGap) - rowGap
		return (d.H-20-total)/2 + float64(i)*(nodeH+rowGap)
	}
	self := gnode{X: col(1), Y: rowY(0, 1), Href: base + "/jobs/" + info.ID.String(), Type: info.Type, State: info.State,
		ID: shortID(info.ID.String()), Self: true}
	place := func(ns []backlog.GraphNode, more int, atLeast bool, c int, left bool) {
		shown := min(len(ns), maxDrawn)
		for i, n := range ns[:shown] {
			gn := gnode{X: col(c), Y: rowY(i, shown), Href: base + "/jobs/" + n.ID.String(), Type: n.Type, State: n.State,
				ID: shortID(n.ID.String()), Deleted: n.Deleted}
			if n.Deleted {
				gn.Href = ""
			}
			d.Nodes = append(d.Nodes, gn)
			e := gedge{Order: n.Order}
			if left {
				e.X1, e.Y1, e.X2, e.Y2 = gn.X+nodeW, gn.Y+nodeH/2, self.X, self.Y+nodeH/2
			} else {
				e.X1, e.Y1, e.X2, e.Y2 = self.X+nodeW, self.Y+nodeH/2, gn.X, gn.Y+nodeH/2
			}
			d.Edges = append(d.Edges, e)
		}
		if n := len(ns) - shown + more; n > 0 {
			text := fmt.Sprintf("+%d more", n)
			if atLeast {
				text = fmt.Sprintf("+%d or more", n)
			}
			d.More = append(d.More, gmore{X: col(c), Y: d.H - 6, Text: text})
		}
	}
	place(g.Prerequisites, g.MorePrerequisites, false, 0, true)
	place(g.Dependents, g.MoreDependents, g.DependentsAtLeast, 2, false)
	d.Nodes = append(d.Nodes, self)
	return d
}

func shortID(s string) string { return s[len(s)-12:] }
