package backlogui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/backlogq/backlog"
)

// A type's limits are edited in three steps, each a page: the form (GET
// /types/limits?type=…), a confirmation showing the change (POST with
// step=review: the values are checked, nothing is written), and the write
// (POST with step=apply). Both POSTs pass the CSRF, read-only and
// Authorize checks (ActionSetLimit, ActionRemoveLimit); bad values show
// the form again with the error, and nothing is written.

// limitForm is the form's fields as typed.
type limitForm struct {
	Concurrency, KeyConcurrency, Rate, Per, Burst string
	RatePerKey                                    bool
}

func formOfLimit(l *backlog.Limit) limitForm {
	if l == nil {
		return limitForm{Per: "1s"}
	}
	f := limitForm{RatePerKey: l.RatePerKey, Per: "1s"}
	if l.Concurrency > 0 {
		f.Concurrency = strconv.Itoa(l.Concurrency)
	}
	if l.KeyConcurrency > 0 {
		f.KeyConcurrency = strconv.Itoa(l.KeyConcurrency)
	}
	if l.Rate > 0 {
		f.Rate, f.Per, f.Burst = strconv.Itoa(l.Rate), l.Per.String(), strconv.Itoa(l.Burst)
	}
	return f
}

func formOfPost(v url.Values) limitForm {
	return limitForm{Concurrency: strings.TrimSpace(v.Get("concurrency")), KeyConcurrency: strings.TrimSpace(v.Get("key_concurrency")),
		Rate: strings.TrimSpace(v.Get("rate")), Per: strings.TrimSpace(v.Get("per")), Burst: strings.TrimSpace(v.Get("burst")),
		RatePerKey: v.Get("rate_per_key") == "on"}
}

// limit reads the form: an empty number is 0 (none); per is a Go
// duration (1s, 1m30s), read only with a rate. Errors are *InputError
// naming the field, then the limit is checked as SetLimit would.
func (f limitForm) limit() (backlog.Limit, error) {
	var l backlog.Limit
	for _, x := range []struct {
		name, v string
		dst     *int
	}{{"concurrency", f.Concurrency, &l.Concurrency}, {"key concurrency", f.KeyConcurrency, &l.KeyConcurrency},
		{"rate", f.Rate, &l.Rate}, {"burst", f.Burst, &l.Burst}} {
		if x.v == "" {
			continue
		}
		n, err := strconv.Atoi(x.v)
		if err != nil {
			return l, &backlog.InputError{Field: x.name, Reason: fmt.Sprintf("want a whole number, got %q", x.v)}
		}
		*x.dst = n
	}
	if l.Rate != 0 {
		d, err := time.ParseDuration(f.Per)
		if err != nil {
			return l, &backlog.InputError{Field: "per", Reason: fmt.Sprintf("want a duration such as 1s or 1m, got %q", f.Per)}
		}
		l.Per = d
	}
	l.RatePerKey = f.RatePerKey
	return l, l.Validate()
}

type limitsData struct {
	Type    string
	Current *backlog.Limit // nil: none
	Form    limitForm
	Error   string
	// Confirm: the confirmation step of a change to New (nil: of the
	// removal of the limits).
	Confirm bool
	New     *backlog.Limit
}

// current reads typ's limits (nil: none) from the primary, where SetLimit
// writes: the form starts from them and the review shows them as the
// limits being replaced, which a lagging read pool could show stale (a
// limit set a moment ago missing).
func (h *handler) current(r *http.Request, typ string) (*backlog.Limit, error) {
	ls, err := h.q.Limits(backlog.ReadPrimary(r.Context()))
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		if l.Type == typ {
			return &l.Limit, nil
		}
	}
	return nil, nil
}

func (h *handler) limitsForm(w http.ResponseWriter, r *http.Request) {
	if h.cfg.readOnly {
		h.fail(w, r, forbidden("The dashboard is read-only: actions are disabled."))
		return
	}
	typ := strings.TrimSpace(r.URL.Query().Get("type"))
	if typ == "" {
		h.fail(w, r, badRequest("type: required"))
		return
	}
	cur, err := h.current(r, typ)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, h.newView(w, r, "limits", "Limits of "+typ, &limitsData{Type: typ, Current: cur, Form: formOfLimit(cur)}))
}

// limitsAction is the review and apply steps (form fields type, action:
// set or remove, step: edit, review or apply, and the limit's fields).
func (h *handler) limitsAction(w http.ResponseWriter, r *http.Request) error {
	typ := strings.TrimSpace(r.PostForm.Get("type"))
	if typ == "" {
		return badRequest("type: required")
	}
	action, step := r.PostForm.Get("action"), r.PostForm.Get("step")
	var authz string
	switch action {
	case "set":
		authz = ActionSetLimit
	case "remove":
		authz = ActionRemoveLimit
	default:
		return badRequest("action: want set or remove")
	}
	if step != "edit" && step != "review" && step != "apply" {
		return badRequest("step: want edit, review or apply")
	}
	if err := h.authorize(r, authz); err != nil {
		return err
	}
	cur, err := h.current(r, typ)
	if err != nil {
		return err
	}
	d := &limitsData{Type: typ, Current: cur, Form: formOfPost(r.PostForm)}
	page := func(status int) error {
		v := h.newView(w, r, "limits", "Limits of "+typ, d)
		v.Status = status
		h.render(w, r, v)
		return nil
	}
	if action == "remove" {
		d.Form = formOfLimit(cur)
		if step != "apply" {
			d.Confirm = true
			return page(http.StatusOK)
		}
		if err := h.q.RemoveLimit(r.Context(), typ); err != nil {
			return err
		}
		h.cfg.logger.Info("backlogui: action", "action", authz, "type", typ)
		h.flash(w, "ok", "Removed the limits of "+typ+".")
		h.redirect(w, r, "/types")
		return nil
	}
	if step == "edit" {
		return page(http.StatusOK)
	}
	l, err := d.Form.limit()
	if err == nil && step == "apply" {
		err = h.q.SetLimit(r.Context(), typ, l)
	}
	var ie *backlog.InputError
	if errors.As(err, &ie) {
		d.Error = ie.Error()
		return page(http.StatusBadRequest)
	}
	if err != nil {
		return err
	}
	if step == "review" {
		d.Confirm, d.New = true, &l
		return page(http.StatusOK)
	}
	h.cfg.logger.Info("backlogui: action", "action", authz, "type", typ, "limit", fmt.Sprintf("%+v", l))
	h.flash(w, "ok", "Set the limits of "+typ+": "+limitText(&l)+".")
	h.redirect(w, r, "/types")
	return nil
}

// limitText describes l in a line, as the types page lists it.
func limitText(l *backlog.Limit) string {
	if l == nil {
		return "none"
	}
	var parts []string
	if l.Concurrency > 0 {
		parts = append(parts, "concurrency "+strconv.Itoa(l.Concurrency))
	}
	if l.KeyConcurrency > 0 {
		parts = append(parts, strconv.Itoa(l.KeyConcurrency)+" per concurrency key")
	}
	if l.Rate > 0 {
		s := "rate " + rateText(l.Rate, l.Per)
		if l.Burst > 0 {
			s += ", burst " + strconv.Itoa(l.Burst)
		}
		if l.RatePerKey {
			s += ", per key"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}
