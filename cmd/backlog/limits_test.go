package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog"
)

// TestLimits: limit set, limits and limit remove, as tables (golden) and
// JSON, and as the library sees them.
func TestLimits(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	golden(t, c.ok("limits"), "TYPE  CONCURRENCY  KEY CONCURRENCY  RATE  BURST  RATE PER KEY  UPDATED\n")

	golden(t, c.ok("limit", "set", "export", "--concurrency", "10", "--key-concurrency", "2"), `
TYPE    CONCURRENCY  KEY CONCURRENCY  RATE  BURST  RATE PER KEY  UPDATED
export  10           2                -     -      -             YYYY-MM-DDTHH:MM:SSZ
`)
	// The burst defaults to the starts of 100ms.
	golden(t, c.ok("limit", "set", "charge", "--rate", "100/1s"), `
TYPE    CONCURRENCY  KEY CONCURRENCY  RATE    BURST  RATE PER KEY  UPDATED
charge  -            -                100/1s  10     no            YYYY-MM-DDTHH:MM:SSZ
`)
	var set limitJSON
	c.json(&set, "limit", "set", "payout", "--rate", "5/1m", "--per-key", "--burst", "3", "--concurrency", "8")
	if set.Type != "payout" || set.Rate != 5 || set.PerSeconds != 60 || set.Burst != 3 || !set.RatePerKey ||
		set.Concurrency != 8 || set.KeyConcurrency != 0 || set.UpdatedAt.IsZero() {
		t.Fatalf("limit set --json: %+v", set)
	}
	c.ok("limit", "set", "digest", "--rate", "1/90m")
	golden(t, c.ok("limits"), `
TYPE    CONCURRENCY  KEY CONCURRENCY  RATE     BURST  RATE PER KEY  UPDATED
charge  -            -                100/1s   10     no            YYYY-MM-DDTHH:MM:SSZ
digest  -            -                1/1h30m  1      no            YYYY-MM-DDTHH:MM:SSZ
export  10           2                -        -      -             YYYY-MM-DDTHH:MM:SSZ
payout  8            -                5/1m     3      yes           YYYY-MM-DDTHH:MM:SSZ
`)

	// What the CLI set is what the library reads, and --json says the same.
	var listed []limitJSON
	c.json(&listed, "limits")
	lib, err := c.queue().Limits(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 4 || len(lib) != 4 {
		t.Fatalf("limits --json %+v, library %+v", listed, lib)
	}
	for i, l := range lib {
		want := limitView(l)
		if !listed[i].UpdatedAt.Equal(want.UpdatedAt) {
			t.Fatalf("limits --json[%d] updated at %s, library %s", i, listed[i].UpdatedAt, want.UpdatedAt)
		}
		listed[i].UpdatedAt = want.UpdatedAt
		if listed[i] != want {
			t.Fatalf("limits --json[%d] = %+v, library %+v", i, listed[i], want)
		}
	}
	if want := (backlog.Limit{Rate: 1, Per: 90 * time.Minute, Burst: 1}); lib[1].Type != "digest" || lib[1].Limit != want {
		t.Fatalf("digest: %+v", lib[1])
	}

	// Setting replaces every limit of the type: the rate is gone.
	c.json(&set, "limit", "set", "payout", "--key-concurrency", "1")
	if set.Rate != 0 || set.PerSeconds != 0 || set.Burst != 0 || set.RatePerKey || set.Concurrency != 0 || set.KeyConcurrency != 1 {
		t.Fatalf("limit set replacing: %+v", set)
	}

	golden(t, c.ok("limit", "remove", "export"), "removed the limits of export\n")
	var removed map[string]string
	c.json(&removed, "limit", "remove", "never-limited")
	if removed["removed"] != "never-limited" {
		t.Fatalf("limit remove --json: %v", removed)
	}
	c.json(&listed, "limits")
	if len(listed) != 3 || listed[0].Type != "charge" || listed[1].Type != "digest" || listed[2].Type != "payout" {
		t.Fatalf("limits after remove: %+v", listed)
	}
}

// TestLimitsBadUsage: bad limits and flags exit 2 with one line naming
// the problem, and set nothing.
func TestLimitsBadUsage(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"limit"}, "limit: give a subcommand: set or remove"},
		{[]string{"limit", "nope"}, `unknown command "nope"`},
		{[]string{"limits", "t"}, `unknown command "t"`},
		{[]string{"limit", "set"}, "accepts 1 arg(s)"},
		{[]string{"limit", "set", "t"}, "give --concurrency, --key-concurrency or --rate"},
		{[]string{"limit", "set", "t", "--concurrency", "many"}, `invalid argument "many" for "--concurrency"`},
		{[]string{"limit", "set", "t", "--concurrency", "-1"}, "invalid concurrency: "},
		{[]string{"limit", "set", "t", "--key-concurrency", "2000000000"}, "invalid key concurrency: "},
		{[]string{"limit", "set", "t", "--concurrency", "2", "--key-concurrency", "3"}, "invalid key concurrency: 3 is more than"},
		{[]string{"limit", "set", "t", "--rate", "10"}, `--rate "10": want N/DURATION`},
		{[]string{"limit", "set", "t", "--rate", ""}, `--rate "": want N/DURATION`},
		{[]string{"limit", "set", "t", "--rate", "ten/1s"}, `--rate "ten/1s": want N/DURATION`},
		{[]string{"limit", "set", "t", "--rate", "10/soon"}, `--rate "10/soon": want N/DURATION`},
		{[]string{"limit", "set", "t", "--rate", "0/1s"}, `--rate "0/1s": N must be at least 1`},
		{[]string{"limit", "set", "t", "--rate", "2000000000/1s"}, "invalid rate: "},
		{[]string{"limit", "set", "t", "--rate", "5/0s"}, "--rate 5/0s: invalid per: "},
		{[]string{"limit", "set", "t", "--rate", "5/1500us"}, "whole milliseconds"},
		{[]string{"limit", "set", "t", "--rate", "5/1s", "--burst", "9"}, "invalid burst: 9 is more than the rate (5)"},
		{[]string{"limit", "set", "t", "--concurrency", "1", "--burst", "2"}, "--burst and --per-key need --rate"},
		{[]string{"limit", "set", "t", "--concurrency", "1", "--per-key"}, "--burst and --per-key need --rate"},
		{[]string{"limit", "set", "", "--concurrency", "1"}, "invalid type"},
		{[]string{"limit", "remove"}, "accepts 1 arg(s)"},
		{[]string{"limit", "remove", ""}, "invalid type"},
		{[]string{"enqueue", "t", "--concurrency-key", strings.Repeat("k", 256)}, "invalid concurrency key"}, // keys are at most 255 bytes,
	} {
		out, errs, code := c.run(tc.args...)
		c.checkFail(tc.args, out, errs, code, 2, tc.want)
		if strings.Count(errs, "\n") != 1 {
			t.Fatalf("backlog %v: want one line on stderr, got:\n%s", tc.args, errs)
		}
	}
	var listed []limitJSON
	c.json(&listed, "limits")
	if len(listed) != 0 {
		t.Fatalf("bad usage set limits: %+v", listed)
	}
}

