// Package browsertest drives the dashboard in a real headless Chromium
// (chromedp). It is its own module so that the library's go.mod never
// lists chromedp. Run it with `make test-ui`, which installs Chromium when
// it is missing (scripts/chromium.sh).
package browsertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/google/uuid"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/backlogui/internal/seed"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/internal/worktest"
)

var browser string

func TestMain(m *testing.M) {
	ci := os.Getenv("BACKLOG_CI") != ""
	skip := func(why string) {
		msg := "\n" + strings.Repeat("!", 72) + "\n!! backlogui browser tests SKIPPED: " + why + "\n" + strings.Repeat("!", 72) + "\n\n"
		os.Stderr.WriteString(msg)
		if ci {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if err := testdb.Ping(); err != nil {
		skip("no PostgreSQL at $DATABASE_URL (" + err.Error() + ")")
	}
	browser = os.Getenv("BACKLOG_CHROMIUM")
	if browser == "" {
		for _, b := range []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"} {
			if p, err := exec.LookPath(b); err == nil {
				browser = p
				break
			}
		}
	}
	if browser == "" {
		skip("no Chromium found (run scripts/chromium.sh, or set BACKLOG_CHROMIUM)")
	}
	code := m.Run()
	testdb.Close()
	os.Exit(code)
}

// env is the seeded queue, its worker, the dashboard and a browser tab.
type env struct {
	t    *testing.T
	q    *backlog.Queue
	jobs *seed.Jobs
	url  string
	ctx  context.Context

	mu      sync.Mutex
	console []string // JS errors, exceptions and dialogs seen
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	q, err := backlog.New(ctx, testdb.Pool(t), backlog.WithSchema(testdb.Schema(t)), backlog.WithLogger(quiet()),
		backlog.WithWorkerID("browser-test-worker"))
	must(t, err)
	t.Cleanup(func() { must(t, q.Close()) })
	must(t, q.Migrate(ctx))
	jobs, err := seed.Enqueue(ctx, q, 3)
	must(t, err)
	release := make(chan struct{})
	worktest.Run(t, func(ctx context.Context) error {
		return q.Work(ctx, seed.Handler(release), backlog.Types(seed.Worked...), seed.WorkerTags, backlog.Concurrency(4))
	})
	// After worktest.Run's cleanup is registered, so that it runs first
	// (last in, first out): the slow job returns at once, and Work's stop
	// does not wait out its grace period for it.
	t.Cleanup(func() { close(release) })
	e := &env{t: t, q: q, jobs: jobs}
	e.waitState(jobs.Running[0], backlog.StateRunning)
	for _, id := range append(append([]uuid.UUID{}, jobs.Failed...), jobs.XSS...) {
		e.waitState(id, backlog.StateFailed)
	}
	for _, id := range jobs.Completed {
		e.waitState(id, backlog.StateCompleted)
	}
	e.poll("the cancelled job to be counted (once moved to the history)", func() bool {
		st, err := q.Stats(ctx)
		must(t, err)
		return st.ByState[backlog.StateCancelled] == 1
	})
	srv := httptest.NewServer(backlogui.NewHandler(q, backlogui.WithLogger(quiet()), backlogui.WithRefreshInterval(500*time.Millisecond)))
	t.Cleanup(srv.Close)
	e.url = srv.URL

	// The foreign names resolve to the dashboard's address, as an
	// attacker's DNS would make them (DNS rebinding).
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 800),
		chromedp.Flag("host-resolver-rules", "MAP "+foreignHost+" 127.0.0.1, MAP "+proxyHost+" 127.0.0.1"))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelA)
	bctx, cancelB := chromedp.NewContext(actx)
	// Starts the browser (its first call must have no timeout).
	must(t, chromedp.Do(bctx))
	messages := chromedp.Console(bctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if strings.HasSuffix(m.URL, notFoundPath) || strings.Contains(m.URL, "//"+foreignHost+":") {
				continue // the 404 page and the refused host, opened on purpose
			}
			if m.Type == chromedp.ConsoleError || m.IsException() || m.Type == chromedp.ConsoleWarning && m.Source == "security" {
				e.record(m.String() + " " + m.URL)
			}
		}
	}()
	must(t, chromedp.Listen(bctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			e.record("dialog: " + d.Message)
			go func() { _, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{}) }()
		}
	}))
	t.Cleanup(func() {
		cancelB()
		<-done
	})
	tctx, cancelT := context.WithTimeout(bctx, 3*time.Minute)
	t.Cleanup(cancelT)
	e.ctx = tctx
	return e
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) record(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.console = append(e.console, s)
}

