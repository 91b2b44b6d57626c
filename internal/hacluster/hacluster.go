// Package hacluster runs a private high-availability PostgreSQL cluster for
// failover tests: a pg_auto_failover monitor and three data nodes (a
// primary and two standbys, number_sync_standbys 1: every commit is on at
// least one standby before it is acknowledged) on free loopback ports, in
// a temporary directory removed when the test ends. scripts/ha.sh install puts
// pg_auto_failover on the machine (Debian packages
// postgresql-<N>-auto-failover and pg-auto-failover-cli).
//
// The harness starts and owns every pg_autoctl process (each in a process
// group of its own, so that a node can be killed whole); run as root, they
// run as the system user backlogtest (created when missing), since
// PostgreSQL refuses root, as in internal/pgcluster. The monitor's health
// checks are tightened (a node is unhealthy after about 2 s without an
// answer, a primary that lost the monitor is given 5 s to demote itself)
// so that a failover takes seconds rather than the default half minute.
//
// Why three data nodes: with two, a node promoted while the other is away
// (a failover, a switchover) runs in pg_auto_failover's wait_primary
// state, in which synchronous_standby_names is empty and commits are
// acknowledged before any standby has them; a switchover soon after
// loses them with the demoted node (seen in 1 of 3 runs of
// TestHAFailover). With two standbys and number_sync_standbys 1, one
// standby gone leaves the other synchronous, and the tests wait (WaitHealthy)
// until every node has reached the state the monitor assigned it before
// each failover step.
package hacluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Database is the database the data nodes serve (made by pg_autoctl).
const Database = "backlog"

// Node names, as the monitor knows them.
const (
	Node1 = "node1"
	Node2 = "node2"
	Node3 = "node3"
)

// Nodes are the data nodes' names, node1 the first primary.
var Nodes = []string{Node1, Node2, Node3}

// Cluster is a monitor and three data nodes, torn down when the test ends.
type Cluster struct {
	t       testing.TB
	bin     string // PostgreSQL server binaries
	autoctl string // pg_autoctl
	dir     string
	cred    *syscall.Credential // nil when not root

	monitorPort int
	monitor     *proc
	nodes       map[string]*node

	mu sync.Mutex // guards the nodes' proc
}

type node struct {
	name string
	port int
	proc *proc // nil while killed
}

// proc is one pg_autoctl process (and its process group).
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	err  error         // its exit status, once done
}

// Start brings up the monitor and the three data nodes, sets
// number_sync_standbys to 1, and waits until node1 is the primary and the
// others its standbys, synchronous_standby_names naming both. It skips the test when
// pg_auto_failover or the PostgreSQL server is missing (a failure when fail
// is set, as in CI).
func Start(t testing.TB, fail bool) *Cluster {
	t.Helper()
	c := &Cluster{t: t, nodes: map[string]*node{}}
	var err error
	if c.bin, c.autoctl, err = binaries(); err != nil {
		if fail {
			t.Fatalf("hacluster: %v", err)
		}
		t.Skipf("hacluster: %v (scripts/ha.sh install)", err)
	}
	if os.Geteuid() == 0 {
		cred, err := ensureUser("backlogtest")
		if err != nil {
			t.Fatalf("hacluster: %v", err)
		}
		c.cred = cred
	}
	if c.dir, err = os.MkdirTemp("", "backlog-hacluster-"); err != nil {
		t.Fatalf("hacluster: %v", err)
	}
	t.Cleanup(c.teardown)
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatalf("hacluster: %v", err)
		}
	}
	ports, err := freePorts(1 + len(Nodes))
	if err != nil {
		t.Fatalf("hacluster: %v", err)
	}
	c.monitorPort = ports[0]
	for i, name := range Nodes {
		c.nodes[name] = &node{name: name, port: ports[1+i]}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.bringUp(ctx); err != nil {
		t.Fatalf("hacluster: %v\n%s", err, c.Logs())
	}
	return c
}

