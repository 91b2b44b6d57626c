package backlogui_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/backlogui/internal/seed"
)

// limitOf reads typ's limits (nil: none).
func limitOf(t *testing.T, q *backlog.Queue, typ string) *backlog.Limit {
	t.Helper()
	ls, err := q.Limits(context.Background())
	require.NoError(t, err)
	for _, l := range ls {
		if l.Type == typ {
			return &l.Limit
		}
	}
	return nil
}

// TestEditLimits: the types page links to a type's limits form; review
// shows the change and writes nothing; apply writes it; removal goes
// through its own confirmation.
func TestEditLimits(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	typ := seed.TypeEmail
	form := u.page("/types/limits?type=" + url.QueryEscape(typ))
	require.Contains(t, form, `<strong id="limit-now">none</strong>`)
	require.Contains(t, form, `name="concurrency"`)
	require.NotContains(t, form, `id="limit-remove"`) // nothing to remove

	set := url.Values{"type": {typ}, "action": {"set"}, "concurrency": {"5"}, "key_concurrency": {"2"}, "rate": {"100"},
		"per": {"1m"}, "burst": {""}, "rate_per_key": {"on"}}
	set.Set("step", "review")
	status, _, body := u.act("/types/limits", set)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `<strong id="limit-new">concurrency 5; 2 per concurrency key; rate 100/1m, per key</strong> (burst: the default)`)
	require.Contains(t, body, `name="step" value="apply"`)
	require.Nil(t, limitOf(t, u.q, typ), "the review wrote the limits")

	set.Set("step", "apply")
	status, loc, body := u.act("/types/limits", set)
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Equal(t, "/types", loc)
	require.Equal(t, &backlog.Limit{Concurrency: 5, KeyConcurrency: 2, Rate: 100, Per: time.Minute, Burst: 1, RatePerKey: true},
		limitOf(t, u.q, typ))
	types := u.page("/types")
	require.Contains(t, types, "Set the limits of "+typ+": concurrency 5; 2 per concurrency key; rate 100/1m, per key.")
	require.Regexp(t, `<tr data-type="`+typ+`">(.|\n)*?<li>concurrency 5</li>`, types)

	// The form shows the limits as they are now.
	form = u.page("/types/limits?type=" + url.QueryEscape(typ))
	require.Contains(t, form, `name="concurrency" inputmode="numeric" value="5"`)
	require.Contains(t, form, `name="per" value="1m0s"`)
	require.Contains(t, form, `id="limit-remove"`)

	// Removal: confirmation first, then the write.
	rm := url.Values{"type": {typ}, "action": {"remove"}, "step": {"review"}}
	status, _, body = u.act("/types/limits", rm)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "Remove every limit of <strong>"+typ+"</strong>?")
	require.NotNil(t, limitOf(t, u.q, typ))
	rm.Set("step", "apply")
	status, _, body = u.act("/types/limits", rm)
	require.Equal(t, http.StatusSeeOther, status, body)
	require.Nil(t, limitOf(t, u.q, typ))
}