func (e *env) run(actions ...chromedp.Action[chromedp.Void]) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		e.t.Fatalf("browser: %v", err)
	}
}

func (e *env) state(id uuid.UUID) backlog.State {
	e.t.Helper()
	info, err := e.q.Job(context.Background(), id)
	must(e.t, err)
	return info.State
}

func (e *env) waitState(id uuid.UUID, want backlog.State) {
	e.t.Helper()
	e.poll(fmt.Sprintf("job %s to be %s", id, want), func() bool { return e.state(id) == want })
}

// poll waits (10 seconds at most) for cond.
func (e *env) poll(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("waited 10s for %s", what)
		}
		<-tick.C
	}
}

// open loads a page of the dashboard and waits for its main part.
func (e *env) open(path string) {
	e.t.Helper()
	e.run(chromedp.Navigate(e.url+path), chromedp.WaitReady(chromedp.CSS("main")))
}

// text returns the text of the first element matching sel, once there is
// one. It reads it in one script: the live refresh may replace the element
// between a DevTools query and a read by node ID ("No node with given
// id").
func (e *env) text(sel string) string {
	e.t.Helper()
	q := "document.querySelector(" + strconv.Quote(sel) + ")"
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](q+" !== null")); err != nil {
		e.t.Fatalf("browser: waiting for %s: %v", sel, err)
	}
	return strings.TrimSpace(eval[string](e, "("+q+" || {textContent: ''}).textContent"))
}

// click clicks the first element matching sel. When the live refresh
// replaced it between chromedp finding it and clicking it ("No node with
// given id"), no click was sent, so it tries again.
func (e *env) click(sel string) {
	e.t.Helper()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		if err == nil {
			return
		}
		if i < 5 && strings.Contains(err.Error(), "node with given id") {
			continue
		}
		e.t.Fatalf("browser: click %s: %v", sel, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](e *env, js string) T {
	e.t.Helper()
	v, err := chromedp.Run(e.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		e.t.Fatalf("browser: %s: %v", js, err)
	}
	return v
}

// scheme emulates the light or dark system setting.
func scheme(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: name}}})
		return err
	})
}

func (e *env) screenshot(full bool) []byte {
	e.t.Helper()
	a := chromedp.CaptureScreenshot()
	if full {
		a = chromedp.FullScreenshot(100)
	}
	b, err := chromedp.Run(e.ctx, a)
	if err != nil {
		e.t.Fatalf("browser: screenshot: %v", err)
	}
	return b
}

// notFoundPath is a page that does not exist.
const notFoundPath = "/no-such-page"

// foreignHost is another site's name that resolves to the dashboard's
// address; proxyHost is one the dashboard is told to answer.
const (
	foreignHost = "rebind.evil.test"
	proxyHost   = "ops.example.test"
)

// artifacts is where screenshots go (git-ignored).
const artifacts = "artifacts"

// shoot saves full-page screenshots of the current page, light and dark.
func (e *env) shoot(name string) {
	e.t.Helper()
	must(e.t, os.MkdirAll(artifacts, 0o755))
	for _, sc := range []string{"light", "dark"} {
		e.run(scheme(sc))
		must(e.t, os.WriteFile(filepath.Join(artifacts, name+"-"+sc+".png"), e.screenshot(true), 0o644))
	}
	e.run(scheme("light"))
}

