package backlogui

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// progressView is a job's progress (Job.SetProgress) as the pages show
// it: a bar when a fraction can be read from it, and the rest as
// name/value pairs or a text, never as raw JSON.
type progressView struct {
	// Percent is the bar's value, 0 to 100; HasPercent says there is one.
	Percent    float64
	HasPercent bool
	// Of is "1,200 of 4,800" when the fraction came from a pair of counts.
	Of string
	// Text is a string progress, or JSON that is neither a number, a
	// string nor an object (compact).
	Text   string
	Fields []progressField // an object's other members, in name order
}

type progressField struct{ Name, Value string }

// PercentText is the bar's value as a label: "25%", "99.5%".
func (p *progressView) PercentText() string {
	return strconv.FormatFloat(math.Floor(p.Percent*10)/10, 'f', -1, 64) + "%"
}

// Progress members read as a fraction: a percentage, a ratio, or a count
// done with its total (the first pair found).
var (
	percentKeys  = []string{"percent", "pct", "percentage"}
	fractionKeys = []string{"fraction", "ratio", "progress"}
	totalKeys    = []string{"total", "of", "out_of", "count", "steps"}
	doneKeys     = []string{"done", "current", "completed", "processed", "n", "step", "count"}
)

// progressOf reads raw (nil when the job has no progress).
func progressOf(raw json.RawMessage) *progressView {
	if len(raw) == 0 {
		return nil
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return &progressView{Text: string(raw)}
	}
	p := &progressView{}
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		switch {
		case f >= 0 && f <= 1:
			p.Percent, p.HasPercent = f*100, true
		case f > 1 && f <= 100:
			p.Percent, p.HasPercent = f, true
		default:
			p.Text = x.String()
		}
	case string:
		p.Text = x
	case map[string]any:
		used := map[string]bool{}
		num := func(k string) (float64, bool) {
			n, ok := x[k].(json.Number)
			if !ok {
				return 0, false
			}
			f, err := n.Float64()
			return f, err == nil
		}
		for _, k := range percentKeys {
			if f, ok := num(k); ok && f >= 0 && f <= 100 && !p.HasPercent {
				p.Percent, p.HasPercent, used[k] = f, true, true
			}
		}
		for _, k := range fractionKeys {
			if f, ok := num(k); ok && f >= 0 && f <= 1 && !p.HasPercent {
				p.Percent, p.HasPercent, used[k] = f*100, true, true
			}
		}
		if !p.HasPercent {
			p.fromCounts(x, num, used)
		}
		names := make([]string, 0, len(x))
		for k := range x {
			if !used[k] {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		for _, k := range names {
			p.Fields = append(p.Fields, progressField{Name: k, Value: valueText(x[k])})
		}
	default:
		p.Text = compactJSON(raw)
	}
	return p
}

// fromCounts finds a count done and its total: a total member and one
// other numeric member no larger than it (the only one, or one of
// doneKeys).
func (p *progressView) fromCounts(x map[string]any, num func(string) (float64, bool), used map[string]bool) {
	for _, tk := range totalKeys {
		total, ok := num(tk)
		if !ok || total <= 0 {
			continue
		}
		var cands []string
		for k := range x {
			if f, ok := num(k); ok && k != tk && f >= 0 && f <= total {
				cands = append(cands, k)
			}
		}
		sort.Strings(cands)
		pick := ""
		if len(cands) == 1 {
			pick = cands[0]
		} else {
			for _, dk := range doneKeys {
				if dk != tk && contains(cands, dk) {
					pick = dk
					break
				}
			}
		}
		if pick == "" {
			continue
		}
		done, _ := num(pick)
		p.Percent, p.HasPercent = done/total*100, true
		p.Of = numText(x[pick]) + " of " + numText(x[tk])
		if pick != "done" && pick != "n" && pick != "current" {
			p.Of += " " + pick
		}
		used[pick], used[tk] = true, true
		return
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// numText prints a JSON number with thousands separators when whole.
func numText(v any) string {
	n, ok := v.(json.Number)
	if !ok {
		return valueText(v)
	}
	if i, err := n.Int64(); err == nil {
		return fmtInt(i)
	}
	return n.String()
}

// valueText prints a member's value: strings as they are, numbers as
// numText, anything else as compact JSON.
func valueText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return numText(x)
	case nil:
		return "null"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// compactJSON is raw without insignificant space (raw itself when it does
// not parse).
func compactJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}

// argsText is a job's args in the jobs list: compact JSON, cut to n
// characters; "" for none (null or empty).
func argsText(n int, raw json.RawMessage) string {
	s := compactJSON(raw)
	if s == "null" || s == "{}" {
		return ""
	}
	return trunc(n, s)
}

// fmtLatency prints a latency with about three significant digits:
// 0.4ms, 12ms, 1.52s, 2m 5s.
func fmtLatency(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < 10*time.Second:
		return strings.TrimSuffix(strconv.FormatFloat(d.Seconds(), 'f', 2, 64), "0") + "s"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	}
	return fmtDur(d)
}
