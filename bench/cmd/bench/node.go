package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/backlogq/backlog/bench/internal/pgcpu"
)

// graphileDir holds the Node program that runs graphile-worker (worker.js,
// package.json, package-lock.json), relative to bench/, where the harness
// runs.
const graphileDir = "graphile"

// nodeRuntime is what the graphile-worker column needs from the machine,
// found once per run by prepare.
type nodeRuntime struct {
	node        string // path of the node executable
	nodeVersion string // e.g. v20.20.2
	gwVersion   string // graphile-worker's version in node_modules
	pgVersion   string // node-postgres's version in node_modules
}

// prepare finds node on PATH and makes sure bench/graphile's packages are
// installed at the versions package.json pins, running `npm ci` (from
// package-lock.json) when they are missing or differ. An error says why
// graphile-worker cannot run on this machine.
func (r *nodeRuntime) prepare(ctx context.Context) error {
	node, err := exec.LookPath("node")
	if err != nil {
		return errors.New("node is not on PATH (install Node.js 20 or later to include it)")
	}
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %v", node, err)
	}
	r.node, r.nodeVersion = node, strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(graphileDir, "worker.js")); err != nil {
		return fmt.Errorf("%s/worker.js not found (run the harness from bench/): %v", graphileDir, err)
	}
	want, err := pinnedVersion("graphile-worker")
	if err != nil {
		return err
	}
	if r.gwVersion = installedVersion("graphile-worker"); r.gwVersion != want {
		if err := npmCI(ctx); err != nil {
			return err
		}
		if r.gwVersion = installedVersion("graphile-worker"); r.gwVersion != want {
			return fmt.Errorf("after npm ci, %s/node_modules has graphile-worker %q, not %s", graphileDir, r.gwVersion, want)
		}
	}
	r.pgVersion = installedVersion("pg")
	return nil
}

// pinnedVersion returns the version of a dependency in bench/graphile's
// package.json.
func pinnedVersion(pkg string) (string, error) {
	var p struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	b, err := os.ReadFile(filepath.Join(graphileDir, "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err != nil {
		return "", fmt.Errorf("reading %s/package.json: %v", graphileDir, err)
	}
	if v := p.Dependencies[pkg]; v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%s/package.json does not depend on %s", graphileDir, pkg)
}

// installedVersion returns the version of a package in bench/graphile's
// node_modules, or "" when it is not there.
func installedVersion(pkg string) string {
	var p struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(graphileDir, "node_modules", pkg, "package.json"))
	if err != nil || json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
}

// npmCI installs bench/graphile's packages exactly as package-lock.json
// says. Its output goes to stderr, away from the table.
func npmCI(ctx context.Context) error {
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("%s/node_modules needs installing, and npm is not on PATH", graphileDir)
	}
	logf("graphile-worker: installing %s/node_modules with npm ci (from package-lock.json)", graphileDir)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir, cmd.Stdout, cmd.Stderr = graphileDir, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm ci in %s: %v", graphileDir, err)
	}
	return nil
}

// nodeChild is a running bench/graphile/worker.js, driven over its line
// protocol (described at the top of worker.js): one command at a time, each
// answered by one "ok"/"err" line; "job" event lines in between go to the
// job hook.
type nodeChild struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string   // reply lines, in order
	exited  chan struct{} // closed when the child's stdout ends
	onJob   atomic.Pointer[jobHook]

	mu     sync.Mutex // held for a command and its reply
	broken error      // set when the protocol can no longer be trusted

	cpuMu   sync.Mutex
	lastCPU time.Duration // the last CPU reading, for after the child exited
}

// startNode starts worker.js with arg (its JSON configuration) and env. The
// child gets its own process group, so a Ctrl-C meant for the harness does
// not reach it: the harness stops it through the protocol.
func startNode(rt *nodeRuntime, arg string, env []string) (*nodeChild, error) {
	cmd := exec.Command(rt.node, "worker.js", arg)
	cmd.Dir, cmd.Env, cmd.Stderr = graphileDir, env, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node: %w", err)
	}
	c := &nodeChild{cmd: cmd, stdin: stdin, replies: make(chan string, 16), exited: make(chan struct{})}
	go c.read(stdout)
	return c, nil
}

// read dispatches the child's output lines until it ends.
func (c *nodeChild) read(stdout io.Reader) {
	defer close(c.exited)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if ev, ok := strings.CutPrefix(line, "job "); ok {
			c.jobEvent(ev)
			continue
		}
		select {
		case c.replies <- line:
		default:
			logf("warning: graphile-worker child: unexpected output %q", line)
		}
	}
}

// jobEvent passes "<seq> <µs since the epoch>" to the hook.
func (c *nodeChild) jobEvent(ev string) {
	h := c.onJob.Load()
	if h == nil {
		return
	}
	s, us, _ := strings.Cut(ev, " ")
	seq, err1 := strconv.ParseInt(s, 10, 64)
	t, err2 := strconv.ParseInt(us, 10, 64)
	if err1 != nil || err2 != nil {
		logf("warning: graphile-worker child: bad job event %q", ev)
		return
	}
	(*h)(seq, time.UnixMicro(t))
}

// call sends one command and returns the value of its "ok" reply.
func (c *nodeChild) call(ctx context.Context, command string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return "", c.broken
	}
	if _, err := io.WriteString(c.stdin, command+"\n"); err != nil {
		c.broken = fmt.Errorf("graphile-worker child: writing %q: %w", command, err)
		return "", c.broken
	}
	select {
	case line := <-c.replies:
		if v, ok := strings.CutPrefix(line, "ok"); ok {
			return strings.TrimPrefix(v, " "), nil
		}
		msg, _ := strings.CutPrefix(line, "err ")
		return "", fmt.Errorf("graphile-worker %s: %s", command, msg)
	case <-c.exited:
		c.broken = fmt.Errorf("graphile-worker child exited during %q", command)
	case <-ctx.Done():
		// A late reply would be taken for the next command's.
		c.broken = fmt.Errorf("graphile-worker child: no reply to %q: %w", command, ctx.Err())
	}
	return "", c.broken
}

// cpu returns the child's CPU time so far (all its threads; 10 ms ticks).
func (c *nodeChild) cpu() time.Duration {
	c.cpuMu.Lock()
	defer c.cpuMu.Unlock()
	if d, ok := pgcpu.StatCPU(c.cmd.Process.Pid); ok {
		c.lastCPU = d
	}
	return c.lastCPU
}

// close ends the child: end of stdin asks it to stop its workers and exit;
// past ctx's deadline its process group is killed.
func (c *nodeChild) close(ctx context.Context) {
	_ = c.stdin.Close()
	select {
	case <-c.exited:
	case <-ctx.Done():
		logf("warning: graphile-worker child did not exit in time; killing it")
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
	_ = c.cmd.Wait()
}
