package backlogui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/backlogq/backlog"
)

// pages holds one template set per page, each the layout plus the page.
type pages struct {
	sets map[string]*template.Template
}

var pageNames = []string{"overview", "jobs", "confirm", "job", "types", "limits", "schedules", "processes", "error"}

func mustParsePages() *pages {
	p := &pages{sets: map[string]*template.Template{}}
	for _, name := range pageNames {
		t := template.New(name).Funcs(funcs)
		t = template.Must(t.ParseFS(templatesFS, "templates/layout.html", "templates/"+name+".html"))
		p.sets[name] = t
	}
	return p
}

var funcs = template.FuncMap{
	"ago":       ago,
	"iso":       func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"abs":       func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"dur":       fmtDur,
	"pretty":    prettyJSON,
	"short":     func(s fmt.Stringer) string { str := s.String(); return str[len(str)-12:] },
	"trunc":     trunc,
	"num":       func(n int64) string { return fmtInt(n) },
	"terminal":  func(s backlog.State) bool { return s.Terminal() },
	"deref":     func(t *time.Time) time.Time { return *t },
	"add":       func(a, b int) int { return a + b },
	"u":         func(parts ...string) string { return strings.Join(parts, "") },
	"qesc":      url.QueryEscape,
	"since2":    func(a, b time.Time) time.Duration { return b.Sub(a) },
	"args":      func(v *view, action, label string) btnArgs { return btnArgs{V: v, Action: action, Label: label} },
	"rate":      rateText,
	"progress":  progressOf,
	"argstext":  argsText,
	"lat":       fmtLatency,
	"limittext": limitText,
	"pctArgs":   pctArgs,
}

// pcts is one cell of the types page: the p50 and p95 of a wait or run
// time over the last hour and day, printed ("" pairs: none counted).
type pcts struct{ Hour, Day *pctPair }

type pctPair struct{ P50, P95 string }

func pctArgs(hour, day *backlog.Latency, which string) pcts {
	pair := func(l *backlog.Latency) *pctPair {
		if l == nil {
			return nil
		}
		p, n := l.Run, l.Ran
		if which == "wait" {
			p, n = l.Wait, l.Waited
		}
		if n == 0 {
			return nil
		}
		return &pctPair{P50: fmtLatency(p.P50), P95: fmtLatency(p.P95)}
	}
	return pcts{Hour: pair(hour), Day: pair(day)}
}

// rateText prints a rate as the CLI's --rate takes it: 100/1s, 5/1m,
// 1/1h30m.
func rateText(n int, per time.Duration) string {
	s := per.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return strconv.Itoa(n) + "/" + s
}

// nav is the header's links.
type navLink struct {
	Href, Label string
	Current     bool
}

// view is what every page template gets.
type view struct {
	Title     string
	Page      string
	Base      string
	Schema    string // the queue's PostgreSQL schema, named in the header and title
	Nav       []navLink
	CSRF      string
	ReadOnly  bool
	Flash     *flashMsg
	RefreshMS int64
	Live      bool // refresh the #live part
	Now       time.Time
	Status    int
	Data      any
	Replica   *replicaView // where the data comes from, with a read pool; nil without
}

func (h *handler) newView(w http.ResponseWriter, r *http.Request, page, title string, data any) *view {
	v := &view{Title: title, Page: page, Base: h.cfg.base, Schema: h.q.Schema(), ReadOnly: h.cfg.readOnly, RefreshMS: h.cfg.poll.Milliseconds(),
		Now: time.Now(), Data: data, Status: http.StatusOK, Replica: h.replicaOf(r.Context())}
	for _, l := range []struct{ page, href, label string }{{"overview", "/", "Overview"}, {"jobs", "/jobs", "Jobs"},
		{"types", "/types", "Types"}, {"schedules", "/schedules", "Schedules"}, {"processes", "/processes", "Processes"}} {
		v.Nav = append(v.Nav, navLink{Href: h.cfg.base + l.href, Label: l.label, Current: l.page == page || page == "job" && l.page == "jobs"})
	}
	if !h.cfg.readOnly {
		v.CSRF = h.csrfToken(w, r)
	}
	if !isLive(r) {
		v.Flash = h.takeFlash(w, r)
	}
	return v
}

// isLive reports whether the request is a page's refresh, which gets only
// the page's live part.
func isLive(r *http.Request) bool { return r.Header.Get("X-Backlog-Live") == "1" }

// render writes a page, or its live part for a refresh.
func (h *handler) render(w http.ResponseWriter, r *http.Request, v *view) {
	t := h.pages.sets[v.Page]
	name := "layout"
	if isLive(r) {
		name = "live"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, v); err != nil {
		h.cfg.logger.Error("backlogui: rendering a page", "page", v.Page, "err", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(v.Status)
	_, _ = w.Write(buf.Bytes())
}

type errorData struct {
	Status  int
	Heading string
	Message string
}

// retryAfter is the Retry-After, in seconds, of a transient database
// error: about as long as a PostgreSQL restart or a failover to a standby
// takes.
const retryAfter = "5"

// fail shows an error page with the error's status.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	msg := err.Error()
	if status >= 500 {
		h.cfg.logger.Error("backlogui: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		switch {
		case errors.Is(err, backlog.ErrRetryable):
			w.Header().Set("Retry-After", retryAfter)
			msg = "The database is unreachable for now (" + msg + "). Nothing is wrong with the request: retry in a few seconds."
		case status == http.StatusInternalServerError:
			msg = "The dashboard could not read the queue: " + msg
		}
	} else {
		h.cfg.logger.Info("backlogui: request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	v := h.newView(w, r, "error", http.StatusText(status), errorData{Status: status, Heading: http.StatusText(status), Message: msg})
	v.Status = status
	if isLive(r) {
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, msg, status)
		return
	}
	h.render(w, r, v)
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, &httpError{status: http.StatusNotFound, msg: "No such page: " + r.URL.Path})
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	suffix := " ago"
	if d < 0 {
		d, suffix = -d, ""
		return "in " + fmtDur(d.Round(time.Second))
	}
	if d < time.Second {
		return "just now"
	}
	return fmtDur(d) + suffix
}

// fmtDur is a short human duration: 45s, 3m 12s, 2h 5m, 3d 4h.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

func trunc(n int, s string) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 || len(s) <= 3 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func cutString(s, sep string) (string, string, bool) { return strings.Cut(s, sep) }

type btnArgs struct {
	V             *view
	Action, Label string
}
