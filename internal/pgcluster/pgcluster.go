// Package pgcluster runs a private PostgreSQL cluster for tests that must
// crash, restart or reconfigure the server itself (the shared test
// database must never be crashed under other tests). It uses the server
// binaries in /usr/lib/postgresql/<highest version>/bin, as
// scripts/with-db.sh does; run as root, the cluster runs as the system user
// backlogtest (created when missing), since PostgreSQL refuses root.
package pgcluster

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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a private PostgreSQL server in a temporary directory,
// removed when the test ends.
type Cluster struct {
	t       testing.TB
	bin     string
	dir     string // the temporary directory (data, socket, log)
	port    int
	runAs   string // the user the server runs as ("" when not root)
	options []string

	mu      sync.Mutex
	running bool
}

// Options are server settings (name=value) added to the defaults.
type Options []string

// Start initialises and starts a cluster, or skips the test when the
// machine has no PostgreSQL server binaries (a failure when fail is set,
// as in CI). The defaults are durable ones (fsync on, synchronous_commit
// on), unlike the throw-away cluster of scripts/with-db.sh: crash tests
// are about what survives.
func Start(t testing.TB, fail bool, opts Options) *Cluster {
	t.Helper()
	bin, err := serverBin()
	if err != nil {
		if fail {
			t.Fatalf("pgcluster: %v", err)
		}
		t.Skipf("pgcluster: %v", err)
	}
	c := &Cluster{t: t, bin: bin, options: opts}
	if os.Geteuid() == 0 {
		c.runAs = "backlogtest"
		if err := ensureUser(c.runAs); err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
	}
	c.dir, err = os.MkdirTemp("", "backlog-pgcluster-")
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	t.Cleanup(c.remove)
	if err := c.chown(c.dir); err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	if out, err := c.cmd("initdb", "-D", c.data(), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("pgcluster: initdb: %v\n%s", err, out)
	}
	c.port, err = freePort()
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	if err := c.Start(); err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	return c
}

// Standby makes a streaming hot standby of c, a cluster of its own (in
// its own temporary directory, on its own port, removed when the test
// ends): pg_basebackup -R copies c's data and writes the standby's
// primary_conninfo (c's loopback port) and standby.signal; the standby
// then starts with c's options and replays c's WAL as it streams in. c
// must be running. Stop, Crash and Start apply to the standby alone.
func (c *Cluster) Standby() (*Cluster, error) {
	s := &Cluster{t: c.t, bin: c.bin, runAs: c.runAs, options: c.options}
	var err error
	if s.dir, err = os.MkdirTemp("", "backlog-pgstandby-"); err != nil {
		return nil, err
	}
	c.t.Cleanup(s.remove)
	if err := s.chown(s.dir); err != nil {
		return nil, err
	}
	out, err := s.cmd("pg_basebackup", "-D", s.data(), "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-R", "-X", "stream", "--checkpoint=fast", "--no-sync").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pg_basebackup: %v\n%s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// PauseReplay pauses WAL replay on c, a standby (pg_wal_replay_pause),
// and waits until replay is paused or ctx ends: c's reads then show the
// primary as it was, whatever commits there later, as a standby lagging
// without end would.
func (c *Cluster) PauseReplay(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgcluster: pausing replay: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		return fmt.Errorf("pgcluster: pausing replay: %w", err)
	}
	for {
		var state string
		if err := conn.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state); err != nil {
			return fmt.Errorf("pgcluster: pausing replay: %w", err)
		}
		if state == "paused" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: replay not paused: %w (state %s)", ctx.Err(), state)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL is the cluster's connection string (database postgres, user
// postgres).
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Start starts the server (after Crash or Stop) and waits until it
// accepts connections.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	o := []string{"-k", c.dir, "-p", strconv.Itoa(c.port), "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=100"}
	for _, s := range c.options {
		o = append(o, "-c", s)
	}
	if out, err := c.cmd("pg_ctl", "-D", c.data(), "-l", c.log(), "-w", "-t", "120", "-o", shellJoin(o), "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(c.log())
		return fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	c.running = true
	return nil
}

// Crash stops the server the way a crash would: an immediate shutdown
// (every server process quits at once, nothing is flushed or
// checkpointed; the next start recovers from the WAL on disk). What was
// committed without being flushed (synchronous_commit = off) is lost.
func (c *Cluster) Crash() error { return c.stop("immediate") }

// Stop stops the server cleanly.
func (c *Cluster) Stop() error { return c.stop("fast") }

func (c *Cluster) stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	if out, err := c.cmd("pg_ctl", "-D", c.data(), "-m", mode, "-w", "-t", "60", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	c.running = false
	return nil
}

// Log returns the server's log so far.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(c.log())
	return string(b)
}

// WaitReady waits until the server answers a query, or ctx ends.
func (c *Cluster) WaitReady(ctx context.Context) error {
	for {
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: not ready: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) remove() {
	if err := c.stop("immediate"); err != nil {
		c.t.Logf("pgcluster: %v", err)
	}
	_ = os.RemoveAll(c.dir)
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) log() string  { return filepath.Join(c.dir, "postgres.log") }

// cmd runs one of the server's programs as the cluster's user, from the
// cluster's directory (the user may not read the working directory).
func (c *Cluster) cmd(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, prog)
	var cmd *exec.Cmd
	if c.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	return cmd
}

func (c *Cluster) chown(path string) error {
	if c.runAs == "" {
		return nil
	}
	u, err := user.Lookup(c.runAs)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// serverBin finds the newest /usr/lib/postgresql/*/bin with the server.
func serverBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		ok := true
		for _, p := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(dirs[i], p)); err != nil {
				ok = false
			}
		}
		if ok {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (install the postgresql package)")
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func ensureUser(name string) error {
	if _, err := user.Lookup(name); err == nil {
		return nil
	}
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if _, lerr := user.Lookup(name); lerr == nil { // made, or made by a parallel run
		return nil
	}
	return fmt.Errorf("useradd %s: %v\n%s", name, err, out)
}

// freePort returns a TCP port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// shellJoin quotes args for pg_ctl's -o, which the shell splits.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
