package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// failJobs enqueues n jobs of type typ that fail at once, and waits until
// they have failed.
func failJobs(t *testing.T, c *cli, typ string, n int) []uuid.UUID {
	t.Helper()
	q := c.queue()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []uuid.UUID
	for i := range n {
		id, err := q.Enqueue(ctx, typ, map[string]int{"i": i}, backlog.MaxAttempts(1), backlog.Tags{"batch": "b1"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error {
			return errors.New("smtp: connection refused")
		}), backlog.Types(typ), backlog.WorkerTags{"batch": "b1"})
	}()
	for _, id := range ids {
		select {
		case err := <-done:
			t.Fatalf("Work returned early: %v", err)
		default:
		}
		info, err := q.Wait(ctx, id)
		if err != nil || info.State != backlog.StateFailed {
			j, jerr := q.Job(context.Background(), id)
			t.Fatalf("job %s: %v %v (now %v %v)", id, info, err, j, jerr)
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return ids
}

// TestBulkRetry: by filter, a count first; --dry-run counts only; --yes
// retries.
func TestBulkRetry(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	ids := failJobs(t, c, "mail", 3)
	c.ok("enqueue", "mail", `{}`) // available: not retried

	var page struct {
		Jobs []jobJSON `json:"jobs"`
	}
	c.json(&page, "list", "--state", "failed", "--error-contains", "CONNECTION REFUSED", "--tag", "batch=b1")
	if len(page.Jobs) != 3 || page.Jobs[0].LastError != "smtp: connection refused" || len(page.Jobs[0].Errors) != 1 {
		t.Fatalf("failed jobs: %+v", page.Jobs)
	}
	out := c.ok("show", ids[0].String())
	if !strings.Contains(out, "Errors (oldest first):\n  attempt 1 at ") || !strings.Contains(out, "    smtp: connection refused") {
		t.Fatalf("show lacks the error history:\n%s", out)
	}

	out = c.fail(2, "add --yes to retry the 3 job(s)", "retry", "--type", "mail")
	golden(t, out, "3 job(s) match (failed, cancelled)\n")
	golden(t, c.ok("retry", "--type", "mail", "--dry-run"), "3 job(s) match (failed, cancelled)\n")
	var dry struct {
		Matched int  `json:"matched"`
		DryRun  bool `json:"dry_run"`
	}
	c.json(&dry, "retry", "--type", "mail", "--dry-run")
	if dry.Matched != 3 || !dry.DryRun {
		t.Fatalf("dry run: %+v", dry)
	}
	c.json(&page, "list", "--state", "failed")
	if len(page.Jobs) != 3 {
		t.Fatalf("--dry-run retried: %+v", page.Jobs)
	}
	golden(t, c.ok("retry", "--type", "mail", "--yes"), "3 job(s) match (failed, cancelled)\nretried 3 job(s)\n")
	c.json(&page, "list", "--state", "failed")
	if len(page.Jobs) != 0 {
		t.Fatalf("still failed after retry --yes: %+v", page.Jobs)
	}
	c.json(&page, "list", "--state", "available", "--type", "mail")
	if len(page.Jobs) != 4 {
		t.Fatalf("available after retry: %d jobs", len(page.Jobs))
	}
	golden(t, c.ok("retry", "--type", "mail", "--yes"), "0 job(s) match (failed, cancelled)\nretried 0 job(s)\n")
}

// TestActionsByID: cancel, retry and delete by ID, one failure reported
// while the others go on.
func TestActionsByID(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	a := strings.TrimSpace(c.ok("enqueue", "t"))
	b := strings.TrimSpace(c.ok("enqueue", "t"))
	golden(t, c.ok("cancel", a, b), `
ID                                    STATE
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  cancelled
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  cancelled
`)
	var res []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Error string `json:"error"`
	}
	c.json(&res, "retry", a)
	if len(res) != 1 || res[0].State != "available" {
		t.Fatalf("retry: %+v", res)
	}
	missing := uuid.NewString()
	out, errs, code := c.run("delete", a, missing, b)
	c.checkFail([]string{"delete"}, out, errs, code, 1, "job "+missing)
	if !strings.Contains(errs, "1 of 3 job(s) not deleted") {
		t.Fatalf("no summary: %s", errs)
	}
	golden(t, out, `
ID                                    STATE
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  deleted
xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx  deleted
`)
	c.fail(1, "job not found", "show", a)

	// Bulk cancel and delete with JSON counts.
	c.ok("enqueue", "x", "--tag", "k=v")
	c.ok("enqueue", "x", "--tag", "k=w")
	var n map[string]int
	c.json(&n, "cancel", "--tag", "k=v", "--yes")
	if n["matched"] != 1 || n["cancelled"] != 1 {
		t.Fatalf("cancel: %v", n)
	}
	c.json(&n, "delete", "--all", "--yes")
	if n["matched"] != 2 || n["deleted"] != 2 {
		t.Fatalf("delete --all: %v", n)
	}
}
