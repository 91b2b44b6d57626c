package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// render returns the whole report: machine description, table, notes.
func render(cfg *config, m *machine, kinds []kind, res *results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# backlog benchmark (%s)\n\n", cfg.modeName())
	m.write(&b)
	b.WriteString("\n")
	writeTable(&b, kinds, res)
	b.WriteString("\nNotes:\n\n")
	for _, k := range kinds {
		fmt.Fprintf(&b, "- %s\n", k.note)
	}
	for _, n := range cfg.describe() {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	for _, n := range res.notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

func writeTable(b *strings.Builder, kinds []kind, res *results) {
	has := map[string]bool{}
	header := []string{"workload / metric"}
	for _, k := range kinds {
		has[k.key] = true
		header = append(header, k.label)
	}
	ratioTuned := has["backlog"] && has["river-tuned"]
	ratioFloor := has["backlog"] && has["floor"]
	if ratioTuned {
		header = append(header, "backlog ÷ River tuned")
	}
	if ratioFloor {
		header = append(header, "backlog ÷ floor")
	}
	writeRow(b, header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	writeRow(b, sep)
	for _, rw := range res.rows {
		if !rowUsed(rw, kinds) {
			continue
		}
		line := []string{rw.label}
		for _, k := range kinds {
			line = append(line, showCell(rw, rw.cells[k.key]))
		}
		if ratioTuned {
			line = append(line, ratio(rw, "river-tuned", func(r float64) string { return "×" + fmtRatio(r) }))
		}
		if ratioFloor {
			line = append(line, ratio(rw, "floor", func(r float64) string { return fmtRatio(100*r) + " %" }))
		}
		writeRow(b, line)
	}
}

func rowUsed(rw *row, kinds []kind) bool {
	for _, k := range kinds {
		if rw.cells[k.key] != nil {
			return true
		}
	}
	return false
}

func showCell(rw *row, c *cell) string {
	s := cellText(rw, c)
	if c != nil && c.flagged {
		s += " *"
	}
	return s
}

func cellText(rw *row, c *cell) string {
	switch {
	case c == nil:
		return "–"
	case c.status != "":
		return c.status
	case len(c.vals) == 0:
		return "–"
	case len(c.vals) == 1:
		return rw.format(c.vals[0])
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range c.vals {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	return fmt.Sprintf("%s (%s–%s)", rw.format(c.median()), rw.format(lo), rw.format(hi))
}

func ratio(rw *row, other string, f func(float64) string) string {
	a, o := rw.cells["backlog"], rw.cells[other]
	if !rw.ratios || !a.ok() || !o.ok() || o.median() == 0 {
		return "–"
	}
	return f(a.median() / o.median())
}

// fmtRatio shows two decimals, or two significant digits for small ratios.
func fmtRatio(r float64) string {
	if r != 0 && math.Abs(r) < 0.1 {
		return strconv.FormatFloat(r, 'g', 2, 64)
	}
	if math.Abs(r) >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

func writeRow(b *strings.Builder, cols []string) {
	b.WriteString("| ")
	b.WriteString(strings.Join(cols, " | "))
	b.WriteString(" |\n")
}