// docShot writes a screenshot of docs/dashboard-reference.md (light; the viewport, or the whole
// page) when BACKLOG_UI_DOCS names the docs folder.
func (e *env) docShot(name string, full bool) {
	e.t.Helper()
	dir := os.Getenv("BACKLOG_UI_DOCS")
	if dir == "" {
		return
	}
	e.run(scheme("light"))
	must(e.t, os.WriteFile(filepath.Join(dir, name), e.screenshot(full), 0o644))
}

// expectConsole takes out of the browser's console record the one entry
// that contains s, which a scenario caused on purpose (a refused form
// answered 400); it fails when there is none.
func (e *env) expectConsole(s string) {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, c := range e.console {
		if strings.Contains(c, s) {
			e.console = slices.Delete(e.console, i, i+1)
			return
		}
	}
	e.t.Errorf("the browser did not report %q (reported: %q)", s, e.console)
}

func (e *env) noConsoleErrors() {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.console) > 0 {
		e.t.Fatalf("the browser reported errors:\n%s", strings.Join(e.console, "\n"))
	}
}

// TestDashboard runs the scenarios in one browser over one seeded queue.
func TestDashboard(t *testing.T) {
	e := newEnv(t)
	t.Run("overview counts", e.overview)
	t.Run("retry a failed job", e.retryFailed)
	t.Run("job detail with dependency graph", e.jobGraph)
	t.Run("pause a type", e.pauseType)
	t.Run("attempts on the job page", e.attempts)
	t.Run("args column and readable progress", e.argsAndProgress)
	t.Run("wait and run time percentiles per type", e.percentiles)
	t.Run("edit a type's limits, with a confirmation", e.editLimits)
	t.Run("XSS payloads render as text", e.xss)
	t.Run("a foreign host is refused (DNS rebinding)", e.rebinding)
	t.Run("keyboard navigation", e.keyboard)
	t.Run("screenshots of every page", e.screenshots)
	t.Run("no console errors", func(*testing.T) { e.noConsoleErrors() })
}

func (e *env) overview(t *testing.T) {
	e.open("/")
	for state, want := range map[string]string{"failed": "4", "completed": "4", "running": "1", "cancelled": "1",
		"available": "4", "scheduled": "5", "blocked": "5"} {
		if got := e.text(`[data-count="` + state + `"]`); got != want {
			t.Errorf("overview: %s count %q, want %q", state, got, want)
		}
	}
	if got := e.text(`tr[data-type="` + seed.TypePaused + `"] .badge-paused`); got != "paused" {
		t.Errorf("overview: %s not shown paused (%q)", seed.TypePaused, got)
	}
	if got, want := e.text(".top .schema"), "schema "+e.q.Schema(); got != want {
		t.Errorf("overview: the header names %q, want %q", got, want)
	}
	if got, want := eval[string](e, `document.title`), "Overview · "+e.q.Schema()+" · backlog"; got != want {
		t.Errorf("overview: title %q, want %q", got, want)
	}
	// The counts refresh on their own.
	_, err := e.q.Enqueue(context.Background(), seed.TypeEmail, nil)
	must(t, err)
	e.run(chromedp.WaitVisible(chromedp.Search(`//span[@data-count="available"][text()="5"]`)))
	e.docShot("overview.png", false)
}