func (c *Cluster) bringUp(ctx context.Context) error {
	// The monitor and the first node run on clusters initialised here, so
	// that they start with small settings; the second node is a base
	// backup of the first and inherits them.
	small := []string{
		"shared_buffers = 32MB",
		"max_connections = 60",
		"unix_socket_directories = '" + c.dir + "'",
		"listen_addresses = '127.0.0.1'",
	}
	monitorConf := append(small,
		"pgautofailover.health_check_period = 1000",
		"pgautofailover.health_check_timeout = 1000",
		"pgautofailover.health_check_max_retries = 1",
		"pgautofailover.health_check_retry_delay = 500",
		"pgautofailover.node_considered_unhealthy_timeout = 2000",
		"pgautofailover.primary_demote_timeout = 5000",
		"pgautofailover.startup_grace_period = 2000",
	)
	if err := c.initdb("monitor", monitorConf); err != nil {
		return err
	}
	if err := c.initdb(Node1, small); err != nil {
		return err
	}
	// The monitor: created, told to listen on loopback only (pg_autoctl
	// would listen on every address), then run.
	if out, err := c.command("create", "monitor", "--pgctl", filepath.Join(c.bin, "pg_ctl"),
		"--pgdata", c.pgdata("monitor"), "--pgport", strconv.Itoa(c.monitorPort),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_autoctl create monitor: %v\n%s", err, out)
	}
	if out, err := c.command("config", "set", "--pgdata", c.pgdata("monitor"),
		"postgresql.listen_addresses", "127.0.0.1").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_autoctl config set: %v\n%s", err, out)
	}
	var err error
	if c.monitor, err = c.spawn("monitor", "run", "--pgdata", c.pgdata("monitor")); err != nil {
		return err
	}
	if err := c.poll(ctx, "the monitor to answer", func(ctx context.Context) (bool, error) {
		_, err := c.states(ctx)
		return err == nil, err
	}); err != nil {
		return err
	}
	// node1 first (it registers as single), then the standbys, one at a
	// time (each a base backup of node1).
	for _, name := range Nodes {
		n := c.nodes[name]
		if n.proc, err = c.spawn(name, "create", "postgres", "--pgctl", filepath.Join(c.bin, "pg_ctl"),
			"--pgdata", c.pgdata(name), "--pghost", "127.0.0.1", "--pgport", strconv.Itoa(n.port),
			"--listen", "127.0.0.1", "--hostname", "127.0.0.1", "--name", name,
			"--username", "postgres", "--dbname", Database, "--monitor", c.MonitorURL(),
			"--auth", "trust", "--no-ssl", "--run"); err != nil {
			return err
		}
		want := "single"
		if name != Node1 {
			want = "secondary"
		}
		if err := c.waitState(ctx, name, want); err != nil {
			return err
		}
	}
	// One standby must have every commit before it is acknowledged (the
	// default, 0, acknowledges commits with no standby at all when they
	// are all away). pg_autoctl set formation goes through a node's
	// keeper to the monitor.
	if out, err := runCtx(ctx, c.command("set", "formation", "number-sync-standbys", "1",
		"--pgdata", c.pgdata(Node1))); err != nil {
		return fmt.Errorf("pg_autoctl set formation number-sync-standbys 1: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return err
	}
	return c.poll(ctx, "synchronous_standby_names to name both standbys", func(ctx context.Context) (bool, error) {
		s, err := c.SynchronousStandbyNames(ctx)
		if err != nil {
			return false, err
		}
		return strings.HasPrefix(s, "ANY 1 (") && strings.Count(s, ",") == 1, fmt.Errorf("synchronous_standby_names = %q", s)
	})
}

// URL is the connection string of whichever node is the primary: every
// data node, with target_session_attrs=read-write (pgx tries them in
// order and keeps the one that accepts writes).
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", c.hosts(), Database)
}

// StandbyURL is the connection string of a standby
// (target_session_attrs=prefer-standby: the primary when no standby
// answers).
func (c *Cluster) StandbyURL() string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=prefer-standby", c.hosts(), Database)
}

// hosts lists every data node as host:port, comma-separated.
func (c *Cluster) hosts() string {
	hs := make([]string, len(Nodes))
	for i, name := range Nodes {
		hs[i] = fmt.Sprintf("127.0.0.1:%d", c.nodes[name].port)
	}
	return strings.Join(hs, ",")
}

// NodeURL is the connection string of one data node.
func (c *Cluster) NodeURL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.nodes[name].port, Database)
}

// MonitorURL is the connection string of the monitor's database.
func (c *Cluster) MonitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", c.monitorPort)
}

// NodeState is a data node as the monitor sees it.
type NodeState struct {
	Name     string
	Port     int
	Reported string // the state the node reported
	Goal     string // the state the monitor assigned it
}

