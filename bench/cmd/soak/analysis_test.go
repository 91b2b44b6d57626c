package main

import (
	"encoding/csv"
	"strings"
	"testing"
	"time"
)

// series builds 10-s samples with the given completed/s and depths.
func series(rates []float64, depths []int64) []sample {
	var ss []sample
	for i, r := range rates {
		s := sample{mark: time.Duration(i+1) * 10 * time.Second, span: 10 * time.Second, completed: int64(r * 10), enqueued: 50_000}
		s.at = s.mark
		if depths != nil {
			s.db.available = depths[i]
		}
		ss = append(ss, s)
	}
	return ss
}

func TestCheckFlat(t *testing.T) {
	// 2 minutes, 30-s windows: first 5000/s, last 4400/s (-12 %).
	ss := series([]float64{5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 4400, 4400, 4400}, nil)
	c := checkFlat(ss, 30*time.Second, 2*time.Minute)
	if !c.ok || c.pass || c.first != 5000 || c.last != 4400 {
		t.Fatalf("got %+v", c)
	}
	c = checkFlat(ss[:11], 30*time.Second, 2*time.Minute) // interrupted
	if c.ok {
		t.Fatalf("an interrupted phase got a verdict: %+v", c)
	}
	ss[10].completed, ss[11].completed = 48_000, 52_000
	if c := checkFlat(ss, 30*time.Second, 2*time.Minute); !c.pass {
		t.Fatalf("4,933/s vs 5,000/s should pass: %+v", c)
	}
}

func TestAnalyzeHold(t *testing.T) {
	// Hold from 0:30 to 1:00 of 2:00; throughput falls to 2000/s, catches
	// up at 8000/s for two windows, then is flat.
	rates := []float64{5000, 5000, 5000, 3000, 2000, 2500, 8000, 8000, 5000, 5000, 5000, 5000}
	depth := []int64{50, 60, 40, 20_000, 50_000, 70_000, 40_000, 10_000, 100, 50, 50, 50}
	h := analyzeHold(series(rates, depth), 30*time.Second, 30*time.Second, 30*time.Second, 2*time.Minute, 5000)
	if !h.ok || h.pre != 5000 || h.minRate != 2000 || h.minMark != 50*time.Second || !h.fell {
		t.Fatalf("got %+v", h)
	}
	if h.floorBack != 10*time.Second { // the 1:10 window starts a run of three ≥ 4500
		t.Fatalf("floorBack = %s", h.floorBack)
	}
	if h.bandBack != 30*time.Second { // 1:30: the catch-up is over
		t.Fatalf("bandBack = %s", h.bandBack)
	}
	if h.depthLimit != 5060 || h.depthBack != 30*time.Second {
		t.Fatalf("depth limit %d, back after %s", h.depthLimit, h.depthBack)
	}
	if h.during != (3000+2000+2500)/3.0 {
		t.Fatalf("during = %f", h.during)
	}
}

func TestBackAfterNever(t *testing.T) {
	ss := series([]float64{1000, 1000}, nil)
	if got := backAfter(ss, 0, func(s sample) bool { return s.rate() > 2000 }); got != -1 {
		t.Fatalf("got %s", got)
	}
}

func TestEnqueuedAt(t *testing.T) {
	for _, in := range []string{`{"t":1764027000123456789}`, `{"t": 1764027000123456789}`} {
		if got, ok := enqueuedAt([]byte(in)); !ok || got != 1764027000123456789 {
			t.Fatalf("%s: %d %v", in, got, ok)
		}
	}
	if _, ok := enqueuedAt([]byte(`{}`)); ok {
		t.Fatal("no number parsed as one")
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil || c.duration != 30*time.Minute || c.holdAt != 12*time.Minute || c.holdFor != 5*time.Minute || c.rate != 5000 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = parseFlags([]string{"-quick", "-phases", "hold"})
	if err != nil || c.duration != 5*time.Minute || c.holdAt != time.Minute || len(c.phases) != 1 {
		t.Fatalf("quick: %+v %v", c, err)
	}
	if c, err = parseFlags([]string{"-hold", "2m+90s", "-duration", "10m"}); err != nil || c.holdAt != 2*time.Minute || c.holdFor != 90*time.Second {
		t.Fatalf("-hold: %+v %v", c, err)
	}
	for _, bad := range [][]string{{"-hold", "5m"}, {"-hold", "25m+10m"}, {"-autovacuum", "maybe"}, {"-every", "7s"}, {"-window", "20m"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestSamplesCSV(t *testing.T) {
	s := series([]float64{5000}, nil)[0]
	s.db.longestQuery = "SELECT * FROM \"x\".\"claim\"($1::text[],\n $2)"
	s.db.idx = []int64{8192, 16384}
	r := &phaseResult{indexNames: []string{"a_idx", "b_idx"}, samples: []sample{s}}
	recs, err := csv.NewReader(strings.NewReader(samplesCSV(r))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || len(recs[0]) != len(recs[1]) {
		t.Fatalf("got %d records: %q", len(recs), recs)
	}
	for i, h := range recs[0] {
		switch h {
		case "longest_stmt":
			if recs[1][i] != s.db.longestQuery {
				t.Errorf("longest_stmt = %q", recs[1][i])
			}
		case "b_idx_bytes":
			if recs[1][i] != "16384" {
				t.Errorf("b_idx_bytes = %q", recs[1][i])
			}
		}
	}
}
