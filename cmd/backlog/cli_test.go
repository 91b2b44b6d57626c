package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// TestBadUsage: unknown commands and flags, bad arguments and input the
// library rejects exit 2 with one line naming the problem.
func TestBadUsage(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"list", "--frob"}, "unknown flag: --frob"},
		{[]string{"list", "--limit", "many"}, `invalid argument "many" for "--limit"`},
		{[]string{"list", "--limit", "100000"}, "invalid limit"},
		{[]string{"list", "--state", "nope"}, `--state "nope": want one of blocked, scheduled, available, running, completed, failed, cancelled`},
		{[]string{"retry", "--state", "failed,Nope", "--dry-run"}, `--state "Nope": want one of blocked, scheduled, available,`},
		{[]string{"list", "--created-after", "yesterday"}, "--created-after"},
		{[]string{"list", "--tag", "novalue"}, "want key=value"},
		{[]string{"list", "--cursor", "garbage"}, "invalid cursor"},
		{[]string{"show"}, "accepts 1 arg(s)"},
		{[]string{"show", "not-an-id"}, `"not-an-id" is not a job ID`},
		{[]string{"enqueue", "t", "{not json"}, "not valid JSON"},
		{[]string{"enqueue", "", "{}"}, "invalid type"},
		{[]string{"enqueue", "t", "--max-attempts", "0"}, "invalid max attempts"},
		{[]string{"enqueue", "t", "--run-at", "soon"}, "--run-at"},
		{[]string{"retry"}, "give job IDs, filter flags"},
		{[]string{"retry", "--state", "running", "--yes"}, "cannot retry running jobs"},
		{[]string{"cancel", uuid.NewString(), "--type", "t"}, "not both"},
		{[]string{"pause"}, "requires at least 1 arg(s)"},
		{[]string{"migrate", "down", "x"}, "N must be a positive number"},
		{[]string{"migrate", "sql", "--format", "flyway"}, "--format must be golang-migrate or goose"},
		{[]string{"migrate", "nope"}, `unknown command "nope"`},
	} {
		out, errs, code := c.run(tc.args...)
		c.checkFail(tc.args, out, errs, code, 2, tc.want)
		if strings.Count(errs, "\n") != 1 {
			t.Fatalf("backlog %v: want one line on stderr, got:\n%s", tc.args, errs)
		}
	}
	// No database at all.
	out, errs, code := c.runEnv(nil, "stats")
	c.checkFail([]string{"stats"}, out, errs, code, 2, "set DATABASE_URL or pass --database-url")
}

// TestDatabaseDown: an unreachable server is one sentence naming it, and
// the password never shows.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, args := range [][]string{
		{"--database-url", "postgres://someone:s3cr3tpw@127.0.0.1:1/db", "stats"},
		{"--database-url", "postgres://someone:s3cr3tpw@127.0.0.1:1/db", "migrate", "up"},
	} {
		out, errs, code := c.runEnv(nil, args...)
		c.checkFail(args, out, errs, code, 1, "cannot reach PostgreSQL at 127.0.0.1:1: ")
		if strings.Contains(errs+out, "s3cr3tpw") {
			t.Fatalf("the password shows: %s", errs)
		}
		if strings.Count(errs, "\n") != 1 {
			t.Fatalf("want one line on stderr, got:\n%s", errs)
		}
	}
	// A malformed URL is bad usage, and hides its password too.
	args := []string{"--database-url", "postgres://someone:s3cr3tpw@127.0.0.1:notaport/db", "stats"}
	out, errs, code := c.runEnv(nil, args...)
	c.checkFail(args, out, errs, code, 2, "bad database URL")
	if strings.Contains(errs, "s3cr3tpw") {
		t.Fatalf("the password shows: %s", errs)
	}
}

// TestUnmigratedSchema: every command but migrate says to migrate.
func TestUnmigratedSchema(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, args := range [][]string{{"stats"}, {"list"}, {"paused"}, {"enqueue", "t"}, {"retry", "--all", "--dry-run"},
		{"limits"}, {"limit", "set", "t", "--concurrency", "1"}, {"limit", "remove", "t"}} {
		c.fail(1, "schema "+c.schema+" is not migrated; run `backlog --schema "+c.schema+" migrate up`", args...)
	}
	// The default schema needs no --schema.
	a := &app{schema: backlog.DefaultSchema}
	if got := a.migrateHint(); got != "backlog migrate up" {
		t.Fatalf("the default schema's hint is %q", got)
	}
}

