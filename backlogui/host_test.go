package backlogui_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/backlogui/internal/seed"
)

// send sends a request to srv with the Host header host and returns the
// response and its body.
func send(t *testing.T, client *http.Client, srv, method, host, path string, form url.Values, header ...string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, srv+path, body)
	require.NoError(t, err)
	req.Host = host
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// requireRefused checks a response to a foreign host: 421, and nothing a
// rebinding page could use (no cookie, no token, no job data).
func requireRefused(t *testing.T, resp *http.Response, body, what string) {
	t.Helper()
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "%s: %s", what, body)
	require.Empty(t, resp.Header.Values("Set-Cookie"), what)
	require.NotContains(t, body, "csrf", what)
	require.NotContains(t, body, "<", what)
	require.Contains(t, body, "WithAllowedHosts", what)
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), what)
}

// TestHostCheck replays DNS rebinding: a page of evil.example whose name
// now resolves to the dashboard's address. The handler must answer its
// requests with neither a page nor a cookie nor a token, and refuse its
// actions even with a valid token and cookie, while loopback names, the
// address a request arrived at and WithAllowedHosts' names are answered.
func TestHostCheck(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(u.srv.URL, "http://"))
	require.NoError(t, err)
	evil := "evil.example:" + port

	// Every page, asset and refresh of the foreign host is refused.
	for _, p := range []string{"/", "/jobs", "/jobs/" + u.jobs.Failed[0].String(), "/types", "/schedules", "/processes",
		"/jobs/confirm?action=retry&state=failed", "/assets/app.js", "/nope"} {
		resp, body := send(t, newClient(), u.srv.URL, http.MethodGet, evil, p, nil)
		requireRefused(t, resp, body, "GET "+p)
		resp, body = send(t, newClient(), u.srv.URL, http.MethodGet, evil, p, nil, "X-Backlog-Live", "1")
		requireRefused(t, resp, body, "refresh of "+p)
	}
	// Its action is refused even with the cookie and token a loopback page
	// gave, and an Origin that agrees with its Host.
	form := url.Values{"action": {"pause"}, "type": {seed.TypeOK}, "csrf": {u.csrf()}}
	resp, body := send(t, u.client, u.srv.URL, http.MethodPost, evil, "/types/action", form,
		"Origin", "http://"+evil, "Sec-Fetch-Site", "same-origin")
	requireRefused(t, resp, body, "POST /types/action")
	require.NotContains(t, pausedTypes(t, u.q), seed.TypeOK)

	// Names that merely contain a loopback name are foreign too.
	for _, host := range []string{"localhost.evil.example", "127.0.0.1.nip.io:" + port, "evil.example", "localhost.",
		"10.1.2.3:" + port, "[2001:db8::1]:" + port} {
		resp, body := send(t, newClient(), u.srv.URL, http.MethodGet, host, "/", nil)
		requireRefused(t, resp, body, "Host "+host)
	}
	// Loopback names are answered at any port (an SSH tunnel's).
	for _, host := range []string{"localhost:" + port, "LocalHost:9000", "localhost", "127.0.0.1:" + port, "127.8.9.10:1",
		"[::1]:" + port, "[::1]", "[::ffff:127.0.0.1]:80"} {
		resp, body := send(t, newClient(), u.srv.URL, http.MethodGet, host, "/types", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "Host %s: %s", host, body)
		require.Contains(t, body, `name="csrf"`, host)
	}
	// The same action through a loopback name goes through.
	resp, body = send(t, u.client, u.srv.URL, http.MethodPost, "127.0.0.1:"+port, "/types/action", form,
		"Origin", u.srv.URL, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	require.Contains(t, pausedTypes(t, u.q), seed.TypeOK)

	// The IP address a request arrived at is answered (a dashboard
	// listening on all interfaces, reached at 10.1.2.3), at any port (a
	// NAT's); another address is not.
	h := u.srv.Config.Handler
	for host, want := range map[string]int{"10.1.2.3:8080": 200, "10.1.2.3:9999": 200, "10.1.2.3": 200, "10.1.2.4:8080": 421,
		"ops.example.com:8080": 421} {
		req := httptest.NewRequest(http.MethodGet, "/types", nil)
		req.Host = host
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8080}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, want, rec.Code, "Host %s reaching 10.1.2.3:8080", host)
	}
}

