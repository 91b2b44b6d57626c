package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/pflag"

	"github.com/backlogq/backlog"
)

// filterFlags are backlog.Filter's fields as flags.
type filterFlags struct {
	states, types, tags                                        []string
	orderingKey, uniqueKey, concurrencyKey, errorContains      string
	createdAfter, createdBefore, finishedAfter, finishedBefore string
	ids                                                        []string
	now                                                        func() time.Time
}

func (f *filterFlags) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.states, "state", nil, "jobs in these states (repeat or comma-separate): blocked, scheduled, available, running, completed, failed, cancelled")
	fs.StringSliceVar(&f.types, "type", nil, "jobs of these types (repeat or comma-separate)")
	fs.StringArrayVar(&f.tags, "tag", nil, "jobs with this tag, as key=value (repeat for all of several)")
	fs.StringVar(&f.orderingKey, "ordering-key", "", "jobs with this ordering key")
	fs.StringVar(&f.uniqueKey, "unique-key", "", "jobs with this unique key")
	fs.StringVar(&f.concurrencyKey, "concurrency-key", "", "jobs with this concurrency key (flow control)")
	fs.StringVar(&f.errorContains, "error-contains", "", "jobs whose last error contains this text (case insensitive)")
	fs.StringVar(&f.createdAfter, "created-after", "", "jobs created at or after this time: RFC 3339, YYYY-MM-DD (UTC) or a duration ago (90m)")
	fs.StringVar(&f.createdBefore, "created-before", "", "jobs created before this time (as --created-after)")
	fs.StringVar(&f.finishedAfter, "finished-after", "", "jobs finished at or after this time (as --created-after)")
	fs.StringVar(&f.finishedBefore, "finished-before", "", "jobs finished before this time (as --created-after)")
	fs.StringSliceVar(&f.ids, "id", nil, "only these job IDs (repeat or comma-separate)")
}

// set reports whether any filter flag was given.
func (f *filterFlags) set() bool {
	return len(f.states) > 0 || len(f.types) > 0 || len(f.tags) > 0 || f.orderingKey != "" || f.uniqueKey != "" || f.concurrencyKey != "" ||
		f.errorContains != "" || f.createdAfter != "" || f.createdBefore != "" || f.finishedAfter != "" ||
		f.finishedBefore != "" || len(f.ids) > 0
}

// filter builds the Filter; bad values are usage errors (the library
// checks the rest).
func (f *filterFlags) filter() (backlog.Filter, error) {
	var out backlog.Filter
	for _, s := range f.states {
		st := backlog.State(strings.ToLower(strings.TrimSpace(s)))
		if !slices.Contains(allStates, st) {
			names := make([]string, len(allStates))
			for i, s := range allStates {
				names[i] = string(s)
			}
			return out, usagef("--state %q: want one of %s", s, strings.Join(names, ", "))
		}
		out.States = append(out.States, st)
	}
	out.Types = f.types
	tags, err := parseTags(f.tags)
	if err != nil {
		return out, err
	}
	out.Tags = tags
	out.OrderingKey, out.UniqueKey, out.ErrorContains = f.orderingKey, f.uniqueKey, f.errorContains
	out.ConcurrencyKey = f.concurrencyKey
	now := time.Now
	if f.now != nil {
		now = f.now
	}
	for _, t := range []struct {
		flag, val string
		to        *time.Time
	}{
		{"created-after", f.createdAfter, &out.CreatedAfter}, {"created-before", f.createdBefore, &out.CreatedBefore},
		{"finished-after", f.finishedAfter, &out.FinishedAfter}, {"finished-before", f.finishedBefore, &out.FinishedBefore},
	} {
		if t.val == "" {
			continue
		}
		if *t.to, err = parsePast(t.val, now()); err != nil {
			return out, usagef("--%s: %v", t.flag, err)
		}
	}
	ids, err := parseIDs(f.ids)
	if err != nil {
		return out, err
	}
	out.IDs = ids
	return out, nil
}

// parseTags reads key=value pairs.
func parseTags(kvs []string) (backlog.Tags, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	tags := backlog.Tags{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--tag %q: want key=value", kv)
		}
		tags[k] = v
	}
	return tags, nil
}

// parseIDs reads job IDs.
func parseIDs(ss []string) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	for _, s := range ss {
		id, err := uuid.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, usagef("%q is not a job ID (a UUID)", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// parsePast reads a time: RFC 3339, a date (UTC midnight), or a duration
// before now ("90m" and "-90m" alike).
func parsePast(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(s, "-")); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time (RFC 3339, YYYY-MM-DD) nor a duration ago (90m)", s)
}
