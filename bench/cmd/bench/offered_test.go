package main

import (
	"math"
	"slices"
	"testing"
)

func TestParseRates(t *testing.T) {
	got, err := parseRates(" 5000,10000 ,40000")
	if err != nil || !slices.Equal(got, []int{5000, 10000, 40000}) {
		t.Fatalf("parseRates = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "-5", "x", "10000,5000", "5000,5000"} {
		if _, err := parseRates(bad); err == nil {
			t.Errorf("parseRates(%q): no error", bad)
		}
	}
}

func TestLsSlope(t *testing.T) {
	x := []float64{0, 0.25, 0.5, 0.75, 1}
	rising := []float64{100, 150, 200, 250, 300}
	if s := lsSlope(x, rising); math.Abs(s-200) > 1e-9 {
		t.Errorf("rising: slope %v, want 200", s)
	}
	flat := []float64{500, 10, 500, 10, 500}
	if s := lsSlope(x, flat); math.Abs(s) > 1e-9 {
		t.Errorf("oscillating: slope %v, want 0", s)
	}
	if s := lsSlope(x[:1], rising[:1]); s != 0 {
		t.Errorf("one sample: slope %v, want 0", s)
	}
}