// TestMigrate: status, up, down (which needs --yes), all the way down and
// up again to a working queue.
func TestMigrate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	type status struct {
		Version    int64 `json:"version"`
		Pending    int   `json:"pending"`
		Migrations []struct {
			Version int64  `json:"version"`
			Name    string `json:"name"`
			Applied bool   `json:"applied"`
		} `json:"migrations"`
	}
	var st status
	c.json(&st, "migrate", "status")
	n := len(st.Migrations)
	if st.Version != 0 || st.Pending != n || n == 0 {
		t.Fatalf("fresh schema: %+v", st)
	}
	newest := st.Migrations[n-1]
	if !strings.Contains(c.ok("migrate", "status"), "version 0, ") {
		t.Fatal("status does not show version 0")
	}

	out := c.ok("migrate", "up")
	if !strings.Contains(out, "applied 0001_init") {
		t.Fatalf("migrate up: %s", out)
	}
	if out := c.ok("migrate", "up"); !strings.Contains(out, "up to date") {
		t.Fatalf("migrate up again: %s", out)
	}
	c.json(&st, "migrate", "status")
	if st.Version != newest.Version || st.Pending != 0 {
		t.Fatalf("after up: %+v", st)
	}

	// Down needs --yes; without it, it lists and changes nothing.
	out = c.fail(2, "add --yes", "migrate", "down")
	if !strings.Contains(out, newest.Name) {
		t.Fatalf("down without --yes does not name %s: %s", newest.Name, out)
	}
	c.json(&st, "migrate", "status")
	if st.Version != newest.Version {
		t.Fatalf("down without --yes changed the version: %+v", st)
	}
	c.ok("migrate", "down", "--yes")
	c.json(&st, "migrate", "status")
	if st.Pending != 1 || st.Version != st.Migrations[n-2].Version || st.Migrations[n-1].Applied {
		t.Fatalf("after down 1: %+v", st)
	}
	c.fail(1, "run `backlog --schema "+c.schema+" migrate up`", "stats")

	c.ok("migrate", "up")
	c.ok("enqueue", "t", `{"n":1}`)
	var down struct {
		Version  int64    `json:"version"`
		Reverted []string `json:"reverted"`
	}
	c.json(&down, "migrate", "down", "all", "--yes")
	if down.Version != 0 || len(down.Reverted) != n || !strings.HasSuffix(down.Reverted[n-1], "_init") {
		t.Fatalf("down all: %+v", down)
	}
	c.ok("migrate", "up")
	id := strings.TrimSpace(c.ok("enqueue", "t", `{"n":2}`))
	var job jobJSON
	c.json(&job, "show", id)
	if job.State != backlog.StateAvailable || compact(t, job.Args) != `{"n":2}` {
		t.Fatalf("job after down and up: %+v", job)
	}
}