func (e *env) retryFailed(t *testing.T) {
	id := e.jobs.Failed[0]
	row := `tr[data-id="` + id.String() + `"]`
	e.open("/jobs?state=failed")
	if n := eval[int](e, `document.querySelectorAll('#live tr[data-state="failed"]').length`); n != 4 {
		t.Errorf("failed list: %d rows, want 4", n)
	}
	// Select two rows, let the list refresh, and see the selection kept.
	other := `tr[data-id="` + e.jobs.Failed[1].String() + `"] input[name="id"]`
	e.click(row + ` input[name="id"]`)
	e.click(other)
	eval[int](e, `window.__refreshed = 0; document.addEventListener("backlog:refreshed", () => window.__refreshed++); 0`)
	if _, err := chromedp.Run(e.ctx, chromedp.Poll[bool](`window.__refreshed >= 1`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("no live refresh: %v", err)
	}
	if !eval[bool](e, `document.querySelector('`+row+` input[name="id"]').checked`) {
		t.Fatal("the selection was lost by the live refresh")
	}
	e.click(other) // unselect it again: retry only one
	e.click(`button[form="sel"][value="retry"]`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`.flash-ok`)))
	if got := e.text(".flash-ok"); got != "retry: 1 job(s) done." {
		t.Errorf("flash %q", got)
	}
	e.run(chromedp.WaitNotPresent(chromedp.CSS(row)))
	e.waitState(id, backlog.StateCompleted)
	if s := e.state(e.jobs.Failed[1]); s != backlog.StateFailed {
		t.Errorf("the unselected job is %s", s)
	}
}

func (e *env) jobGraph(t *testing.T) {
	e.open("/jobs/" + e.jobs.DAGMid.String())
	e.run(chromedp.WaitVisible(chromedp.CSS(`svg.graph`)))
	if n := eval[int](e, `document.querySelectorAll('svg.graph a.gnode').length`); n != 3 {
		t.Errorf("graph of the middle job: %d nodes, want 3 (prerequisite, itself, dependent)", n)
	}
	e.shoot("job-graph")
	e.docShot("job.png", true)
	// Click the prerequisite: it has two dependents.
	e.click(`svg.graph a.gnode[href$="` + e.jobs.DAGRoot.String() + `"] rect`)
	e.run(chromedp.WaitVisible(chromedp.Search(`//p[contains(., "` + e.jobs.DAGRoot.String() + `")]`)))
	if n := eval[int](e, `document.querySelectorAll('svg.graph a.gnode').length`); n != 3 {
		t.Errorf("graph of the root: %d nodes, want 3 (itself, two dependents)", n)
	}
	e.open("/jobs/" + e.jobs.Chain[1].String())
	if n := eval[int](e, `document.querySelectorAll('ol.chain li').length`); n != 3 {
		t.Errorf("ordering chain: %d jobs, want 3", n)
	}
	// Finished jobs keep their graph, each node in its final state.
	ctx := context.Background()
	a, err := e.q.Enqueue(ctx, seed.TypeOK, nil)
	must(t, err)
	b, err := e.q.Enqueue(ctx, seed.TypeOK, nil, backlog.DependsOn(a))
	must(t, err)
	e.waitState(b, backlog.StateCompleted)
	e.open("/jobs/" + b.String())
	e.run(chromedp.WaitVisible(chromedp.CSS(`svg.graph`)))
	if got := e.text(`svg.graph a.gnode[href$="` + a.String() + `"] .gsub`); !strings.HasPrefix(got, "completed · ") {
		t.Errorf("the finished prerequisite's node says %q, want it completed", got)
	}
	e.shoot("job-graph-finished")
}

func (e *env) pauseType(t *testing.T) {
	ctx := context.Background()
	e.open("/types")
	e.click(`tr[data-type="` + seed.TypePausable + `"] button[value="pause"]`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`tr[data-type="` + seed.TypePausable + `"] button[value="resume"]`)))
	paused, err := e.q.Paused(ctx)
	must(t, err)
	found := false
	for _, p := range paused {
		found = found || p.Type == seed.TypePausable
	}
	if !found {
		t.Fatalf("%s is not paused in the database: %v", seed.TypePausable, paused)
	}
	// The worker goes on claiming other types but not the paused one.
	held, err := e.q.Enqueue(ctx, seed.TypePausable, nil)
	must(t, err)
	probe, err := e.q.Enqueue(ctx, seed.TypeOK, nil)
	must(t, err)
	e.waitState(probe, backlog.StateCompleted)
	probe2, err := e.q.Enqueue(ctx, seed.TypeOK, nil)
	must(t, err)
	e.waitState(probe2, backlog.StateCompleted)
	if s := e.state(held); s != backlog.StateAvailable {
		t.Fatalf("a job of the paused type is %s", s)
	}
	e.click(`tr[data-type="` + seed.TypePausable + `"] button[value="resume"]`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`tr[data-type="` + seed.TypePausable + `"] button[value="pause"]`)))
	e.waitState(held, backlog.StateCompleted)
}

