// Package backlogui is backlog's web dashboard: an http.Handler that shows
// the queue (counts, throughput, jobs, their graph, types, schedules and
// worker processes) and lets an operator retry, cancel and delete jobs,
// pause types and set their limits. It is built only on the operator API
// of *backlog.Queue. docs/dashboard.md is its guide.
//
// Mount it under any prefix of your own mux, behind your own
// authentication, and name the host it is reached by:
//
//	ui := backlogui.NewHandler(q, backlogui.WithBasePath("/admin/queue"),
//		backlogui.WithAllowedHosts("ops.example.com"),
//		backlogui.WithAuthorize(func(r *http.Request, action string) error { … }))
//	mux.Handle("/admin/queue/", requireAdmin(ui))
//
// The handler is safe for concurrent use. Pages are server-rendered HTML
// with a small embedded script (no CDN, no inline script); every action is
// a POST checked for a CSRF token and a same-origin request; GET requests
// never change anything. It answers only requests for localhost, loopback
// addresses, the address a request arrived at and the names given with
// WithAllowedHosts, which defeats DNS rebinding.
package backlogui

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/backlogq/backlog"
)

// The actions an Authorize function is asked about.
const (
	ActionRetry     = "retry"      // retry one job
	ActionCancel    = "cancel"     // cancel one job
	ActionDelete    = "delete"     // delete one job
	ActionRetryAll  = "retry-all"  // retry every job matching a filter
	ActionCancelAll = "cancel-all" // cancel every job matching a filter
	ActionDeleteAll = "delete-all" // delete every job matching a filter
	ActionPause     = "pause"      // pause a job type
	ActionResume    = "resume"     // resume a job type
	// ActionSetLimit sets a job type's limits (concurrency, key
	// concurrency, rate), ActionRemoveLimit removes them.
	ActionSetLimit    = "set-limit"
	ActionRemoveLimit = "remove-limit"
)

// Option configures NewHandler.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	base      string
	readOnly  bool
	authorize func(*http.Request, string) error
	logger    *slog.Logger
	poll      time.Duration
	origins   []string
	hosts     []string
}

// WithBasePath sets the path prefix the handler is mounted under (e.g.
// "/admin/queue"), used to build links. Requests may arrive with the prefix
// (mux.Handle("/admin/queue/", h)) or without it (http.StripPrefix).
// Defaults to "" (mounted at the root).
func WithBasePath(p string) Option {
	return optionFunc(func(c *config) { c.base = strings.TrimRight(p, "/") })
}

// WithReadOnly hides every action and refuses them with 403 Forbidden.
// Defaults to false (actions allowed, subject to WithAuthorize).
func WithReadOnly(readOnly bool) Option {
	return optionFunc(func(c *config) { c.readOnly = readOnly })
}

// WithAuthorize sets a function consulted before every action, with one of
// the Action constants; a non-nil error refuses the action with 403
// Forbidden and is shown to the user. It is not consulted for reading
// pages: put the dashboard behind your own authentication for that.
// Defaults to nil (every action allowed).
func WithAuthorize(f func(r *http.Request, action string) error) Option {
	return optionFunc(func(c *config) { c.authorize = f })
}

// WithLogger sets the logger for failed requests and performed actions.
// Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithRefreshInterval sets how often an open page refreshes its live parts
// (counts, lists). Defaults to DefaultRefreshInterval.
func WithRefreshInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.poll = d })
}

// WithTrustedOrigins lets actions come from these origins
// ("https://ops.example.com") although they differ from the request's
// Host, as behind a proxy that rewrites it. An origin that does not parse
// makes NewHandler panic. Defaults to none: actions must be same-origin.
func WithTrustedOrigins(origins ...string) Option {
	return optionFunc(func(c *config) { c.origins = append(c.origins, origins...) })
}

// WithAllowedHosts adds names the dashboard answers under, beyond those it
// always answers: localhost, loopback addresses and the IP address a
// request arrived at, at any port. Give the names people reach it by when
// they are not these, e.g. behind a proxy that passes the Host header on:
// "ops.example.com" (at any port), "ops.example.com:8443" (at that port
// only), "10.0.0.7". "*" answers any host; use it only behind a proxy
// that checks the Host itself. A request for another host gets 421
// Misdirected Request with neither a page nor a cookie nor a token, which
// defeats DNS rebinding: a page of another site whose name an attacker
// points at the dashboard's address. This holds with and without
// WithAuthorize. An entry that is not a host name or IP address,
// optionally with a port, makes NewHandler panic. Defaults to none.
func WithAllowedHosts(hosts ...string) Option {
	return optionFunc(func(c *config) { c.hosts = append(c.hosts, hosts...) })
}