// TestTables: the default output, golden (IDs and times normalized).
func TestTables(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	c.ok("enqueue", "email", `{"to":"ann@example.com","n":1}`, "--tag", "team=ops", "--tag", "env=prod", "--priority", "3")
	c.ok("enqueue", "sms", "--run-at", "+1h", "--unique-key", "u1", "--max-attempts", "5")
	c.stdin = `{"from":"stdin"}`
	id := strings.TrimSpace(c.ok("enqueue", "email", "-", "--ordering-key", "k1", "--timeout", "90s"))
	c.stdin = ""

	golden(t, c.ok("list"), `
ID                                    TYPE   STATE      ATTEMPT  CREATED               FINISHED  TAGS               LAST ERROR
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  email  available  0/25     YYYY-MM-DDTHH:MM:SSZ  -         -                  -
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  sms    scheduled  0/5      YYYY-MM-DDTHH:MM:SSZ  -         -                  -
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  email  available  0/25     YYYY-MM-DDTHH:MM:SSZ  -         env=prod,team=ops  -
`)
	golden(t, c.ok("list", "--limit", "1", "--oldest-first", "--type", "email"), `
ID                                    TYPE   STATE      ATTEMPT  CREATED               FINISHED  TAGS               LAST ERROR
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  email  available  0/25     YYYY-MM-DDTHH:MM:SSZ  -         env=prod,team=ops  -
`+"next cursor: "+cursorOf(t, c, "--limit", "1", "--oldest-first", "--type", "email")+"\n")
	golden(t, c.ok("show", id), `
ID:            xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
Type:          email
State:         available
Priority:      0
Attempt:       0 of 25
Timeout:       1m30s
Tags:          -
Worker:        -
Created:       YYYY-MM-DDTHH:MM:SSZ
Run at:        YYYY-MM-DDTHH:MM:SSZ
Started:       -
Finished:      -
Last error:    -
Ordering key:  k1

Args:
  {
    "from": "stdin"
  }
`)
	c.ok("pause", "sms", "email")
	golden(t, c.ok("paused"), `
TYPE   PAUSED AT
email  YYYY-MM-DDTHH:MM:SSZ
sms    YYYY-MM-DDTHH:MM:SSZ
`)
	// Other tests' transactions may show as the oldest open one.
	stats := regexp.MustCompile(`waiting: \S+`).ReplaceAllString(c.ok("stats"), "waiting: D")
	stats = regexp.MustCompile(`(?m)^oldest open transaction: .*\n`).ReplaceAllString(stats, "")
	golden(t, stats, `
TYPE   BLOCKED  SCHEDULED  AVAILABLE  RUNNING  COMPLETED  FAILED  CANCELLED
email  0        0          2          0        0          0       0
sms    0        1          0          0        0          0       0
(all)  0        1          2          0        0          0       0

finished jobs are counted over the last 24h
oldest available job waiting: D
paused types: email, sms
`)
	golden(t, c.ok("resume", "email"), "resumed email\n")
	golden(t, c.ok("processes"), "WORKER  HOST  PID  STARTED  HEARTBEAT  RUNNING  LEASED  WORK (TYPES CONCURRENCY/PREFETCH)\n")
	golden(t, c.ok("schedules"), "NAME  KIND  SPEC  TYPE  LAST PLAN  NEXT PLAN  REGISTERED BY  STALE\n")
}

func cursorOf(t *testing.T, c *cli, args ...string) string {
	t.Helper()
	var page struct {
		Next string `json:"next"`
	}
	c.json(&page, append([]string{"list"}, args...)...)
	if page.Next == "" {
		t.Fatal("no next cursor")
	}
	return page.Next
}

// TestJSON: the --json outputs parse and carry the facts.
func TestJSON(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	var enq struct {
		ID uuid.UUID `json:"id"`
	}
	c.json(&enq, "enqueue", "report", `{"day":"mon"}`, "--tag", "a=b", "--priority", "7")
	var job jobJSON
	c.json(&job, "show", enq.ID.String())
	if job.ID != enq.ID || job.Type != "report" || job.Priority != 7 || job.Tags["a"] != "b" || job.MaxAttempts != backlog.DefaultMaxAttempts {
		t.Fatalf("show: %+v", job)
	}
	var page struct {
		Jobs []jobJSON `json:"jobs"`
		Next string    `json:"next"`
	}
	c.json(&page, "list", "--id", enq.ID.String(), "--created-after", "1h", "--created-before", "2999-01-01")
	if len(page.Jobs) != 1 || page.Jobs[0].ID != enq.ID {
		t.Fatalf("list: %+v", page)
	}
	c.json(&page, "list", "--created-before", "1h")
	if len(page.Jobs) != 0 {
		t.Fatalf("list --created-before 1h ago: %+v", page)
	}
	c.ok("pause", "report")
	var stats struct {
		ByState map[string]int            `json:"by_state"`
		ByType  map[string]map[string]int `json:"by_type"`
		Paused  []string                  `json:"paused"`
	}
	c.json(&stats, "stats")
	if stats.ByState["available"] != 1 || stats.ByType["report"]["available"] != 1 || len(stats.Paused) != 1 {
		t.Fatalf("stats: %+v", stats)
	}
	var paused []struct {
		Type     string    `json:"type"`
		PausedAt time.Time `json:"paused_at"`
	}
	c.json(&paused, "paused")
	if len(paused) != 1 || paused[0].Type != "report" || paused[0].PausedAt.IsZero() {
		t.Fatalf("paused: %+v", paused)
	}
	var procs, scheds []map[string]any
	c.json(&procs, "processes")
	c.json(&scheds, "schedules")
	if len(procs) != 0 || len(scheds) != 0 {
		t.Fatalf("processes %v, schedules %v", procs, scheds)
	}
}

func compact(t *testing.T, raw []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