// TestAllowedHosts: WithAllowedHosts adds names (at any port, or at the
// one given) to loopback and the local address, with or without an
// Authorize hook, which alone does not widen what is answered; "*"
// answers any host.
func TestAllowedHosts(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	serve := func(opts ...backlogui.Option) string {
		srv := httptest.NewServer(backlogui.NewHandler(u.q, append([]backlogui.Option{backlogui.WithLogger(quiet())}, opts...)...))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	var asked []string
	authorize := backlogui.WithAuthorize(func(_ *http.Request, action string) error {
		asked = append(asked, action)
		return nil
	})
	check := func(srv string, want map[string]int) {
		t.Helper()
		for host, status := range want {
			resp, body := send(t, newClient(), srv, http.MethodGet, host, "/jobs", nil)
			require.Equal(t, status, resp.StatusCode, "Host %s: %s", host, body)
		}
	}

	// An Authorize hook alone: still loopback and the local address only.
	hooked := serve(authorize)
	resp, body := send(t, newClient(), hooked, http.MethodGet, "ops.example.com", "/types", nil)
	requireRefused(t, resp, body, "a hooked handler without WithAllowedHosts")

	// A hook and a list: the listed names (a port only where given).
	listed := serve(authorize, backlogui.WithAllowedHosts("Ops.Example.com", "ops2.example.com:8443", "10.9.8.7", "[2001:db8::7]:443"))
	check(listed, map[string]int{"ops.example.com": 200, "OPS.example.COM:8080": 200, "ops2.example.com:8443": 200,
		"10.9.8.7:1": 200, "[2001:db8:0::7]:443": 200, "localhost:1": 200, "ops2.example.com": 421, "ops2.example.com:443": 421,
		"[2001:db8::7]:80": 421, "evil.example": 421, "www.ops.example.com": 421})
	// An action of the proxy's name passes every check, the hook included.
	c := newClient()
	resp, body = send(t, c, listed, http.MethodGet, "ops.example.com", "/types", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m)
	req, err := http.NewRequest(http.MethodPost, listed+"/types/action",
		strings.NewReader(url.Values{"action": {"resume"}, "type": {seed.TypePaused}, "csrf": {m[1]}}.Encode()))
	require.NoError(t, err)
	req.Host = "ops.example.com"
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://ops.example.com")
	for _, ck := range resp.Cookies() {
		req.AddCookie(ck)
	}
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, []string{backlogui.ActionResume}, asked)
	require.NotContains(t, pausedTypes(t, u.q), seed.TypePaused)

	// "*": any host.
	check(serve(backlogui.WithAllowedHosts("*")), map[string]int{"evil.example": 200, "anything:1": 200})

	for _, bad := range []string{"", "http://ops.example.com", "ops.example.com/x", "ops.example.com:0", "ops.example.com:http",
		"user@ops.example.com", "[::1", ":8080", "ops example"} {
		require.PanicsWithValue(t, "backlogui: WithAllowedHosts: "+quote(bad)+": "+reason(bad), func() {
			backlogui.NewHandler(u.q, backlogui.WithAllowedHosts(bad))
		}, bad)
	}
}

func quote(s string) string { return `"` + s + `"` }

// reason is what NewHandler says of a bad WithAllowedHosts entry.
func reason(s string) string {
	if strings.HasSuffix(s, ":0") || strings.HasSuffix(s, ":http") {
		return "the port is not a number from 1 to 65535"
	}
	return `want a host name or IP address, optionally with a port ("ops.example.com", "ops.example.com:8443", "10.0.0.5"), not a URL`
}