// DefaultRefreshInterval is how often open pages refresh by default.
const DefaultRefreshInterval = 2 * time.Second

//go:embed assets
var assetsFS embed.FS

//go:embed templates
var templatesFS embed.FS

// handler is the dashboard.
type handler struct {
	q      *backlog.Queue
	cfg    config
	secret [32]byte // CSRF tokens are HMACs of the cookie under this key
	mux    *http.ServeMux
	pages  *pages
	cop    *http.CrossOriginProtection

	hosts   []hostRule // WithAllowedHosts, beyond loopback and the local address
	anyHost bool       // WithAllowedHosts("*")

	lat struct { // the types page's percentiles, reused for latencyTTL
		mu        sync.Mutex
		at        time.Time
		hour, day []backlog.Latency
	}
}

// NewHandler returns the dashboard for q.
func NewHandler(q *backlog.Queue, opts ...Option) http.Handler {
	cfg := config{logger: slog.Default(), poll: DefaultRefreshInterval}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	if cfg.poll <= 0 {
		cfg.poll = DefaultRefreshInterval
	}
	h := &handler{q: q, cfg: cfg, mux: http.NewServeMux(), pages: mustParsePages(), cop: http.NewCrossOriginProtection()}
	_, _ = rand.Read(h.secret[:]) // never fails (crypto/rand panics instead)
	for _, o := range cfg.origins {
		if err := h.cop.AddTrustedOrigin(o); err != nil {
			panic("backlogui: WithTrustedOrigins: " + err.Error())
		}
	}
	for _, s := range cfg.hosts {
		if s == "*" {
			h.anyHost = true
			continue
		}
		rule, err := parseHostRule(s)
		if err != nil {
			panic("backlogui: WithAllowedHosts: " + err.Error())
		}
		h.hosts = append(h.hosts, rule)
	}
	static, _ := fs.Sub(assetsFS, "assets")
	files := http.FileServerFS(static)
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets", cacheFor(time.Hour, files)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /jobs", h.jobs)
	h.mux.HandleFunc("GET /jobs/confirm", h.confirmBulk)
	h.mux.HandleFunc("GET /jobs/{id}", h.job)
	h.mux.HandleFunc("GET /types", h.types)
	h.mux.HandleFunc("GET /schedules", h.schedules)
	h.mux.HandleFunc("GET /processes", h.processes)
	h.mux.HandleFunc("POST /jobs/action", h.action(h.jobsAction))
	h.mux.HandleFunc("POST /jobs/bulk", h.action(h.bulkAction))
	h.mux.HandleFunc("POST /types/action", h.action(h.typeAction))
	h.mux.HandleFunc("GET /types/limits", h.limitsForm)
	h.mux.HandleFunc("POST /types/limits", h.action(h.limitsAction))
	h.mux.HandleFunc("/", h.notFound)
	return h
}

// ServeHTTP sets the security headers, refuses hosts it does not serve
// (host.go), strips the base path (when the request still has it) and
// routes.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	if !h.hostAllowed(r) {
		h.refuseHost(w, r)
		return
	}
	if h.cfg.base != "" && (r.URL.Path == h.cfg.base || strings.HasPrefix(r.URL.Path, h.cfg.base+"/")) {
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path = strings.TrimPrefix(r.URL.Path, h.cfg.base)
		u.RawPath = ""
		if u.Path == "" {
			u.Path = "/"
		}
		r2.URL = &u
		r = r2
	}
	h.mux.ServeHTTP(w, r)
}

func cacheFor(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age="+itoa(int64(d/time.Second)))
		next.ServeHTTP(w, r)
	})
}

// httpError is an error with the status it answers.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(msg string) error { return &httpError{status: http.StatusBadRequest, msg: msg} }

func forbidden(msg string) error { return &httpError{status: http.StatusForbidden, msg: msg} }

// statusOf maps an error to its HTTP status. A transient database error
// (backlog.ErrRetryable: the connection refused or dropped, the server
// restarting, a failover) is 503, not 409: nothing is wrong with the
// request, and the same request may succeed in a few seconds (fail adds
// Retry-After).
func statusOf(err error) int {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.status
	case errors.Is(err, backlog.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, backlog.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, backlog.ErrRetryable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	case errors.Is(err, backlog.ErrRunning), errors.Is(err, backlog.ErrBlocked), errors.Is(err, backlog.ErrUniqueKeyHeld),
		errors.Is(err, backlog.ErrPrerequisiteFailed):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}
