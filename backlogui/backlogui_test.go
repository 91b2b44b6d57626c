package backlogui_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/backlogui/internal/seed"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/internal/worktest"
)

func TestMain(m *testing.M) {
	if err := testdb.Ping(); err != nil {
		os.Stderr.WriteString("backlogui tests: no PostgreSQL at $DATABASE_URL (" + err.Error() + "); skipping. `make test` finds or starts one.\n")
		if os.Getenv("BACKLOG_CI") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// ui is one test's queue, seeded, and the dashboard in front of it.
type ui struct {
	t      *testing.T
	q      *backlog.Queue
	jobs   *seed.Jobs
	srv    *httptest.Server
	client *http.Client
	base   string
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newUI seeds a fresh schema, works the seed's jobs until each is in its
// state, and serves the dashboard.
func newUI(t *testing.T, opts ...backlogui.Option) *ui {
	t.Helper()
	ctx := context.Background()
	q, err := backlog.New(ctx, testdb.Pool(t), backlog.WithSchema(testdb.Schema(t)),
		backlog.WithWorkerID("ui-test-worker"), backlog.WithLogger(testLogger(t)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.NoError(t, q.Migrate(ctx))
	jobs, err := seed.Enqueue(ctx, q, 2)
	require.NoError(t, err)
	release := make(chan struct{})
	worktest.Run(t, func(ctx context.Context) error {
		return q.Work(ctx, seed.Handler(release), backlog.Types(seed.Worked...), seed.WorkerTags, backlog.Concurrency(4))
	})
	// After worktest.Run's cleanup is registered, so that it runs first
	// (last in, first out): the slow job returns at once, and Work's stop
	// does not wait out its grace period for it.
	t.Cleanup(func() { close(release) })
	u := &ui{t: t, q: q, jobs: jobs}
	waitState(t, q, jobs.Running[0], backlog.StateRunning)
	for _, id := range append(jobs.Failed, jobs.XSS...) {
		waitState(t, q, id, backlog.StateFailed)
	}
	for _, id := range jobs.Completed {
		waitState(t, q, id, backlog.StateCompleted)
	}
	// Cancelled jobs are counted once maintenance has moved them to the
	// history.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		if st.ByState[backlog.StateCancelled] == 1 {
			break
		}
		require.False(t, time.Now().After(deadline), "the cancelled job is not counted after 10s")
		<-time.After(20 * time.Millisecond)
	}
	opts = append([]backlogui.Option{backlogui.WithLogger(quiet())}, opts...)
	u.srv = httptest.NewServer(backlogui.NewHandler(q, opts...))
	t.Cleanup(u.srv.Close)
	u.client = newClient()
	return u
}

// newClient is a browser-like client: cookies kept, redirects not followed.
func newClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func waitState(t *testing.T, q *backlog.Queue, id uuid.UUID, want backlog.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := q.Job(context.Background(), id)
		require.NoError(t, err)
		if info.State == want {
			return
		}
		if time.Now().After(deadline) {
			page, _ := q.List(context.Background(), backlog.Filter{}, backlog.ListOptions{})
			for _, j := range page.Jobs {
				t.Logf("%s %s %s attempt %d err %q", j.ID, j.Type, j.State, j.Attempt, j.LastError)
			}
			t.Fatalf("job %s (%s): %s, not %s, after 10s", id, info.Type, info.State, want)
		}
		<-tick.C
	}
}

func (u *ui) state(id uuid.UUID) backlog.State {
	u.t.Helper()
	info, err := u.q.Job(context.Background(), id)
	require.NoError(u.t, err)
	return info.State
}

// get fetches a page and returns its status and body.
func (u *ui) get(path string) (int, string) {
	u.t.Helper()
	resp, err := u.client.Get(u.srv.URL + u.base + path)
	require.NoError(u.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(u.t, err)
	return resp.StatusCode, string(b)
}

func (u *ui) page(path string) string {
	u.t.Helper()
	status, body := u.get(path)
	require.Equal(u.t, http.StatusOK, status, "GET %s: %s", path, body)
	return body
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf loads a page and returns its form token.
func (u *ui) csrf() string {
	u.t.Helper()
	m := csrfRe.FindStringSubmatch(u.page("/jobs"))
	require.NotNil(u.t, m, "no CSRF token on the jobs page")
	return m[1]
}

// post sends a form (with a CSRF token unless it has one) and returns the
// response status, Location and body.
func (u *ui) post(path string, form url.Values, header ...string) (int, string, string) {
	u.t.Helper()
	req, err := http.NewRequest(http.MethodPost, u.srv.URL+u.base+path, strings.NewReader(form.Encode()))
	require.NoError(u.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := u.client.Do(req)
	require.NoError(u.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

func (u *ui) act(path string, form url.Values) (int, string, string) {
	form.Set("csrf", u.csrf())
	return u.post(path, form)
}

func TestPagesRender(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	ov := u.page("/")
	require.Contains(t, ov, `data-count="failed">3<`) // 2 + the XSS job
	require.Contains(t, ov, `data-count="running">1<`)
	require.Contains(t, ov, `data-count="completed">3<`)
	require.Contains(t, ov, `data-count="cancelled">1<`)
	require.Contains(t, ov, `data-count="available">3<`) // 2 emails + the paused type's
	require.Contains(t, ov, "<svg class=\"chart\"")
	require.Contains(t, ov, `<tr data-type="newsletter.send">`)
	require.Regexp(t, `newsletter.send</a></th>(.|\n)*?badge-paused`, ov)
	require.Contains(t, u.page("/?range=day"), "per hour")
	// Every page names the schema it shows, in its title and header.
	schema := u.q.Schema()
	require.Contains(t, ov, "<title>Overview · "+schema+" · backlog</title>")
	require.Contains(t, ov, `<span class="schema" title="The queue's PostgreSQL schema">schema <code>`+schema+`</code></span>`)
	require.Contains(t, u.page("/processes"), "<code>"+schema+"</code>")

	jobs := u.page("/jobs?state=failed")
	require.Contains(t, jobs, u.jobs.Failed[0].String())
	require.NotContains(t, jobs, u.jobs.Completed[0].String())
	require.Contains(t, jobs, "card declined")
	require.Contains(t, u.page("/jobs?type="+seed.TypeSync+"&okey="+seed.ChainKey+"&order=oldest"), u.jobs.Chain[2].String())
	require.Contains(t, u.page("/jobs?tags=region%3Deu"), u.jobs.Failed[1].String())
	require.NotContains(t, u.page("/jobs?tags=region%3Deu"), u.jobs.Completed[1].String())
	require.Contains(t, u.page("/jobs?error=declined&created_after=2000-01-01T00:00"), u.jobs.Failed[0].String())
	require.Contains(t, u.page("/jobs?limit=1"), "Next page")

	detail := u.page("/jobs/" + u.jobs.DAGMid.String())
	require.Contains(t, detail, `<svg class="graph"`)
	require.Contains(t, detail, "/jobs/"+u.jobs.DAGRoot.String())
	require.Contains(t, detail, "/jobs/"+u.jobs.DAGLeaf.String())
	chain := u.page("/jobs/" + u.jobs.Chain[1].String())
	require.Contains(t, chain, "Ordering key chain")
	require.Contains(t, chain, "/jobs/"+u.jobs.Chain[0].String())
	running := u.page("/jobs/" + u.jobs.Running[0].String())
	require.Contains(t, running, "Lease holder")
	require.Contains(t, running, "ui-test-worker")
	require.Regexp(t, `<tr class="att-now" data-attempt="1" data-outcome="running">(.|\n)*?ui-test-worker`, running)
	failed := u.page("/jobs/" + u.jobs.Failed[0].String())
	require.Contains(t, failed, "at billing.Charge")
	require.Contains(t, failed, `&#34;amount_cents&#34;: 4999`)
	require.Contains(t, u.page("/jobs/"+u.jobs.Completed[0].String()), `&#34;pixels&#34;: 1024`)
	// Progress is read, not shown as JSON: a bar and its counts.
	done := u.page("/jobs/" + u.jobs.Completed[0].String())
	require.Contains(t, done, `<div class="progress" id="progress"><progress max="100" value="100">100%</progress> <span class="pct">100%</span> <span class="muted">(16 of 16 tiles)</span>`)
	// The attempts: the successful one from the job's own record.
	require.Regexp(t, `<tr class="att-ok" data-attempt="1" data-outcome="completed">\s*<td class="n">1</td>\s*<td><span class="outcome">completed</span></td>\s*<td class="mono">ui-test-worker</td>\s*<td><time datetime="[^"]+"[^>]*>[^<]+</time></td>\s*<td class="n">\d+(\.\d+)?m?s</td>`, done)
	require.Regexp(t, `<tr class="att-bad" data-attempt="1" data-outcome="error">(.|\n)*?ui-test-worker(.|\n)*?card declined`, failed)
	list := u.page("/jobs?state=completed")
	require.Contains(t, list, `<span class="prog" title="Progress"><progress max="100" value="100">100%</progress> <span class="pct">100%</span> <span class="muted">(16 of 16 tiles)</span></span>`)
	require.NotContains(t, list, `&#34;tiles&#34;`)
	// The args column: compact, cut, escaped.
	require.Contains(t, list, `<th scope="col">Args</th>`)
	require.Contains(t, list, `{&#34;size&#34;:[640,480],&#34;image&#34;:&#34;photos/0.jpg&#34;}`)
	// A running job's progress shows once a lease renewal wrote it.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(u.page("/jobs/"+u.jobs.Running[0].String()), `<span class="pct">25%</span> <span class="muted">(1,200 of 4,800 frames)</span>`) {
		require.False(t, time.Now().After(deadline), "the running job's progress is not shown after 10s")
		<-time.After(20 * time.Millisecond)
	}

	ck, err := u.q.Enqueue(context.Background(), seed.TypeEmail, nil, backlog.ConcurrencyKey("tenant-9"))
	require.NoError(t, err)
	require.Contains(t, u.page("/jobs?ckey=tenant-9"), ck.String())
	require.NotContains(t, u.page("/jobs?ckey=tenant-9"), u.jobs.Available[0].String())
	require.Contains(t, u.page("/jobs/"+ck.String()), `href="/jobs?ckey=tenant-9"`)

	types := u.page("/types")
	require.Contains(t, types, `<tr data-type="`+seed.TypePausable+`">`)
	require.Regexp(t, `newsletter.send(.|\n)*?value="resume"`, types)
	// Wait and run time percentiles of the completed type, over the last
	// hour and day; none for a type whose jobs never finished.
	require.Regexp(t, `<tr data-type="`+seed.TypeOK+`">(.|\n)*?<td class="n lat" data-lat="run"><span class="pct-line" data-range="1h"><span class="muted">1h</span> \d[^ ]*s · \d[^ ]*s</span><br><span class="pct-line" data-range="24h"><span class="muted">24h</span> \d[^ ]*s · \d[^ ]*s</span>`, types)
	require.Regexp(t, `<tr data-type="`+seed.TypeEmail+`">(.|\n)*?<td class="n lat" data-lat="wait"><span class="pct-line" data-range="1h"><span class="muted">1h</span> —</span>`, types)
	require.Contains(t, types, `href="/types/limits?type=`+seed.TypeOK+`"`)
	require.Contains(t, u.page("/schedules"), seed.Schedule)
	procs := u.page("/processes")
	require.Contains(t, procs, "ui-test-worker")
	require.Contains(t, procs, u.jobs.Running[0].String()[24:])

	// A refresh gets the live part only.
	req, _ := http.NewRequest(http.MethodGet, u.srv.URL+"/", nil)
	req.Header.Set("X-Backlog-Live", "1")
	resp, err := u.client.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NotContains(t, string(b), "<html")
	require.Contains(t, string(b), `data-count="failed"`)

	// Static assets.
	require.Contains(t, u.page("/assets/app.js"), "X-Backlog-Live")
	require.Contains(t, u.page("/assets/style.css"), "prefers-color-scheme")
}

// TestJobPageShowsFinishedGraph: the job page draws the graph around
// finished jobs too, each node in its final state (a completed chain, a
// failed prerequisite and the dependent it cancelled), and a prerequisite
// whose row is gone as deleted, without a link.
func TestJobPageShowsFinishedGraph(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	ctx := context.Background()
	enq := func(typ string, opts ...backlog.EnqueueOption) uuid.UUID {
		t.Helper()
		id, err := u.q.Enqueue(ctx, typ, nil, opts...)
		require.NoError(t, err)
		return id
	}
	// The seed's worker completes TypeOK, fails TypeFail and leaves
	// TypeEmail available.
	a := enq(seed.TypeOK, backlog.Tags{"tenant": "acme"})
	b := enq(seed.TypeOK, backlog.Tags{"tenant": "acme"}, backlog.DependsOn(a))
	c := enq(seed.TypeEmail, backlog.DependsOn(b))
	f := enq(seed.TypeFail, backlog.Tags{"region": "eu"}, backlog.MaxAttempts(1))
	g := enq(seed.TypeEmail, backlog.DependsOn(f))
	waitState(t, u.q, b, backlog.StateCompleted)
	waitState(t, u.q, c, backlog.StateAvailable)
	waitState(t, u.q, g, backlog.StateCancelled)

	node := func(page string, id uuid.UUID, state backlog.State) {
		t.Helper()
		re := regexp.MustCompile(`<a href="/jobs/` + id.String() + `" class="gnode"><title>[^<]* \(` + string(state) + `\) `)
		require.Regexp(t, re, page)
	}
	page := u.page("/jobs/" + b.String())
	require.NotContains(t, page, "No prerequisites or dependents")
	node(page, a, backlog.StateCompleted)
	node(page, c, backlog.StateAvailable)
	node(u.page("/jobs/"+a.String()), b, backlog.StateCompleted)
	node(u.page("/jobs/"+f.String()), g, backlog.StateCancelled)
	node(u.page("/jobs/"+g.String()), f, backlog.StateFailed)

	require.NoError(t, u.q.Delete(ctx, a))
	page = u.page("/jobs/" + b.String())
	require.NotContains(t, page, `href="/jobs/`+a.String()+`"`)
	require.Contains(t, page, `<g class="gnode gdeleted"><title>`+seed.TypeOK+` (deleted: no longer kept) `+a.String()[24:]+`</title>`)
	require.Contains(t, page, "deleted · "+a.String()[24:])

	// A job alone says so.
	require.Contains(t, u.page("/jobs/"+u.jobs.Available[0].String()), "No prerequisites or dependents.")
}

func TestFlowControlShown(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	ctx := context.Background()
	require.NoError(t, u.q.SetLimit(ctx, seed.TypeEmail, backlog.Limit{Concurrency: 10, KeyConcurrency: 2}))
	require.NoError(t, u.q.SetLimit(ctx, "export.report", backlog.Limit{Rate: 100, Per: time.Second, Burst: 5, RatePerKey: true}))
	require.NoError(t, u.q.SetLimit(ctx, seed.XSSType, backlog.Limit{Rate: 5, Per: 90 * time.Minute, Burst: 1}))

	// The types page: each limited type's limits, a limited type without
	// jobs included, "none" for the others.
	types := u.page("/types")
	require.Contains(t, types, "<th scope=\"col\">Limits</th>")
	require.Regexp(t, `<tr data-type="email.send">(.|\n)*?<li>concurrency 10</li><li>2 per concurrency key</li></ul>`, types)
	require.Regexp(t, `<tr data-type="export.report">(.|\n)*?<li>rate 100/1s, burst 5, per key</li>`, types)
	require.Regexp(t, `<tr data-type="&lt;script&gt;alert\(&#34;type&#34;\)&lt;/script&gt;">(.|\n)*?<li>rate 5/1h30m, burst 1</li>`, types)
	require.Regexp(t, `<tr data-type="`+seed.TypeOK+`">(.|\n)*?<span class="muted">none</span>`, types)
	require.NotContains(t, types, "<script>alert")
	// The live refresh carries them too.
	req, _ := http.NewRequest(http.MethodGet, u.srv.URL+"/types", nil)
	req.Header.Set("X-Backlog-Live", "1")
	resp, err := u.client.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(b), "<li>rate 100/1s, burst 5, per key</li>")

	// The job page: the concurrency key with the job's other keys, each a
	// link to the jobs that share it, escaped.
	id, err := u.q.Enqueue(ctx, seed.TypeEmail, nil, backlog.OrderingKey("acct-<b>7</b>"),
		backlog.UniqueKey(`welcome"><img src=x>`), backlog.ConcurrencyKey(`<script>alert(8)</script>`))
	require.NoError(t, err)
	detail := u.page("/jobs/" + id.String())
	require.Contains(t, detail, `<dt>Ordering key</dt><dd><a href="/jobs?okey=acct-%3Cb%3E7%3C%2Fb%3E">acct-&lt;b&gt;7&lt;/b&gt;</a></dd>`)
	require.Contains(t, detail, `<dt>Unique key</dt><dd><a href="/jobs?ukey=welcome%22%3E%3Cimg&#43;src%3Dx%3E">welcome&#34;&gt;&lt;img src=x&gt;</a></dd>`)
	require.Contains(t, detail, `<dt>Concurrency key</dt><dd><a href="/jobs?ckey=%3Cscript%3Ealert%288%29%3C%2Fscript%3E">&lt;script&gt;alert(8)&lt;/script&gt;</a></dd>`)
	require.NotContains(t, detail, "<script>alert(8)")
	require.NotContains(t, detail, "<img src=x>")
	// A job without keys shows none.
	require.Regexp(t, `<dt>Concurrency key</dt><dd>—</dd>`, u.page("/jobs/"+u.jobs.Available[0].String()))
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	for _, p := range []string{"/", "/jobs", "/nope", "/jobs?state=bogus"} {
		resp, err := u.client.Get(u.srv.URL + p)
		require.NoError(t, err)
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", p)
		require.Contains(t, csp, "frame-ancestors 'none'", p)
		require.NotContains(t, csp, "unsafe-inline", p)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), p)
		require.NotEmpty(t, resp.Header.Get("Referrer-Policy"), p)
	}
}

func TestXSSPayloadsRenderAsText(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	// Every page that shows a string a user or an application chose: job
	// types, args, tags, errors, keys, schedule names and types, filters.
	for _, p := range []string{"/", "/jobs", "/jobs?state=failed", "/jobs/" + u.jobs.XSS[0].String(), "/types", "/processes",
		"/schedules", "/jobs?type=" + url.QueryEscape(seed.XSSType), "/jobs?error=" + url.QueryEscape(seed.XSSError),
		"/jobs?tags=" + url.QueryEscape("x="+seed.XSSTag), "/jobs?okey=" + url.QueryEscape(seed.XSSArg),
		"/jobs/confirm?action=retry&type=" + url.QueryEscape(seed.XSSType) + "&error=" + url.QueryEscape(seed.XSSError)} {
		body := u.page(p)
		for _, raw := range []string{"<script>alert", "<img src=x", `"><img`, `"><script`} {
			require.NotContains(t, body, raw, "page %s", p)
		}
	}
	// The schedules page shows the schedule's name and job type, as text.
	schedules := u.page("/schedules")
	require.Contains(t, schedules, `<th scope="row">&lt;img src=x onerror=alert(4)&gt;`)
	require.Contains(t, schedules, `<td class="jtype">&#34;&gt;&lt;script&gt;alert(5)&lt;/script&gt;</td>`)
	require.Contains(t, schedules, `jobs of &#34;&gt;&lt;script&gt;alert(5)&lt;/script&gt;</a>`)
	detail := u.page("/jobs/" + u.jobs.XSS[0].String())
	require.Contains(t, detail, "&lt;script&gt;alert(&#34;type&#34;)&lt;/script&gt;")
	require.Contains(t, detail, "&lt;img src=x onerror=alert(3)&gt;")
	require.Contains(t, detail, "&lt;script&gt;alert(2)&lt;/script&gt;")
	// A bad parameter echoed in an error page is escaped too.
	status, body := u.get("/jobs?state=" + url.QueryEscape(`<script>alert(9)</script>`))
	require.Equal(t, http.StatusBadRequest, status)
	require.NotContains(t, body, "<script>alert(9)")
}

func TestActions(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	ctx := context.Background()

	// Retry one failed job: it runs again (and completes).
	status, loc, body := u.act("/jobs/action", url.Values{"action": {"retry"}, "id": {u.jobs.Failed[0].String()},
		"back": {"/jobs?state=failed"}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Equal(t, "/jobs?state=failed", loc)
	info, err := u.q.Job(ctx, u.jobs.Failed[0])
	require.NoError(t, err)
	require.NotEqual(t, backlog.StateFailed, info.State)
	require.Contains(t, u.page("/jobs"), "retry: 1 job(s) done.") // the flash message
	waitState(t, u.q, u.jobs.Failed[0], backlog.StateCompleted)

	// Cancel two available jobs at once.
	status, _, body = u.act("/jobs/action", url.Values{"action": {"cancel"}, "id": {u.jobs.Available[0].String(), u.jobs.Available[1].String()}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Equal(t, backlog.StateCancelled, u.state(u.jobs.Available[0]))
	require.Equal(t, backlog.StateCancelled, u.state(u.jobs.Available[1]))

	// Delete a cancelled job.
	status, _, body = u.act("/jobs/action", url.Values{"action": {"delete"}, "id": {u.jobs.Cancelled[0].String()}})
	require.Equal(t, http.StatusSeeOther, status, body)
	_, err = u.q.Job(ctx, u.jobs.Cancelled[0])
	require.ErrorIs(t, err, backlog.ErrNotFound)

	// A refused action (retrying a running job) is reported, not a 500.
	status, _, _ = u.act("/jobs/action", url.Values{"action": {"retry"}, "id": {u.jobs.Running[0].String()}})
	require.Equal(t, http.StatusSeeOther, status)
	require.Contains(t, u.page("/"), "the job is running")

	// Retry everything matching a filter, after a confirmation with the count.
	confirm := u.page("/jobs/confirm?action=retry&state=failed&type=" + seed.TypeFail)
	require.Contains(t, confirm, `<strong id="confirm-count">1</strong>`)
	m := regexp.MustCompile(`name="filter" value="([^"]*)"`).FindStringSubmatch(confirm)
	require.NotNil(t, m)
	status, loc, body = u.act("/jobs/bulk", url.Values{"action": {"retry"}, "filter": {strings.ReplaceAll(m[1], "&amp;", "&")}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Contains(t, loc, "/jobs?")
	require.Contains(t, u.page("/jobs"), "retry: 1 matching job(s) done.")
	waitState(t, u.q, u.jobs.Failed[1], backlog.StateCompleted)
	require.Equal(t, backlog.StateFailed, u.state(u.jobs.XSS[0])) // not of the filter's type

	// Cancel all and delete all.
	status, _, body = u.act("/jobs/bulk", url.Values{"action": {"cancel"}, "filter": {"okey=" + seed.ChainKey}})
	require.Equal(t, http.StatusSeeOther, status, body)
	for _, id := range u.jobs.Chain {
		require.Equal(t, backlog.StateCancelled, u.state(id))
	}
	status, _, body = u.act("/jobs/bulk", url.Values{"action": {"delete"}, "filter": {"okey=" + seed.ChainKey}})
	require.Equal(t, http.StatusSeeOther, status, body)
	_, err = u.q.Job(ctx, u.jobs.Chain[0])
	require.ErrorIs(t, err, backlog.ErrNotFound)

	// Pause and resume a type.
	status, _, body = u.act("/types/action", url.Values{"action": {"pause"}, "type": {seed.TypePausable}, "back": {"/types"}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Contains(t, pausedTypes(t, u.q), seed.TypePausable)
	status, _, body = u.act("/types/action", url.Values{"action": {"resume"}, "type": {seed.TypePaused}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.NotContains(t, pausedTypes(t, u.q), seed.TypePaused)
	waitState(t, u.q, u.jobs.Paused, backlog.StateAvailable) // resumed, still no worker for it

	// A redirect never leaves the dashboard.
	status, loc, _ = u.act("/types/action", url.Values{"action": {"resume"}, "type": {seed.TypePausable}, "back": {"//evil.example/x"}})
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, "/", loc)
}

func pausedTypes(t *testing.T, q *backlog.Queue) []string {
	t.Helper()
	ps, err := q.Paused(context.Background())
	require.NoError(t, err)
	var out []string
	for _, p := range ps {
		out = append(out, p.Type)
	}
	return out
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	u := newUI(t, backlogui.WithReadOnly(true))
	for _, p := range []string{"/", "/jobs", "/jobs/" + u.jobs.Failed[0].String(), "/types"} {
		body := u.page(p)
		require.NotContains(t, body, `method="post"`, p)
		require.NotContains(t, body, `name="csrf"`, p)
	}
	status, _ := u.get("/jobs/confirm?action=retry&state=failed")
	require.Equal(t, http.StatusForbidden, status)
	for _, a := range []struct {
		path string
		form url.Values
	}{
		{"/jobs/action", url.Values{"action": {"retry"}, "id": {u.jobs.Failed[0].String()}}},
		{"/jobs/bulk", url.Values{"action": {"retry"}, "filter": {"state=failed"}}},
		{"/types/action", url.Values{"action": {"pause"}, "type": {seed.TypeOK}}},
	} {
		status, _, body := u.post(a.path, a.form)
		require.Equal(t, http.StatusForbidden, status, a.path)
		require.Contains(t, body, "read-only")
	}
	require.Equal(t, backlog.StateFailed, u.state(u.jobs.Failed[0]))
	require.Empty(t, pausedTypes(t, u.q)[1:]) // only the seed's paused type
}

func TestAuthorizeDenial(t *testing.T) {
	t.Parallel()
	var asked []string
	u := newUI(t, backlogui.WithAuthorize(func(r *http.Request, action string) error {
		asked = append(asked, action)
		if action == backlogui.ActionResume {
			return nil
		}
		return errors.New("only on-call may " + action)
	}))
	for _, a := range []struct {
		path, action string
		form         url.Values
	}{
		{"/jobs/action", backlogui.ActionRetry, url.Values{"action": {"retry"}, "id": {u.jobs.Failed[0].String()}}},
		{"/jobs/action", backlogui.ActionCancel, url.Values{"action": {"cancel"}, "id": {u.jobs.Available[0].String()}}},
		{"/jobs/action", backlogui.ActionDelete, url.Values{"action": {"delete"}, "id": {u.jobs.Completed[0].String()}}},
		{"/jobs/bulk", backlogui.ActionRetryAll, url.Values{"action": {"retry"}, "filter": {"state=failed"}}},
		{"/jobs/bulk", backlogui.ActionCancelAll, url.Values{"action": {"cancel"}, "filter": {""}}},
		{"/jobs/bulk", backlogui.ActionDeleteAll, url.Values{"action": {"delete"}, "filter": {""}}},
		{"/types/action", backlogui.ActionPause, url.Values{"action": {"pause"}, "type": {seed.TypeOK}}},
	} {
		status, _, body := u.act(a.path, a.form)
		require.Equal(t, http.StatusForbidden, status, a.action)
		require.Contains(t, body, "only on-call may "+a.action)
	}
	require.Equal(t, []string{"retry", "cancel", "delete", "retry-all", "cancel-all", "delete-all", "pause"}, asked)
	require.Equal(t, backlog.StateFailed, u.state(u.jobs.Failed[0]))
	require.Equal(t, backlog.StateAvailable, u.state(u.jobs.Available[0]))
	require.Equal(t, backlog.StateCompleted, u.state(u.jobs.Completed[0]))
	status, _, body := u.act("/types/action", url.Values{"action": {"resume"}, "type": {seed.TypePaused}})
	require.Equal(t, http.StatusSeeOther, status, body)
}

func TestCSRFRejected(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	retry := func() url.Values { return url.Values{"action": {"retry"}, "id": {u.jobs.Failed[0].String()}} }
	token := u.csrf()

	status, _, body := u.post("/jobs/action", retry()) // no token
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, "CSRF")
	f := retry()
	f.Set("csrf", token+"x")
	status, _, _ = u.post("/jobs/action", f) // wrong token
	require.Equal(t, http.StatusForbidden, status)
	f.Set("csrf", token)
	status, _, _ = u.post("/jobs/action", f, "Origin", "https://evil.example") // another origin
	require.Equal(t, http.StatusForbidden, status)
	status, _, _ = u.post("/jobs/action", f, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, status)
	// A token from another browser (another cookie) does not do.
	other := &http.Client{CheckRedirect: u.client.CheckRedirect}
	req, _ := http.NewRequest(http.MethodPost, u.srv.URL+"/jobs/action", strings.NewReader(f.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "backlog_csrf", Value: "AAAAAAAAAAAAAAAAAAAAAA"})
	resp, err := other.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, backlog.StateFailed, u.state(u.jobs.Failed[0]))

	// GET never acts.
	status, _ = u.get("/jobs/action?action=retry&id=" + u.jobs.Failed[0].String())
	require.Equal(t, http.StatusBadRequest, status) // "action" is not a job ID
	require.Equal(t, backlog.StateFailed, u.state(u.jobs.Failed[0]))

	// A trusted origin (a proxy's) works.
	trusted := httptest.NewServer(backlogui.NewHandler(u.q, backlogui.WithLogger(quiet()),
		backlogui.WithTrustedOrigins("https://ops.example.com")))
	defer trusted.Close()
	tu := &ui{t: t, q: u.q, jobs: u.jobs, srv: trusted, client: newClient()}
	f2 := url.Values{"action": {"cancel"}, "id": {u.jobs.Available[0].String()}, "csrf": {tu.csrf()}}
	status, _, body = tu.post("/jobs/action", f2, "Origin", "https://ops.example.com", "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Equal(t, backlog.StateCancelled, u.state(u.jobs.Available[0]))

	// Same-origin with the token works.
	status, _, body = u.post("/jobs/action", f, "Origin", u.srv.URL, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, status, body)
}

func TestBadParams(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	for _, p := range []string{"/jobs?state=bogus", "/jobs?limit=x", "/jobs?limit=100000", "/jobs?created_after=yesterday",
		"/jobs?created_after=2026-01-02T00:00&created_before=2026-01-01T00:00", "/jobs?cursor=garbage", "/jobs?order=sideways",
		"/jobs?tags=novalue", "/jobs/not-a-uuid", "/?range=year", "/jobs/confirm?action=explode",
		"/jobs?type=" + strings.Repeat("x", 300)} {
		status, body := u.get(p)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", p, body)
		require.Contains(t, body, "400 Bad Request", p)
	}
	status, _ := u.get("/jobs/" + backlog.NewID().String())
	require.Equal(t, http.StatusNotFound, status)
	status, _ = u.get("/no/such/page")
	require.Equal(t, http.StatusNotFound, status)
	for _, f := range []url.Values{
		{"action": {"explode"}, "id": {u.jobs.Failed[0].String()}},
		{"action": {"retry"}, "id": {"nope"}},
		{"action": {"retry"}},
	} {
		status, _, body := u.act("/jobs/action", f)
		require.Equal(t, http.StatusBadRequest, status, body)
	}
	status, _, _ = u.act("/jobs/bulk", url.Values{"action": {"retry"}, "filter": {"state=bogus"}})
	require.Equal(t, http.StatusBadRequest, status)
	status, _, body := u.act("/jobs/bulk", url.Values{"action": {"retry"}, "filter": {"state=running"}})
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "can be retried")
	status, _, _ = u.act("/types/action", url.Values{"action": {"pause"}})
	require.Equal(t, http.StatusBadRequest, status)
}

func TestBasePath(t *testing.T) {
	t.Parallel()
	u := newUI(t, backlogui.WithBasePath("/admin/queue/"))
	u.base = "/admin/queue"
	body := u.page("/")
	require.Contains(t, body, `href="/admin/queue/assets/style.css"`)
	require.Contains(t, body, `href="/admin/queue/jobs?state=failed"`)
	require.Contains(t, u.page("/jobs/"+u.jobs.Failed[0].String()), `action="/admin/queue/jobs/action"`)
	status, loc, body := u.act("/jobs/action", url.Values{"action": {"retry"}, "id": {u.jobs.Failed[0].String()}, "back": {"/jobs"}})
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Equal(t, "/admin/queue/jobs", loc)

	// Behind http.StripPrefix, in the user's own mux.
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", backlogui.NewHandler(u.q, backlogui.WithBasePath("/ops"), backlogui.WithLogger(quiet()))))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/ops/jobs?state=failed")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(b), `href="/ops/jobs/`)
}

type tw struct{ t testing.TB }

func (w tw) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func testLogger(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return quiet()
	}
	return slog.New(slog.NewTextHandler(tw{t}, nil))
}
