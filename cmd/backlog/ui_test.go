package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freePort returns a TCP port free on loopback a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// startUI starts `backlog ui` with args and returns the command, the first
// line it printed on stdout and its stderr so far (read until that line).
func (c *cli) startUI(args ...string) (*exec.Cmd, string, *strings.Builder) {
	c.t.Helper()
	cmd := exec.Command(binary, append([]string{"--schema", c.schema, "ui"}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	stderr := new(strings.Builder) // read once the command exited
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		c.t.Fatalf("backlog ui printed no line (%v); stderr:\n%s", err, stderr)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return cmd, strings.TrimSpace(line), stderr
}

// waitOK polls GET url until 200 OK, for at most 10 seconds, and returns
// the response with its body.
func waitOK(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return resp, string(body)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET %s: no 200 OK in 10s (last: %v %v)", url, resp, err)
		case <-tick.C:
		}
	}
}

// stopUI sends sig and checks the command exits 0.
func stopUI(t *testing.T, cmd *exec.Cmd, sig os.Signal) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("backlog ui after %v: %v, want exit 0", sig, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("backlog ui did not stop within 10s of %v", sig)
	}
}

func TestUI(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	port := strconv.Itoa(freePort(t))
	cmd, line, stderr := c.startUI("--addr", "127.0.0.1:"+port)
	url := "http://127.0.0.1:" + port + "/"
	if line != "serving the dashboard on "+url {
		t.Fatalf("stdout's first line %q, want the URL %s", line, url)
	}
	resp, body := waitOK(t, url)
	if strings.Contains(body, "read-only") {
		t.Fatal("the dashboard is read-only without --read-only")
	}
	if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Fatalf("X-Content-Type-Options %q, want nosniff", got)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
	stopUI(t, cmd, syscall.SIGINT)
	if strings.Contains(stderr.String(), "warning") {
		t.Fatalf("a loopback address warned:\n%s", stderr)
	}
}

func TestUIBasePathReadOnly(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	port := strconv.Itoa(freePort(t))
	cmd, line, _ := c.startUI("--addr", "127.0.0.1:"+port, "--base-path", "/admin/queue/", "--read-only")
	url := "http://127.0.0.1:" + port + "/admin/queue/"
	if line != "serving the dashboard on "+url {
		t.Fatalf("stdout's first line %q, want the URL %s", line, url)
	}
	_, body := waitOK(t, url+"types")
	if !strings.Contains(body, "read-only") || !strings.Contains(body, `href="/admin/queue/jobs`) {
		t.Fatalf("the types page under --base-path --read-only:\n%s", body)
	}
	resp, _ := waitOK(t, "http://127.0.0.1:"+port+"/admin/queue") // redirected
	if resp.Request.URL.Path != "/admin/queue/" {
		t.Fatalf("GET /admin/queue ended at %s", resp.Request.URL)
	}
	stopUI(t, cmd, syscall.SIGINT)
}

func TestUINotLoopback(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	port := strconv.Itoa(freePort(t))
	cmd, line, stderr := c.startUI("--addr", "0.0.0.0:"+port)
	if line != "serving the dashboard on http://localhost:"+port+"/" {
		t.Fatalf("stdout's first line %q", line)
	}
	waitOK(t, "http://127.0.0.1:"+port+"/")
	stopUI(t, cmd, syscall.SIGTERM)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if !strings.HasPrefix(lines[0], "backlog: warning: ") || !strings.Contains(lines[0], "without authentication") {
		t.Fatalf("stderr's first line %q, want the warning\nstderr:\n%s", lines[0], stderr)
	}
}

func TestUIBadUsage(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, addr := range []string{"nope", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1"} {
		c.fail(exitUsage, "--addr", "ui", "--addr", addr)
	}
	c.fail(exitUsage, "--base-path", "ui", "--base-path", "admin")
	c.fail(exitFailure, "not migrated", "ui", "--addr", "127.0.0.1:0")
	c.ok("migrate", "up")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	c.fail(exitFailure, "listening on "+taken.Addr().String()+": bind: address already in use", "ui", "--addr", taken.Addr().String())
	down := "DATABASE_URL=postgres://root@127.0.0.1:1/test?connect_timeout=5"
	out, errs, code := c.runEnv([]string{down}, "ui", "--addr", "127.0.0.1:0")
	c.checkFail([]string{"ui"}, out, errs, code, exitFailure, "cannot reach PostgreSQL at 127.0.0.1:1")
}
