package main

import (
	"slices"
	"testing"
)

func TestHistoryIsOptIn(t *testing.T) {
	for _, args := range [][]string{nil, {"-quick"}} {
		c, err := parseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(c.workloads, "history") {
			t.Errorf("%v: history runs by default (%v)", args, c.workloads)
		}
	}
	c, err := parseFlags([]string{"-workloads", "history", "-history-rows", "1000"})
	if err != nil || !slices.Equal(c.workloads, []string{"history"}) || c.historyRows != 1000 || !c.historyVacuum {
		t.Fatalf("-workloads history: %+v, %v", c, err)
	}
	if _, err := parseFlags([]string{"-history-rows", "0"}); err == nil {
		t.Error("-history-rows 0: no error")
	}
}