func (e *env) xss(t *testing.T) {
	id := e.jobs.XSS[0].String()
	e.open("/jobs/" + id)
	if got := e.text("h1 .jtype"); got != seed.XSSType {
		t.Errorf("type shown as %q", got)
	}
	if got := e.text("#args"); !strings.Contains(got, seed.XSSArg) {
		t.Errorf("args shown as %q", got)
	}
	if got := e.text(".kv .tag"); got != "x="+seed.XSSTag {
		t.Errorf("tag shown as %q", got)
	}
	if got := e.text(".errtext"); got != "permanent: "+seed.XSSError {
		t.Errorf("error shown as %q", got)
	}
	// The schedule's name and job type on the schedules page.
	e.open("/schedules")
	if got := eval[[]string](e, `Array.from(document.querySelectorAll('table.schedules tbody tr'), r => r.querySelector('th').textContent.trim() + " | " + r.querySelector('.jtype').textContent)`); !slices.Contains(got, seed.XSSSchedule+" | "+seed.XSSScheduleType) {
		t.Errorf("schedules shown as %q, want a row %q", got, seed.XSSSchedule+" | "+seed.XSSScheduleType)
	}
	for _, p := range []string{"/jobs/" + id, "/jobs?state=failed", "/", "/types", "/processes", "/schedules",
		"/jobs?tags=" + url.QueryEscape("x="+seed.XSSTag), "/jobs/confirm?action=retry&type=" + url.QueryEscape(seed.XSSType)} {
		e.open(p)
		imgs, scripts := eval[int](e, `document.querySelectorAll('img').length`), eval[int](e, `document.scripts.length`)
		if imgs != 0 || scripts != 1 {
			t.Errorf("%s: %d img and %d script elements, want 0 and 1 (app.js)", p, imgs, scripts)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.console {
		if strings.HasPrefix(c, "dialog:") {
			t.Errorf("a dialog opened: %s", c)
		}
	}
}

// rebinding replays DNS rebinding in the browser: a page of another site
// whose name now resolves to the dashboard's address. The dashboard must
// answer it 421 with neither a page nor a cookie nor a token, so that a
// script of that site can neither read it nor act, while a name it is
// told to answer (WithAllowedHosts, as behind a proxy) and localhost work.
func (e *env) rebinding(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(e.url)
	must(t, err)
	port := u.Port()
	foreign := "http://" + foreignHost + ":" + port
	resp, err := chromedp.Run(e.ctx, chromedp.NavigateResponse(foreign+"/types"))
	must(t, err)
	if resp.Status != 421 {
		t.Errorf("%s/types: status %d, want 421", foreign, resp.Status)
	}
	if body := eval[string](e, `document.body.innerText`); !strings.Contains(body, "does not answer") {
		t.Errorf("%s/types shows %.200q…", foreign, body)
	}
	if n := eval[int](e, `document.querySelectorAll('form, input').length`); n != 0 {
		t.Errorf("%s/types has %d forms or inputs", foreign, n)
	}
	_, err = chromedp.Run(e.ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		r, err := cdp.Call(ctx, tg, network.GetCookies, network.GetCookiesParams{URLs: []string{foreign + "/"}})
		if err != nil {
			return err
		}
		for _, c := range r.Cookies {
			t.Errorf("%s set the cookie %s", foreign, c.Name)
		}
		return nil
	}))
	must(t, err)
	// The foreign page's script tries its best: read a page for a token,
	// then post the action with it.
	status, err := chromedp.Run(e.ctx, chromedp.Evaluate[string](`fetch("/types").then(r => r.text()).then(html => {
		const m = html.match(/name="csrf" value="([^"]+)"/);
		const body = new URLSearchParams({action: "pause", type: "`+seed.TypeOK+`", csrf: m ? m[1] : ""});
		return fetch("/types/action", {method: "POST", body, redirect: "manual"});
	}).then(r => String(r.status))`, chromedp.EvalAwaitPromise))
	must(t, err)
	if status != "421" {
		t.Errorf("the foreign page's POST got %s, want 421", status)
	}
	paused, err := e.q.Paused(ctx)
	must(t, err)
	for _, p := range paused {
		if p.Type == seed.TypeOK {
			t.Fatalf("a page of %s paused %s", foreignHost, seed.TypeOK)
		}
	}

	// localhost is answered.
	e.run(chromedp.Navigate("http://localhost:"+port+"/types"), chromedp.WaitVisible(chromedp.CSS(`tr[data-type="`+seed.TypeOK+`"]`)))

	// A name the dashboard is told to answer works, actions included.
	srv := httptest.NewServer(backlogui.NewHandler(e.q, backlogui.WithLogger(quiet()), backlogui.WithAllowedHosts(proxyHost)))
	defer srv.Close()
	pu, err := url.Parse(srv.URL)
	must(t, err)
	row := `tr[data-type="` + seed.TypeOK + `"]`
	e.run(chromedp.Navigate("http://" + proxyHost + ":" + pu.Port() + "/types"))
	e.click(row + ` button[value="pause"]`)
	e.run(chromedp.WaitVisible(chromedp.CSS(row + ` button[value="resume"]`)))
	e.click(row + ` button[value="resume"]`)
	e.run(chromedp.WaitVisible(chromedp.CSS(row + ` button[value="pause"]`)))
}