// TestEnqueueConcurrencyKey: enqueue --concurrency-key stores the key;
// show and list show it, and list filters by it.
func TestEnqueueConcurrencyKey(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	keyed := strings.TrimSpace(c.ok("enqueue", "export", `{}`, "--concurrency-key", "customer:42"))
	plain := strings.TrimSpace(c.ok("enqueue", "export"))
	for id, want := range map[string]*string{keyed: ptr("customer:42"), plain: nil} {
		var got *string
		err := pool.QueryRow(context.Background(), `SELECT concurrency_key FROM `+pgx.Identifier{c.schema, "jobs"}.Sanitize()+
			` WHERE id = $1`, id).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Fatalf("job %s: concurrency key %v, want %v", id, deref(got), deref(want))
		}
	}
	// show and list --concurrency-key see it.
	if out := c.ok("show", keyed); !strings.Contains(out, "Concurrency key:") || !strings.Contains(out, "customer:42") {
		t.Fatalf("show does not show the concurrency key:\n%s", out)
	}
	var listed struct {
		Jobs []struct {
			ID             string `json:"id"`
			ConcurrencyKey string `json:"concurrency_key"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(c.ok("list", "--concurrency-key", "customer:42", "--json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Jobs) != 1 || listed.Jobs[0].ID != keyed || listed.Jobs[0].ConcurrencyKey != "customer:42" {
		t.Fatalf("list --concurrency-key: %+v", listed.Jobs)
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

// TestRateText: a rate prints as --rate reads it.
func TestRateText(t *testing.T) {
	for _, tc := range []struct {
		n    int
		per  time.Duration
		want string
	}{
		{100, time.Second, "100/1s"},
		{5, time.Minute, "5/1m"},
		{1, 90 * time.Minute, "1/1h30m"},
		{2, 24 * time.Hour, "2/24h"},
		{3, 2*time.Hour + 30*time.Second, "3/2h0m30s"},
		{7, 1500 * time.Millisecond, "7/1.5s"},
		{9, 250 * time.Millisecond, "9/250ms"},
	} {
		got := rateText(tc.n, tc.per)
		if got != tc.want {
			t.Errorf("rateText(%d, %s) = %q, want %q", tc.n, tc.per, got, tc.want)
		}
		n, per, err := parseRate(got)
		if err != nil || n != tc.n || per != tc.per {
			t.Errorf("parseRate(%q) = %d, %s, %v", got, n, per, err)
		}
	}
	if n, per, err := parseRate("10/s"); err != nil || n != 10 || per != time.Second {
		t.Errorf("parseRate(10/s) = %d, %s, %v", n, per, err)
	}
}
