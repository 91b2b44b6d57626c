package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// cell holds one system's values of one metric (one per run), or why there
// is none.
type cell struct {
	vals    []float64
	status  string // "timeout", "error", …; empty when vals are valid
	flagged bool   // measured while other databases were busy
}

func (c *cell) ok() bool { return c != nil && c.status == "" && len(c.vals) > 0 }

func (c *cell) median() float64 { return median(c.vals) }

// row is one line of the table.
type row struct {
	key    string
	label  string
	format func(float64) string
	ratios bool // show the backlog ÷ River tuned and backlog ÷ floor columns
	cells  map[string]*cell
}

// results collects every measurement, in table order.
type results struct {
	rows  []*row
	byKey map[string]*row
	notes []string
}

func newResults() *results { return &results{byKey: map[string]*row{}} }

// define adds a row; rows appear in the order they are defined.
func (r *results) define(key, label string, format func(float64) string, ratios bool) {
	if r.byKey[key] != nil {
		return
	}
	rw := &row{key: key, label: label, format: format, ratios: ratios, cells: map[string]*cell{}}
	r.rows = append(r.rows, rw)
	r.byKey[key] = rw
}

func (r *results) cell(key, sys string) *cell {
	rw := r.byKey[key]
	if rw == nil {
		panic("undefined row " + key)
	}
	c := rw.cells[sys]
	if c == nil {
		c = &cell{}
		rw.cells[sys] = c
	}
	return c
}

// add records one run's value.
func (r *results) add(key, sys string, v float64) {
	c := r.cell(key, sys)
	c.vals = append(c.vals, v)
}

// fail marks a metric as failed for a system (a failed run spoils the
// median, so the whole cell shows the status).
func (r *results) fail(key, sys, status string) {
	c := r.cell(key, sys)
	if c.status == "" {
		c.status = status
	}
}

// flag marks a cell as measured while the shared server was busy.
func (r *results) flag(key, sys string) {
	if rw := r.byKey[key]; rw != nil && rw.cells[sys] != nil {
		rw.cells[sys].flagged = true
	}
}

func (r *results) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if !slices.Contains(r.notes, n) {
		r.notes = append(r.notes, n)
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile returns the p-th percentile (0-100) of sorted values, nearest
// rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Formats.

func fmtInt(v float64) string {
	neg := v < 0
	s := fmt.Sprintf("%.0f", math.Abs(v))
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtRate(v float64) string { return fmtInt(v) }

func fmtMs(v float64) string {
	switch {
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fmtDec(v float64) string {
	switch {
	case math.Abs(v) >= 100:
		return fmtInt(v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}