func (e *env) screenshots(t *testing.T) {
	pages := []struct{ name, path string }{{"overview", "/"}, {"overview-day", "/?range=day"}, {"jobs", "/jobs"},
		{"jobs-failed", "/jobs?state=failed"}, {"job-failed", "/jobs/" + e.jobs.Failed[1].String()},
		{"job-running", "/jobs/" + e.jobs.Running[0].String()}, {"job-chain", "/jobs/" + e.jobs.Chain[1].String()},
		{"confirm", "/jobs/confirm?action=retry&state=failed"}, {"types", "/types"},
		{"limits", "/types/limits?type=" + url.QueryEscape(seed.TypeOK)}, {"schedules", "/schedules"},
		{"processes", "/processes"}, {"not-found", notFoundPath}}
	for _, p := range pages {
		e.open(p.path)
		e.shoot(p.name)
	}
	// Phone width.
	e.run(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
	for _, p := range pages[:5] {
		e.open(p.path)
		e.shoot("phone-" + p.name)
	}
	var phone int
	for _, p := range pages[:5] {
		e.open(p.path)
		if w := eval[int](e, `document.documentElement.scrollWidth`); w > 390 {
			phone = w
			t.Errorf("%s is %dpx wide on a 390px phone", p.path, w)
		}
	}
	_ = phone
	e.run(chromedp.ResetViewport())
	e.open("/")
	if w := eval[int](e, `document.documentElement.scrollWidth`); w > 1280 {
		t.Errorf("the overview is %dpx wide at 1280px", w)
	}
}

// keyboard walks a page with the keyboard alone: the first Tab reaches the
// skip link, Enter on it moves to the content, and further Tabs reach the
// filter form and a job's link.
func (e *env) keyboard(t *testing.T) {
	e.open("/jobs?state=failed")
	e.run(chromedp.KeyEvent(kb.Tab))
	if c := eval[string](e, `document.activeElement.className`); c != "skip" {
		t.Fatalf("the first Tab reached %q, not the skip link", c)
	}
	e.run(chromedp.KeyEvent(kb.Enter))
	if id := eval[string](e, `document.activeElement.id`); id != "main" {
		t.Errorf("the skip link moved the focus to %q, not main", id)
	}
	// Tab until a job's link has the focus, then follow it with Enter.
	for i := 0; i < 60 && !eval[bool](e, `document.activeElement.matches('#live td.mono a')`); i++ {
		e.run(chromedp.KeyEvent(kb.Tab))
	}
	href := eval[string](e, `document.activeElement.getAttribute('href') || ''`)
	if !strings.Contains(href, "/jobs/") {
		t.Fatalf("Tab never reached a job's link (focus on %q)", href)
	}
	e.run(chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS(`section[aria-labelledby="att-h"]`)))
	if loc := eval[string](e, `location.pathname`); loc != href {
		t.Errorf("Enter on the link opened %q, not %q", loc, href)
	}
}

