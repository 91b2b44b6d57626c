package hacluster_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/backlogq/backlog/internal/hacluster"
)

// TestCluster brings a cluster up, checks synchronous replication, kills
// the primary, rejoins it and switches over (to either standby: the
// monitor picks the most advanced). It runs only with
// BACKLOG_HA=1 (make test-ha).
func TestCluster(t *testing.T) {
	if os.Getenv("BACKLOG_HA") != "1" {
		t.Skip("HA cluster test: set BACKLOG_HA=1 (make test-ha)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	c := hacluster.Start(t, os.Getenv("BACKLOG_CI") == "1")
	t.Logf("up in %s: %s", time.Since(began).Round(time.Millisecond), c.URL())
	names, err := c.SynchronousStandbyNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("synchronous_standby_names = %q", names)
	if names == "" {
		t.Fatal("synchronous replication is off")
	}
	old, err := c.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if _, err := c.KillPrimary(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := c.WaitPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s; %s accepts writes after %s", old, p, time.Since(killed).Round(time.Millisecond))
	if p == old {
		t.Fatalf("primary still %s", p)
	}
	if err := c.Rejoin(old); err != nil {
		t.Fatal(err)
	}
	rejoin := time.Now()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s rejoined as standby in %s", old, time.Since(rejoin).Round(time.Millisecond))
	sw := time.Now()
	if err := c.Switchover(ctx); err != nil {
		t.Fatal(err)
	}
	p2, err := c.WaitPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("switchover %s -> %s in %s", p, p2, time.Since(sw).Round(time.Millisecond))
	if p2 == p {
		t.Fatalf("after the switchover the primary is still %s", p2)
	}

	// kill -9 of the postmaster alone: the keeper restarts it in place.
	name, pid, err := c.KillPrimaryPostmaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	p3, err := c.WaitPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("postmaster %d of %s killed: %s accepts writes after %s (new postmaster %d)", pid, name, p3,
		time.Since(crashed).Round(time.Millisecond), c.PostmasterPID(p3))
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	ss, err := c.States(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("states after the postmaster's crash: %v", ss)
}
