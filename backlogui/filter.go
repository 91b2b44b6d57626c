package backlogui

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/backlogq/backlog"
)

// allStates in the order the dashboard shows them.
var allStates = []backlog.State{backlog.StateBlocked, backlog.StateScheduled, backlog.StateAvailable, backlog.StateRunning,
	backlog.StateCompleted, backlog.StateFailed, backlog.StateCancelled}

// jobsQuery is the jobs page's filter as the user typed it (to refill the
// form) and as the API takes it.
type jobsQuery struct {
	States                            []string
	Type, Tags, OKey, UKey, CKey, Err string
	CreatedAfter, CreatedBefore       string
	FinishedAfter, FinishedBefore     string
	Oldest                            bool
	Limit                             int
	Cursor                            string

	filter backlog.Filter
	opts   backlog.ListOptions
}

// HasState reports whether the filter names s (for the form's checkboxes).
func (q *jobsQuery) HasState(s backlog.State) bool { return slices.Contains(q.States, string(s)) }

// Encode is the filter as a query string, without the cursor.
func (q *jobsQuery) Encode() string {
	v := url.Values{}
	for _, s := range q.States {
		v.Add("state", s)
	}
	for k, s := range map[string]string{"type": q.Type, "tags": q.Tags, "okey": q.OKey, "ukey": q.UKey, "ckey": q.CKey, "error": q.Err,
		"created_after": q.CreatedAfter, "created_before": q.CreatedBefore, "finished_after": q.FinishedAfter,
		"finished_before": q.FinishedBefore} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Oldest {
		v.Set("order", "oldest")
	}
	if q.Limit != 0 && q.Limit != backlog.DefaultListLimit {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v.Encode()
}

// timeLayouts are what the time fields accept: RFC 3339, or the
// browser's datetime-local value (taken as UTC).
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"}

func parseTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badRequest(field + ": not a time (use 2006-01-02T15:04 or RFC 3339): " + strconv.Quote(s))
}

// parseJobsQuery reads the jobs filter from a query string; a malformed
// value is a 400.
func parseJobsQuery(v url.Values) (*jobsQuery, error) {
	q := &jobsQuery{Type: strings.TrimSpace(v.Get("type")), Tags: strings.TrimSpace(v.Get("tags")),
		OKey: v.Get("okey"), UKey: v.Get("ukey"), CKey: v.Get("ckey"), Err: v.Get("error"),
		CreatedAfter: v.Get("created_after"), CreatedBefore: v.Get("created_before"),
		FinishedAfter: v.Get("finished_after"), FinishedBefore: v.Get("finished_before"), Cursor: v.Get("cursor")}
	for _, s := range v["state"] {
		if s == "" {
			continue
		}
		if !slices.Contains(allStates, backlog.State(s)) {
			return nil, badRequest("state: unknown state " + strconv.Quote(s))
		}
		q.States = append(q.States, s)
		q.filter.States = append(q.filter.States, backlog.State(s))
	}
	if q.Type != "" {
		for _, t := range strings.Split(q.Type, ",") {
			if t = strings.TrimSpace(t); t != "" {
				q.filter.Types = append(q.filter.Types, t)
			}
		}
	}
	if q.Tags != "" {
		q.filter.Tags = backlog.Tags{}
		for _, kv := range strings.Split(q.Tags, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || k == "" {
				return nil, badRequest("tags: want key=value pairs separated by commas, got " + strconv.Quote(q.Tags))
			}
			q.filter.Tags[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
	}
	q.filter.OrderingKey, q.filter.UniqueKey, q.filter.ErrorContains = q.OKey, q.UKey, q.Err
	q.filter.ConcurrencyKey = q.CKey
	var err error
	for _, f := range []struct {
		name string
		s    string
		t    *time.Time
	}{{"created_after", q.CreatedAfter, &q.filter.CreatedAfter}, {"created_before", q.CreatedBefore, &q.filter.CreatedBefore},
		{"finished_after", q.FinishedAfter, &q.filter.FinishedAfter}, {"finished_before", q.FinishedBefore, &q.filter.FinishedBefore}} {
		if *f.t, err = parseTime(f.name, f.s); err != nil {
			return nil, err
		}
	}
	switch o := v.Get("order"); o {
	case "", "newest":
	case "oldest":
		q.Oldest = true
	default:
		return nil, badRequest("order: want newest or oldest, got " + strconv.Quote(o))
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > backlog.MaxListLimit {
			return nil, badRequest("limit: want a number from 1 to " + strconv.Itoa(backlog.MaxListLimit) + ", got " + strconv.Quote(l))
		}
		q.Limit = n
	}
	q.opts = backlog.ListOptions{Oldest: q.Oldest, Limit: q.Limit, Cursor: q.Cursor}
	return q, nil
}