// States returns the data nodes as the monitor sees them, by name.
func (c *Cluster) States(ctx context.Context) ([]NodeState, error) { return c.states(ctx) }

func (c *Cluster) states(ctx context.Context) ([]NodeState, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.MonitorURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text
		FROM pgautofailover.node ORDER BY nodename`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeState, error) {
		var s NodeState
		err := r.Scan(&s.Name, &s.Port, &s.Reported, &s.Goal)
		return s, err
	})
}

// Primary returns the name of the node the monitor holds for the primary
// (reported and assigned primary, wait_primary or single), or an error
// when there is none at the moment (a failover under way).
func (c *Cluster) Primary(ctx context.Context) (string, error) {
	ss, err := c.states(ctx)
	if err != nil {
		return "", err
	}
	for _, s := range ss {
		if s.Reported == s.Goal && (s.Goal == "primary" || s.Goal == "wait_primary" || s.Goal == "single") {
			return s.Name, nil
		}
	}
	return "", fmt.Errorf("hacluster: no primary now: %v", ss)
}

// KillPrimary kills the primary's node whole, as a machine failure would:
// SIGKILL to its pg_autoctl process group (the keeper, its postgres
// supervisor and the postmaster; the backends, which PostgreSQL puts in
// sessions of their own, exit when they see the postmaster gone). It
// returns the killed node's name, which Rejoin brings back. (A kill -9 of
// the postmaster alone is no failover: the node's keeper restarts it in
// place within a second or two.)
func (c *Cluster) KillPrimary(ctx context.Context) (string, error) {
	name, err := c.Primary(ctx)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	n := c.nodes[name]
	p := n.proc
	n.proc = nil
	c.mu.Unlock()
	if p == nil {
		return "", fmt.Errorf("hacluster: %s is not running", name)
	}
	pm := c.postmasterPID(name)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	if pm > 0 {
		_ = syscall.Kill(pm, syscall.SIGKILL) // in the group already; in case it was not
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return name, ctx.Err()
	}
	return name, nil
}

// KillPrimaryPostmaster sends SIGKILL to the primary's postmaster alone
// and returns the node's name and the killed pid. The node's keeper
// (pg_autoctl, alive) starts PostgreSQL again in place (crash recovery)
// within seconds, usually before the monitor sees the node unhealthy: a
// crash, not a failover.
func (c *Cluster) KillPrimaryPostmaster(ctx context.Context) (string, int, error) {
	name, err := c.Primary(ctx)
	if err != nil {
		return "", 0, err
	}
	pid := c.postmasterPID(name)
	if pid <= 0 {
		return name, 0, fmt.Errorf("hacluster: no postmaster.pid for %s", name)
	}
	return name, pid, syscall.Kill(pid, syscall.SIGKILL)
}

// PostmasterPID returns the pid in a node's postmaster.pid (0 when there
// is none).
func (c *Cluster) PostmasterPID(name string) int { return c.postmasterPID(name) }

// Rejoin runs a killed node's pg_autoctl again: it rejoins the formation
// as a standby of the new primary (pg_rewind, then streaming).
// WaitHealthy waits for that.
func (c *Cluster) Rejoin(name string) error {
	c.mu.Lock()
	n := c.nodes[name]
	running := n.proc != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("hacluster: %s is running", name)
	}
	p, err := c.spawn(name, "run", "--pgdata", c.pgdata(name))
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.proc = p
	c.mu.Unlock()
	return nil
}

// Switchover asks the monitor for a controlled switchover (pg_autoctl
// perform switchover: the primary is demoted, the standby promoted once
// it has caught up) and returns when pg_autoctl reports it done.
func (c *Cluster) Switchover(ctx context.Context) error {
	cmd := c.command("perform", "switchover", "--pgdata", c.pgdata("monitor"), "--wait", "60")
	out, err := runCtx(ctx, cmd)
	if err != nil {
		return fmt.Errorf("pg_autoctl perform switchover: %v\n%s", err, out)
	}
	return nil
}

// WaitPrimary waits until the monitor names a primary and that node
// commits a write (within 2 s an attempt: a primary still waiting for a
// synchronous standby that is gone does not count), and returns its name.
func (c *Cluster) WaitPrimary(ctx context.Context) (string, error) {
	var name string
	err := c.poll(ctx, "a primary that accepts writes", func(ctx context.Context) (bool, error) {
		p, err := c.Primary(ctx)
		if err != nil {
			return false, err
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.NodeURL(p))
		if err != nil {
			return false, err
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS hacluster_probe (at timestamptz);
			INSERT INTO hacluster_probe VALUES (now())`); err != nil {
			return false, err
		}
		name = p
		return true, nil
	})
	return name, err
}

