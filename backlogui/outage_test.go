package backlogui_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestDatabaseUnreachable: when the database refuses connections (a
// restart, a failover), every page, its live refresh and every action
// answer 503 Service Unavailable with a Retry-After header and a body that
// says the database is unreachable and to retry, not 409 Conflict, which
// would blame the operator's request. The pool's connections are dialed
// through a switch: on for the CSRF token, then off, where each dial is a
// real one to a closed port.
func TestDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var down atomic.Bool
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.MaxConns = 2
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			network, addr = "tcp", "127.0.0.1:1"
		}
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	q, err := backlog.New(ctx, pool, backlog.WithSchema(testdb.Schema(t)), backlog.WithLogger(quiet()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.NoError(t, q.Migrate(ctx))
	srv := httptest.NewServer(backlogui.NewHandler(q, backlogui.WithLogger(quiet())))
	t.Cleanup(srv.Close)
	u := &ui{t: t, q: q, srv: srv, client: newClient()}
	token := u.csrf()

	down.Store(true)
	pool.Reset() // the idle connections go; every new one is refused

	check := func(what string, resp *http.Response, body string) {
		t.Helper()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s: %s", what, body)
		secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		require.NoError(t, err, "%s: Retry-After %q", what, resp.Header.Get("Retry-After"))
		require.Positive(t, secs, what)
		require.Contains(t, body, "The database is unreachable", what)
		require.Contains(t, body, "retry", what)
		require.Contains(t, body, "127.0.0.1", what) // the cause, for the operator
	}
	id := backlog.NewID().String()
	for _, p := range []string{"/", "/?range=day", "/jobs", "/jobs/" + id, "/jobs/confirm?action=retry&state=failed",
		"/types", "/types/limits?type=x", "/schedules", "/processes"} {
		resp, body := send(t, u.client, srv.URL, http.MethodGet, "", p, nil)
		check("GET "+p, resp, body)
		resp, body = send(t, u.client, srv.URL, http.MethodGet, "", p, nil, "X-Backlog-Live", "1")
		check("GET "+p+" (live)", resp, body)
	}
	for _, a := range []struct {
		path string
		form url.Values
	}{
		{"/jobs/action", url.Values{"action": {"retry"}, "id": {id}}},
		{"/jobs/action", url.Values{"action": {"cancel"}, "id": {id, backlog.NewID().String()}}},
		{"/jobs/action", url.Values{"action": {"delete"}, "id": {id}}},
		{"/jobs/bulk", url.Values{"action": {"cancel"}, "filter": {"state=available"}}},
		{"/types/action", url.Values{"action": {"pause"}, "type": {"x"}}},
		{"/types/limits", url.Values{"action": {"set"}, "step": {"review"}, "type": {"x"}, "concurrency": {"2"}}},
		{"/types/limits", url.Values{"action": {"remove"}, "step": {"apply"}, "type": {"x"}}},
	} {
		a.form.Set("csrf", token)
		resp, body := send(t, u.client, srv.URL, http.MethodPost, "", a.path, a.form)
		check("POST "+a.path+" "+a.form.Encode(), resp, body)
		if len(a.form["id"]) > 1 {
			require.Contains(t, body, "cancel stopped after 0 of 2 job(s)") // not one refusal per job
		}
	}
}