// attempts: the job page lists each attempt with its worker, start,
// duration and outcome: a failed one from the error history, a
// completed one from the job's record, a running one as it runs.
func (e *env) attempts(t *testing.T) {
	row := func(outcome string) string { return `#attempts tr[data-outcome="` + outcome + `"]` }
	cells := func(sel string) []string {
		return eval[[]string](e, `Array.from(document.querySelectorAll('`+sel+` td'), td => td.textContent.trim())`)
	}
	e.open("/jobs/" + e.jobs.Failed[1].String())
	e.text(row("error"))
	c := cells(row("error"))
	if len(c) != 6 || c[0] != "1" || c[1] != "error" || c[2] != "browser-test-worker" || c[3] == "—" || !strings.HasSuffix(c[4], "s") ||
		!strings.Contains(c[5], "card declined") {
		t.Errorf("the failed attempt shows %q", c)
	}
	e.open("/jobs/" + e.jobs.Completed[0].String())
	e.text(row("completed"))
	if c := cells(row("completed")); len(c) != 6 || c[1] != "completed" || c[2] != "browser-test-worker" || !strings.HasSuffix(c[4], "s") {
		t.Errorf("the completed attempt shows %q", c)
	}
	e.open("/jobs/" + e.jobs.Running[0].String())
	e.text(row("running"))
	if c := cells(row("running")); len(c) != 6 || c[1] != "running" || c[2] != "browser-test-worker" {
		t.Errorf("the running attempt shows %q", c)
	}
	e.shoot("job-attempts")
}

// argsAndProgress: the jobs list has an args column (compact JSON, cut,
// as text) and shows progress as a bar with its counts, not as JSON.
func (e *env) argsAndProgress(t *testing.T) {
	e.open("/jobs?state=completed&type=" + seed.TypeOK)
	row := `tr[data-id="` + e.jobs.Completed[0].String() + `"]`
	if got := e.text(row + ` td.args`); got != `{"size":[640,480],"image":"photos/0.jpg"}` {
		t.Errorf("args column %q", got)
	}
	if v := eval[float64](e, `document.querySelector('`+row+` .prog progress').value`); v != 100 {
		t.Errorf("progress bar at %v, want 100", v)
	}
	if got := e.text(row + ` .prog`); got != "100% 100% (16 of 16 tiles)" && got != "100% (16 of 16 tiles)" {
		t.Errorf("progress shown as %q", got)
	}
	e.open("/jobs/" + e.jobs.Running[0].String())
	e.run(chromedp.WaitVisible(chromedp.Search(`//div[@id="progress"][contains(., "1,200 of 4,800 frames")]`)))
	if got := e.text("#progress .pct"); got != "25%" {
		t.Errorf("the running job's progress is %q", got)
	}
	// A hostile arg is text in the column too.
	e.open("/jobs?state=failed&type=" + url.QueryEscape(seed.XSSType))
	if got := e.text(`tr[data-id="` + e.jobs.XSS[0].String() + `"] td.args`); !strings.Contains(got, seed.XSSArg[2:]) {
		t.Errorf("the hostile args show as %q", got)
	}
}