// WaitHealthy waits until the formation has settled with every data node
// in it: one node primary and the others secondary, each as reported and
// as assigned (no node in a transition such as wait_primary, in which
// synchronous replication is off, or catchingup). Every failover step of
// the tests begins from there.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return c.poll(ctx, "a primary and every other node secondary", func(ctx context.Context) (bool, error) {
		ss, err := c.states(ctx)
		if err != nil {
			return false, err
		}
		primaries, secondaries := 0, 0
		for _, s := range ss {
			switch {
			case s.Reported == "primary" && s.Goal == "primary":
				primaries++
			case s.Reported == "secondary" && s.Goal == "secondary":
				secondaries++
			case s.Reported == "wait_standby" || s.Reported == "catchingup":
				c.checkpointPrimary(ctx, ss)
			}
		}
		if primaries != 1 || secondaries != len(Nodes)-1 || len(ss) != len(Nodes) {
			return false, fmt.Errorf("states: %v", ss)
		}
		return true, nil
	})
}

// SynchronousStandbyNames returns SHOW synchronous_standby_names on the
// primary.
func (c *Cluster) SynchronousStandbyNames(ctx context.Context) (string, error) {
	p, err := c.Primary(ctx)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, c.NodeURL(p))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var s string
	err = conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&s)
	return s, err
}

// waitState waits until the node reports, and is assigned, state want;
// while a standby is being built, it makes the primary checkpoint (the
// base backup waits for a checkpoint, which PostgreSQL otherwise spreads
// over minutes).
func (c *Cluster) waitState(ctx context.Context, name, want string) error {
	return c.poll(ctx, name+" in state "+want, func(ctx context.Context) (bool, error) {
		ss, err := c.states(ctx)
		if err != nil {
			return false, err
		}
		for _, s := range ss {
			if s.Name == name && s.Reported == want && s.Goal == want {
				return true, nil
			}
		}
		c.checkpointPrimary(ctx, ss)
		if err := c.exited(name); err != nil {
			return false, err
		}
		return false, fmt.Errorf("states: %v", ss)
	})
}

func (c *Cluster) checkpointPrimary(ctx context.Context, ss []NodeState) {
	for _, s := range ss {
		if s.Reported == "wait_primary" || s.Reported == "primary" || s.Reported == "single" {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if conn, err := pgx.Connect(ctx, c.NodeURL(s.Name)); err == nil {
				_, _ = conn.Exec(ctx, `CHECKPOINT`)
				conn.Close(context.Background())
			}
			cancel()
		}
	}
}

// exited reports a node's pg_autoctl that has ended (a bring-up failure).
func (c *Cluster) exited(name string) error {
	c.mu.Lock()
	p := c.nodes[name].proc
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return fmt.Errorf("pg_autoctl of %s exited: %v", name, p.err)
	default:
		return nil
	}
}

