package main

import (
	"context"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backlogq/backlog/internal/pgcluster"
)

// TestReadURL: with --read-url (or $BACKLOG_READ_URL) the read commands
// read that server, the others the primary. Here the read URL names
// another database of the test server, where the CLI's schema does not
// exist: every read command fails on it while the writes succeed; then,
// pointed at the primary itself (allowed: never stale), the reads see
// the writes. An unreachable read URL is named, its password hidden.
func TestReadURL(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	elsewhere := u.String()
	c.ok("--read-url", elsewhere, "enqueue", "t")
	c.ok("--read-url", elsewhere, "pause", "t")
	c.ok("--read-url", elsewhere, "limit", "set", "t", "--concurrency", "2")
	for _, args := range [][]string{{"stats"}, {"list"}, {"paused"}, {"processes"}, {"schedules"}, {"limits"},
		{"show", "01890000-0000-7000-8000-000000000000"}} {
		c.fail(1, "does not exist", append([]string{"--read-url", elsewhere}, args...)...)
		out, errs, code := c.runEnv([]string{"DATABASE_URL=" + dbURL, "BACKLOG_READ_URL=" + elsewhere},
			append([]string{"--schema", c.schema}, args...)...)
		c.checkFail(args, out, errs, code, 1, "does not exist")
	}
	if out := c.ok("--read-url", dbURL, "list"); !strings.Contains(out, "available") {
		t.Fatalf("list through a read URL on the primary:\n%s", out)
	}
	if out := c.ok("--read-url", dbURL, "paused"); !strings.Contains(out, "t ") {
		t.Fatalf("paused through a read URL on the primary:\n%s", out)
	}

	args := []string{"--read-url", "postgres://someone:s3cr3tpw@127.0.0.1:1/db", "stats"}
	out, errs, code := c.run(args...)
	c.checkFail(args, out, errs, code, 1, "the read replica (--read-url): cannot reach PostgreSQL at 127.0.0.1:1")
	if strings.Contains(errs+out, "s3cr3tpw") {
		t.Fatalf("the password shows: %s", errs)
	}
	args = []string{"--read-url", "postgres://someone:s3cr3tpw@127.0.0.1:notaport/db", "list"}
	out, errs, code = c.run(args...)
	c.checkFail(args, out, errs, code, 2, "bad read URL")
	if strings.Contains(errs, "s3cr3tpw") {
		t.Fatalf("the password shows: %s", errs)
	}
}

// TestReadURLActionsReadThePrimary: with --read-url on a standby whose
// replay is paused (a private primary and a real streaming hot standby
// made of it), a job enqueued afterwards is missing from `list`, yet
// the dashboard's bulk confirmation (`ui --read-url`) counts it and
// `cancel --type … --yes` counts and cancels it: the reads that decide a
// write read the primary.
func TestReadURLActionsReadThePrimary(t *testing.T) {
	t.Parallel()
	primary := pgcluster.Start(t, os.Getenv("BACKLOG_CI") == "1", nil)
	c := newCLI(t)
	db := []string{"--database-url", primary.URL()}
	c.ok(append(db, "migrate", "up")...)
	standby, err := primary.Standby()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := append(db, "--read-url", standby.URL())
	id := strings.TrimSpace(c.ok(append(rdb, "enqueue", "t")...))
	if out := c.ok(append(rdb, "list", "--type", "t")...); strings.Contains(out, id) {
		t.Fatalf("the standby lists the job: replay is not paused\n%s", out)
	}

	port := strconv.Itoa(freePort(t))
	cmd, _, _ := c.startUI(append(rdb, "--addr", "127.0.0.1:"+port)...)
	_, body := waitOK(t, "http://127.0.0.1:"+port+"/jobs/confirm?action=cancel&type=t")
	if !strings.Contains(body, `<strong id="confirm-count">1</strong>`) {
		t.Fatalf("the dashboard's bulk confirmation did not count the job on the primary:\n%s", body)
	}
	stopUI(t, cmd, syscall.SIGINT)

	out := c.ok(append(rdb, "cancel", "--type", "t", "--yes")...)
	if !strings.Contains(out, "1 job(s) match") || !strings.Contains(out, "cancelled 1 job(s)") {
		t.Fatalf("cancel --type t --yes with a paused standby:\n%s", out)
	}
	if out := c.ok(append(db, "show", id)...); !strings.Contains(out, "cancelled") {
		t.Fatalf("the job is not cancelled on the primary:\n%s", out)
	}
}