// percentiles: the types page shows p50 and p95 of wait and run time over
// the last hour and day for a type with finished jobs, and a dash for a
// type with none.
func (e *env) percentiles(t *testing.T) {
	e.open("/types")
	for _, which := range []string{"wait", "run"} {
		for _, rg := range []string{"1h", "24h"} {
			sel := `tr[data-type="` + seed.TypeOK + `"] td[data-lat="` + which + `"] .pct-line[data-range="` + rg + `"]`
			got := e.text(sel)
			if !regexp.MustCompile(`^` + rg + ` [0-9.]+(ms|s) · [0-9.]+(ms|s)$`).MatchString(got) {
				t.Errorf("%s %s of %s: %q", which, rg, seed.TypeOK, got)
			}
		}
	}
	if got := e.text(`tr[data-type="` + seed.TypeLater + `"] td[data-lat="run"] .pct-line[data-range="1h"]`); got != "1h —" {
		t.Errorf("run time of a type with no finished job: %q", got)
	}
}

// editLimits sets a type's limits from the types page through the
// confirmation step, sees a bad value refused with the field named and
// nothing written, then removes them.
func (e *env) editLimits(t *testing.T) {
	ctx := context.Background()
	typ := seed.TypeEmail
	limit := func() *backlog.Limit {
		ls, err := e.q.Limits(ctx)
		must(t, err)
		for _, l := range ls {
			if l.Type == typ {
				return &l.Limit
			}
		}
		return nil
	}
	e.open("/types")
	e.click(`tr[data-type="` + typ + `"] a.edit-limits`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`#limit-review`)))
	e.run(chromedp.SendKeys(`input[name="concurrency"]`, "4"), chromedp.SendKeys(`input[name="rate"]`, "30"))
	e.run(chromedp.SetValue(`input[name="per"]`, "1m"))
	e.click(`#limit-review`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`#limit-apply`)))
	if got := e.text("#limit-new"); got != "concurrency 4; rate 30/1m" {
		t.Errorf("the confirmation shows %q", got)
	}
	if l := limit(); l != nil {
		t.Fatalf("the review step wrote %+v", l)
	}
	e.shoot("limits-confirm")
	e.click(`#limit-apply`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`.flash-ok`)))
	if got := e.text(".flash-ok"); !strings.Contains(got, "Set the limits of "+typ+": concurrency 4; rate 30/1m") {
		t.Errorf("flash %q", got)
	}
	if got := e.text(`tr[data-type="` + typ + `"] td.limits`); !strings.Contains(got, "concurrency 4") {
		t.Errorf("the types page shows the limits as %q", got)
	}
	want := &backlog.Limit{Concurrency: 4, Rate: 30, Per: time.Minute, Burst: 1}
	if l := limit(); l == nil || *l != *want {
		t.Fatalf("limits written: %+v, want %+v", l, want)
	}

	// A bad value: the form again, the field named, nothing written.
	e.click(`tr[data-type="` + typ + `"] a.edit-limits`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`#limit-review`)))
	e.run(chromedp.SetValue(`input[name="burst"]`, "31"))
	e.click(`#limit-review`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`#limit-error`)))
	if got := e.text("#limit-error"); got != "backlog: invalid burst: 31 is more than the rate (30)" {
		t.Errorf("error shown: %q", got)
	}
	e.shoot("limits-error")
	e.expectConsole("status of 400 (Bad Request) " + e.url + "/types/limits")
	if l := limit(); l == nil || *l != *want {
		t.Fatalf("a refused value changed the limits: %+v", l)
	}

	// Removal, confirmed.
	e.click(`#limit-remove`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`#limit-apply`)))
	e.click(`#limit-apply`)
	e.run(chromedp.WaitVisible(chromedp.CSS(`.flash-ok`)))
	if l := limit(); l != nil {
		t.Fatalf("limits left after removal: %+v", l)
	}
}
