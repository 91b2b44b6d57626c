package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// timeLayout is how tables print times: UTC, to the second.
const timeLayout = "2006-01-02T15:04:05Z"

// table writes aligned columns.
type table struct{ w *tabwriter.Writer }

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)}
	t.row(toAny(header)...)
	return t
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// row writes one row; each cell is printed with cell.
func (t *table) row(cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = cell(c)
	}
	fmt.Fprintln(t.w, strings.Join(s, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

// cell formats a value for a table: times in UTC, "-" for nothing.
func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		if x == "" {
			return "-"
		}
		return clean(x)
	case time.Time:
		if x.IsZero() {
			return "-"
		}
		return x.UTC().Format(timeLayout)
	case *time.Time:
		if x == nil {
			return "-"
		}
		return cell(*x)
	case time.Duration:
		return x.String()
	default:
		return fmt.Sprint(v)
	}
}

// clean keeps a table cell on one line.
func clean(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// truncate shortens s to n runes.
func truncate(s string, n int) string {
	r := []rune(clean(s))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n-1]) + "…"
}

// writeJSON prints v as indented JSON.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// prettyJSON indents a JSON document for show.
func prettyJSON(raw []byte) string {
	if len(raw) == 0 {
		return "-"
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, _ := json.MarshalIndent(v, "", "  ") // decoded JSON: cannot fail
	return string(b)
}

// seconds is a duration in seconds, for JSON.
func seconds(d time.Duration) float64 { return d.Seconds() }

// timePtr is nil for the zero time, for JSON.
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