// TestEditLimitsHostile: bad values show the form again with the
// InputError naming the field (400) and write nothing, at review and at
// apply; a missing CSRF token, read-only mode and an Authorize denial
// refuse (403) and write nothing; a hostile type name is escaped.
func TestEditLimitsHostile(t *testing.T) {
	t.Parallel()
	u := newUI(t)
	typ := seed.TypeOK
	require.NoError(t, u.q.SetLimit(context.Background(), typ, backlog.Limit{Concurrency: 3}))
	want := &backlog.Limit{Concurrency: 3}
	for _, c := range []struct {
		fields url.Values
		err    string
	}{
		{url.Values{"concurrency": {"-1"}}, "backlog: invalid concurrency: must be in [1, 1073741824], or 0 for none; got -1"},
		{url.Values{"concurrency": {"lots"}}, "backlog: invalid concurrency: want a whole number, got &#34;lots&#34;"},
		{url.Values{"concurrency": {"99999999999999999999"}}, "backlog: invalid concurrency: want a whole number"},
		{url.Values{"key_concurrency": {"5"}, "concurrency": {"2"}}, "backlog: invalid key concurrency: 5 is more than the type&#39;s concurrency (2)"},
		{url.Values{"rate": {"10"}, "per": {"soon"}}, "backlog: invalid per: want a duration such as 1s or 1m, got &#34;soon&#34;"},
		{url.Values{"rate": {"10"}, "per": {"0s"}}, "backlog: invalid per: the rate&#39;s period must be in [1ms, 8784h0m0s], got 0s"},
		{url.Values{"rate": {"10"}, "per": {"1s"}, "burst": {"11"}}, "backlog: invalid burst: 11 is more than the rate (10)"},
		{url.Values{"concurrency": {"1"}, "burst": {"3"}}, "backlog: invalid rate: Per, Burst and RatePerKey need a Rate"},
		{url.Values{}, "backlog: invalid limit: sets no limit"},
	} {
		for _, step := range []string{"review", "apply"} {
			f := url.Values{"type": {typ}, "action": {"set"}, "step": {step}}
			for k, v := range c.fields {
				f[k] = v
			}
			status, _, body := u.act("/types/limits", f)
			require.Equal(t, http.StatusBadRequest, status, "%v %s: %s", c.fields, step, body)
			require.Contains(t, body, `<p class="flash flash-error" role="alert" id="limit-error">`+c.err, "%v %s", c.fields, step)
			require.Contains(t, body, `name="step" value="review"`, "the form is shown again")
			require.Equal(t, want, limitOf(t, u.q, typ), "%v %s wrote", c.fields, step)
		}
	}
	for _, f := range []url.Values{
		{"type": {typ}, "action": {"explode"}, "step": {"apply"}},
		{"type": {typ}, "action": {"set"}, "step": {"now"}},
		{"action": {"set"}, "step": {"apply"}, "concurrency": {"1"}},
		{"type": {"bad\x00type"}, "action": {"set"}, "step": {"apply"}, "concurrency": {"1"}},
	} {
		status, _, body := u.act("/types/limits", f)
		require.Equal(t, http.StatusBadRequest, status, "%v: %s", f, body)
	}

	// No CSRF token: refused, nothing written.
	apply := url.Values{"type": {typ}, "action": {"set"}, "step": {"apply"}, "concurrency": {"9"}}
	status, _, body := u.post("/types/limits", apply)
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, "CSRF")
	rm := url.Values{"type": {typ}, "action": {"remove"}, "step": {"apply"}}
	status, _, _ = u.post("/types/limits", rm)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, want, limitOf(t, u.q, typ))

	// A hostile type name is text in the form and the confirmation.
	xss := `"><img src=x onerror=alert(1)>`
	form := u.page("/types/limits?type=" + url.QueryEscape(xss))
	require.NotContains(t, form, "<img")
	require.Contains(t, form, `value="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"`)
	status, _, body = u.act("/types/limits", url.Values{"type": {xss}, "action": {"set"}, "step": {"review"}, "concurrency": {"1"}})
	require.Equal(t, http.StatusOK, status, body)
	require.NotContains(t, body, "<img")

	// Read-only: neither the form nor the writes.
	ro := newUI(t, backlogui.WithReadOnly(true))
	require.NotContains(t, ro.page("/types"), "/types/limits")
	status, _ = ro.get("/types/limits?type=" + typ)
	require.Equal(t, http.StatusForbidden, status)
	for _, f := range []url.Values{apply, rm} {
		status, _, body = ro.post("/types/limits", f)
		require.Equal(t, http.StatusForbidden, status)
		require.Contains(t, body, "read-only")
	}
	require.Nil(t, limitOf(t, ro.q, typ))

	// Authorize is asked, at review and at apply, and its denial holds.
	var asked []string
	au := newUI(t, backlogui.WithAuthorize(func(r *http.Request, action string) error {
		asked = append(asked, action)
		return errors.New("only on-call may " + action)
	}))
	for _, step := range []string{"review", "apply"} {
		for _, f := range []url.Values{
			{"type": {typ}, "action": {"set"}, "step": {step}, "concurrency": {"9"}},
			{"type": {typ}, "action": {"remove"}, "step": {step}},
		} {
			status, _, body = au.act("/types/limits", f)
			require.Equal(t, http.StatusForbidden, status, body)
			require.Contains(t, body, "only on-call may "+map[string]string{"set": backlogui.ActionSetLimit,
				"remove": backlogui.ActionRemoveLimit}[f.Get("action")])
		}
	}
	require.Equal(t, []string{"set-limit", "remove-limit", "set-limit", "remove-limit"}, asked)
	require.Nil(t, limitOf(t, au.q, typ))
}
