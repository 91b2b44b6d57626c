package backlogui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
)

// CSRF protection is two checks, both required for every POST:
//
//   - Same origin: http.CrossOriginProtection refuses a request whose
//     Sec-Fetch-Site header says it came from another site, or whose
//     Origin header names another host.
//   - A token: each browser gets a random cookie (SameSite=Strict,
//     HttpOnly), and each form carries the HMAC of that cookie under the
//     handler's random secret. Another site can neither read the cookie nor
//     compute the HMAC, and a token copied from one browser is useless in
//     another. The secret lives as long as the handler: a restart makes
//     open pages' forms stale (the user reloads).

const (
	csrfCookie  = "backlog_csrf"
	csrfField   = "csrf"
	flashCookie = "backlog_flash"
	maxFormSize = 1 << 20
)

// cookiePath is where the dashboard's cookies apply.
func (h *handler) cookiePath() string {
	if h.cfg.base == "" {
		return "/"
	}
	return h.cfg.base + "/"
}

// csrfToken returns the token forms must carry, setting the browser's
// cookie first when it has none.
func (h *handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 22 {
		return h.mac(c.Value)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	v := base64.RawURLEncoding.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: h.cookiePath(), HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return h.mac(v)
}

func (h *handler) mac(v string) string {
	m := hmac.New(sha256.New, h.secret[:])
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkPost refuses a POST that is cross-origin, lacks a valid token, or
// comes while the dashboard is read-only. It parses the form.
func (h *handler) checkPost(r *http.Request) error {
	if h.cfg.readOnly {
		return forbidden("The dashboard is read-only: actions are disabled.")
	}
	if err := h.cop.Check(r); err != nil {
		return forbidden("Refused a cross-origin request: " + err.Error())
	}
	r.Body = http.MaxBytesReader(nil, r.Body, maxFormSize)
	if err := r.ParseForm(); err != nil {
		return badRequest("Unreadable form: " + err.Error())
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) != 22 {
		return forbidden("Missing CSRF cookie: reload the page and try again.")
	}
	if !hmac.Equal([]byte(r.PostForm.Get(csrfField)), []byte(h.mac(c.Value))) {
		return forbidden("Invalid CSRF token: reload the page and try again.")
	}
	return nil
}

// authorize asks the Authorize hook about an action.
func (h *handler) authorize(r *http.Request, action string) error {
	if h.cfg.authorize == nil {
		return nil
	}
	if err := h.cfg.authorize(r, action); err != nil {
		return forbidden("Not authorized to " + action + ": " + err.Error())
	}
	return nil
}

// action wraps a POST handler: the checks first, then fn, whose error is
// shown on an error page; fn redirects on success.
func (h *handler) action(fn func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := h.checkPost(r)
		if err == nil {
			err = fn(w, r)
		}
		if err != nil {
			h.fail(w, r, err)
		}
	}
}

// maxFlash bounds a flash message (a cookie holds about 4 KB).
const maxFlash = 1000

// flash remembers a message for the next page the browser shows.
func (h *handler) flash(w http.ResponseWriter, kind, text string) {
	text = trunc(maxFlash, text)
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: url.QueryEscape(kind + "|" + text), Path: h.cookiePath(),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: 60})
}

// takeFlash reads and clears the message.
func (h *handler) takeFlash(w http.ResponseWriter, r *http.Request) *flashMsg {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: h.cookiePath(), MaxAge: -1})
	v, err := url.QueryUnescape(c.Value)
	if err != nil {
		return nil
	}
	kind, text, ok := cutString(v, "|")
	if !ok || (kind != "ok" && kind != "error") {
		return nil
	}
	return &flashMsg{Kind: kind, Text: text}
}

type flashMsg struct{ Kind, Text string }

// redirect sends the browser back to a page of the dashboard: back must be
// a path inside it (anything else goes to the overview).
func (h *handler) redirect(w http.ResponseWriter, r *http.Request, back string) {
	u, err := url.Parse(back)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !isLocalPath(u.Path) {
		back = "/"
	} else {
		back = u.Path
		if u.RawQuery != "" {
			back += "?" + u.RawQuery
		}
	}
	http.Redirect(w, r, h.cfg.base+back, http.StatusSeeOther)
}

// isLocalPath reports whether p is one of the dashboard's paths (relative
// to the base), so a redirect cannot leave it.
func isLocalPath(p string) bool {
	return len(p) > 0 && p[0] == '/' && (len(p) == 1 || p[1] != '/' && p[1] != '\\')
}