// poll calls cond every 100 ms until it returns true, or ctx ends (the
// error then names what was awaited and cond's last error).
func (c *Cluster) poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("hacluster: waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// Logs returns the pg_autoctl logs of the monitor and the data nodes and the tail
// of the data nodes' PostgreSQL logs, for a failure message.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, name := range append([]string{"monitor"}, Nodes...) {
		out, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
		fmt.Fprintf(&b, "==== pg_autoctl %s ====\n%s\n", name, tail(string(out), 60))
	}
	return b.String()
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// teardown stops every pg_autoctl (SIGTERM to its group: the keeper stops
// its PostgreSQL; SIGKILL after 30 s), makes sure no postmaster of the
// cluster is left, and removes the directory.
func (c *Cluster) teardown() {
	c.mu.Lock()
	var procs []*proc
	for _, n := range c.nodes {
		if n.proc != nil {
			procs = append(procs, n.proc)
		}
	}
	if c.monitor != nil {
		procs = append(procs, c.monitor)
	}
	c.mu.Unlock()
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	// One deadline for them all: each waits at most until it (a fired
	// timer's channel would not fire again for the next process).
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(time.Until(deadline)):
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	for _, p := range procs {
		<-p.done // killed: its Wait returns
	}
	for _, name := range append([]string{"monitor"}, Nodes...) {
		if pid := c.postmasterPID(name); pid > 0 && syscall.Kill(pid, 0) == nil {
			c.t.Logf("hacluster: %s's postmaster %d outlived its pg_autoctl: stopping it", name, pid)
			stop := c.pgctl("-D", c.pgdata(name), "-m", "immediate", "-w", "-t", "30", "stop")
			if out, err := stop.CombinedOutput(); err != nil {
				c.t.Logf("hacluster: pg_ctl stop %s: %v\n%s", name, err, out)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if c.t.Failed() {
		c.t.Logf("hacluster logs:\n%s", c.Logs())
	}
	_ = os.RemoveAll(c.dir)
}

func (c *Cluster) pgdata(name string) string { return filepath.Join(c.dir, name) }

// postmasterPID reads the first line of a node's postmaster.pid (0 when
// there is none).
func (c *Cluster) postmasterPID(name string) int {
	b, err := os.ReadFile(filepath.Join(c.pgdata(name), "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

func (c *Cluster) initdb(name string, conf []string) error {
	cmd := c.as(exec.Command(filepath.Join(c.bin, "initdb"), "-D", c.pgdata(name), "--auth=trust",
		"-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb %s: %v\n%s", name, err, out)
	}
	f, err := os.OpenFile(filepath.Join(c.pgdata(name), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("\n# hacluster\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// command is pg_autoctl with args, as the cluster's user, with its
// configuration and state under the cluster's directory.
func (c *Cluster) command(args ...string) *exec.Cmd {
	return c.as(exec.Command(c.autoctl, args...))
}

func (c *Cluster) pgctl(args ...string) *exec.Cmd {
	return c.as(exec.Command(filepath.Join(c.bin, "pg_ctl"), args...))
}

func (c *Cluster) as(cmd *exec.Cmd) *exec.Cmd {
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(),
		"HOME="+c.dir,
		"XDG_CONFIG_HOME="+filepath.Join(c.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(c.dir, "share"),
		"XDG_RUNTIME_DIR="+filepath.Join(c.dir, "run"),
		"PGHOST="+c.dir,
		"PGUSER=postgres",
		"PGDATABASE=postgres",
		"PATH="+c.bin+":"+os.Getenv("PATH"),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd
}

// spawn starts a long-running pg_autoctl (logging to <name>.log, appended)
// in a process group of its own.
func (c *Cluster) spawn(name string, args ...string) (*proc, error) {
	log, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := c.command(args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("pg_autoctl %s: %v", strings.Join(args, " "), err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// runCtx runs cmd to its end, killing its process group if ctx ends first.
func runCtx(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return []byte(out.String()), err
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return []byte(out.String()), ctx.Err()
	}
}

// binaries finds the newest PostgreSQL server with pg_auto_failover's
// extension, and pg_autoctl.
func binaries() (bin, autoctl string, err error) {
	autoctl, err = exec.LookPath("pg_autoctl")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/pg_autoctl"); serr != nil {
			return "", "", errors.New("pg_autoctl not found (Debian package pg-auto-failover-cli)")
		}
		autoctl = "/usr/bin/pg_autoctl"
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		v := filepath.Base(filepath.Dir(d))
		ok := true
		for _, p := range []string{filepath.Join(d, "initdb"), filepath.Join(d, "pg_ctl"), filepath.Join(d, "postgres"),
			filepath.Join("/usr/share/postgresql", v, "extension", "pgautofailover.control")} {
			if _, err := os.Stat(p); err != nil {
				ok = false
			}
		}
		if ok {
			return d, autoctl, nil
		}
	}
	return "", "", errors.New("no PostgreSQL server with the pgautofailover extension (Debian package postgresql-<N>-auto-failover)")
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func ensureUser(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		out, aerr := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
			"--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if u, err = user.Lookup(name); err != nil { // made, or made by a parallel run
			return nil, fmt.Errorf("useradd %s: %v\n%s", name, aerr, out)
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePorts returns n distinct TCP ports nothing listens on now.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
