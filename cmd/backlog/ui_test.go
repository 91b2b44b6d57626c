package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
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
	// Reached at another address of the machine, it answers for that
	// address (the connection's local one).
	if ip := otherAddr(t); ip != "" {
		waitOK(t, "http://"+net.JoinHostPort(ip, port)+"/")
	}
	stopUI(t, cmd, syscall.SIGTERM)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if !strings.HasPrefix(lines[0], "backlog: warning: ") || !strings.Contains(lines[0], "without authentication") {
		t.Fatalf("stderr's first line %q, want the warning\nstderr:\n%s", lines[0], stderr)
	}
}

// otherAddr returns a non-loopback IPv4 address of this machine, or "".
func otherAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Log("no non-loopback IPv4 address: the local-address check is not run")
	return ""
}

// TestUIAllowedHosts: --allowed-host adds names (at any port, or at the
// one given), and so does a host name in --addr; others are still refused.
func TestUIAllowedHosts(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	port := strconv.Itoa(freePort(t))
	cmd, _, _ := c.startUI("--addr", "localhost:"+port, "--allowed-host", "ops.example", "--allowed-host", "Ops2.Example:8443,10.9.8.7")
	base := "http://localhost:" + port
	waitOK(t, base+"/")
	for host, want := range map[string]int{"ops.example": 200, "OPS.example:" + port: 200, "ops2.example:8443": 200,
		"10.9.8.7:1234": 200, "localhost:" + port: 200, "ops2.example:" + port: 421, "ops.example.evil.example": 421,
		"evil.example:" + port: 421} {
		if resp, _ := uiRequest(t, http.MethodGet, base+"/jobs", host, ""); resp.StatusCode != want {
			t.Errorf("GET /jobs with Host %s: %s, want %d", host, resp.Status, want)
		}
	}
	stopUI(t, cmd, syscall.SIGINT)
}

func TestUIBadUsage(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, addr := range []string{"nope", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1"} {
		c.fail(exitUsage, "--addr", "ui", "--addr", addr)
	}
	c.fail(exitUsage, "--base-path", "ui", "--base-path", "admin")
	for _, h := range []string{"http://ops.example/", "ops.example:http", "ops.example:0", "[::1"} {
		c.fail(exitUsage, "--allowed-host", "ui", "--addr", "127.0.0.1:0", "--allowed-host", h)
	}
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

// uiRequest sends one request to a running `backlog ui` with the Host
// header host, and returns the response with its body.
func uiRequest(t *testing.T, method, url, host string, body string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestUIRefusesForeignHosts replays a DNS rebinding attack on `backlog ui`:
// a page of another site (evil.example) whose name now resolves to
// 127.0.0.1 reads the dashboard to get the CSRF cookie and token, then
// posts an action whose Origin and Host agree. The dashboard must answer
// such a Host with neither a page nor a cookie nor a token, and refuse the
// action even with a token that a loopback page gave.
func TestUIRefusesForeignHosts(t *testing.T) {
	t.Parallel()
	c := migrated(t)
	port := strconv.Itoa(freePort(t))
	cmd, _, _ := c.startUI("--addr", "127.0.0.1:"+port)
	base := "http://127.0.0.1:" + port
	waitOK(t, base+"/")
	evil := "evil.example:" + port

	resp, body := uiRequest(t, http.MethodGet, base+"/types", evil, "")
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("GET /types with Host %s: %s, want 421", evil, resp.Status)
	}
	if len(resp.Cookies()) > 0 || csrfRE.MatchString(body) {
		t.Errorf("GET /types with Host %s set cookies %v or carried a token", evil, resp.Cookies())
	}
	// The attack as it ran before the check: the token of this very page.
	form := url.Values{"action": {"pause"}, "type": {"report.build"}}
	if m := csrfRE.FindStringSubmatch(body); m != nil {
		form.Set("csrf", m[1])
	}
	var cookie string
	for _, ck := range resp.Cookies() {
		cookie = ck.Name + "=" + ck.Value
	}
	// Or with a token and cookie that a loopback page gave (which the
	// attacker's page could not read): the Host alone refuses it.
	if cookie == "" {
		resp, body := uiRequest(t, http.MethodGet, base+"/types", "127.0.0.1:"+port, "")
		m := csrfRE.FindStringSubmatch(body)
		if m == nil || len(resp.Cookies()) == 0 {
			t.Fatalf("the loopback page has no token or cookie:\n%s", body)
		}
		form.Set("csrf", m[1])
		cookie = resp.Cookies()[0].Name + "=" + resp.Cookies()[0].Value
	}
	resp, body = uiRequest(t, http.MethodPost, base+"/types/action", evil, form.Encode(),
		"Content-Type", "application/x-www-form-urlencoded", "Origin", "http://"+evil, "Cookie", cookie)
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("POST /types/action with Host %s: %s, want 421\n%s", evil, resp.Status, body)
	}
	if out := c.ok("paused"); strings.Contains(out, "report.build") {
		t.Errorf("a page of evil.example paused report.build:\n%s", out)
	}

	// Loopback names answer, at any port (an SSH tunnel's, say).
	for _, host := range []string{"localhost:" + port, "LOCALHOST:9999", "127.0.0.1:" + port, "127.0.0.2", "[::1]:" + port, "localhost"} {
		if resp, body := uiRequest(t, http.MethodGet, base+"/", host, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("GET / with Host %s: %s\n%s", host, resp.Status, body)
		}
	}
	for _, host := range []string{"localhost.evil.example:" + port, "127.0.0.1.nip.io:" + port, "example.com", "10.1.2.3:" + port} {
		if resp, _ := uiRequest(t, http.MethodGet, base+"/", host, ""); resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("GET / with Host %s: %s, want 421", host, resp.Status)
		}
	}
	stopUI(t, cmd, syscall.SIGINT)
}
