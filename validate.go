package backlog

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// validateText checks a name PostgreSQL will store as text: bounded
// length, no NUL byte, valid UTF-8, and not empty unless allowed.
func validateText(field, s string, maxLen int, emptyOK bool) error {
	switch {
	case s == "" && !emptyOK:
		return invalid(field, "must not be empty")
	case len(s) > maxLen:
		return invalid(field, "%d bytes exceeds the %d-byte limit", len(s), maxLen)
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, "%q contains a NUL byte", s)
	case !utf8.ValidString(s):
		return invalid(field, "%q is not valid UTF-8", s)
	}
	return nil
}

func validateType(t string) error { return validateText("type", t, MaxTypeBytes, false) }

// validateKey checks an ordering or unique key ("" means none).
func validateKey(field, k string) error { return validateText(field, k, MaxKeyBytes, true) }

// validateTags checks a job's or worker's tags: each key and value, their
// number, and the size of their JSON encoding (which postings carry).
func validateTags(field string, tags map[string]string) error {
	if len(tags) > MaxTags {
		return invalid(field, "%d tags exceeds the limit of %d", len(tags), MaxTags)
	}
	size := 2
	for k, v := range tags {
		switch {
		case k == "":
			return invalid(field, "empty tag key")
		case len(k) > MaxTagBytes || len(v) > MaxTagBytes:
			return invalid(field, "tag %q: key and value must be at most %d bytes", k, MaxTagBytes)
		case strings.IndexByte(k, 0) >= 0:
			return invalid(field, "tag key %q contains a NUL byte", k)
		case strings.IndexByte(v, 0) >= 0:
			return invalid(field, "tag %q: value contains a NUL byte", k)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return invalid(field, "tag %q is not valid UTF-8", k)
		}
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(v)
		size += len(kb) + len(vb) + 2
	}
	if size > MaxTagsBytes {
		return invalid(field, "%d bytes of tags (JSON) exceeds the %d-byte limit", size, MaxTagsBytes)
	}
	return nil
}

// validateStoredJSON checks that valid JSON text can be stored as jsonb:
// valid UTF-8, no \u0000 escape (jsonb cannot hold a NUL character), and no
// unpaired UTF-16 surrogate escape (which PostgreSQL rejects).
func validateStoredJSON(field string, b []byte) error {
	if !utf8.Valid(b) {
		return invalid(field, "not valid UTF-8")
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		i++ // the escaped character; in valid JSON a backslash is always inside a string
		if i >= len(b) || b[i] != 'u' {
			continue
		}
		r, ok := hex4(b, i+1)
		if !ok {
			continue // json.Valid rejected this already
		}
		i += 4
		switch {
		case r == 0:
			return invalid(field, `contains a NUL character (\u0000), which PostgreSQL cannot store`)
		case r >= 0xDC00 && r <= 0xDFFF:
			return invalid(field, `contains an unpaired UTF-16 surrogate (\u%04x), which PostgreSQL rejects`, r)
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := rune(0), false
			if i+2 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
				lo, ok = hex4(b, i+3)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return invalid(field, `contains an unpaired UTF-16 surrogate (\u%04x), which PostgreSQL rejects`, r)
			}
			i += 6
		}
	}
	return nil
}

// hex4 decodes the four hex digits at b[at:].
func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// encodeJSON turns v into JSON text PostgreSQL can store: raw JSON
// (json.RawMessage or []byte) is validated, anything else marshalled. The
// result must fit limit bytes.
func encodeJSON(field string, v any, limit int) (json.RawMessage, error) {
	var b []byte
	switch a := v.(type) {
	case nil:
		b = []byte("null")
	case json.RawMessage:
		if !json.Valid(a) {
			return nil, invalid(field, "not valid JSON")
		}
		b = a
	case []byte:
		if !json.Valid(a) {
			return nil, invalid(field, "not valid JSON")
		}
		b = a
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, invalid(field, "cannot marshal %T: %v", v, err)
		}
	}
	if len(b) > limit {
		return nil, invalid(field, "%d bytes exceeds the %d-byte limit", len(b), limit)
	}
	if err := validateStoredJSON(field, b); err != nil {
		return nil, err
	}
	return append(json.RawMessage(nil), b...), nil
}

// encodeArgs turns a job's args into JSON text.
func encodeArgs(args any) (json.RawMessage, error) { return encodeJSON("args", args, MaxArgsBytes) }

// minRunAt and maxRunAt bound RunAt to what every system agrees on
// (PostgreSQL's timestamptz goes further; Go's time formatting does not).
var (
	minRunAt = time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)
	maxRunAt = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// validateMillis checks a duration PostgreSQL stores in whole milliseconds:
// 0, or at least 1ms. Sub-millisecond parts are rounded up by the caller.
func validateMillis(field string, d time.Duration, upper time.Duration) error {
	switch {
	case d < 0:
		return invalid(field, "must not be negative, got %s", d)
	case d > 0 && d < time.Millisecond:
		return invalid(field, "%s is shorter than the 1ms resolution (use 0 for none)", d)
	case upper > 0 && d > upper:
		return invalid(field, "%s exceeds the limit of %s", d, upper)
	}
	return nil
}

// ceilMillis rounds d up to whole milliseconds.
func ceilMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

func fieldErr(index int, batch bool, err error) error {
	if !batch {
		return err
	}
	return fmt.Errorf("job %d: %w", index, err)
}

// buildBatch validates specs and turns them into rows; graph reports
// whether any job uses dependencies, ordering or unique keys.
func buildBatch(specs []JobSpec) ([]store.GraphJob, bool, error) {
	if len(specs) > MaxBatchJobs {
		return nil, false, invalid("jobs", "%d jobs in one call exceeds the limit of %d (split the batch; inside one transaction, call EnqueueManyTx several times)", len(specs), MaxBatchJobs)
	}
	jobs := make([]store.GraphJob, len(specs))
	index := make(map[uuid.UUID]int, len(specs))
	graph := false
	wrap := func(i int, err error) error { return fieldErr(i, len(specs) > 1, err) }
	for i, s := range specs {
		j, err := buildJob(s)
		if err != nil {
			return nil, false, wrap(i, err)
		}
		if _, dup := index[j.ID]; dup {
			return nil, false, wrap(i, invalid("id", "%s appears twice in the batch", j.ID))
		}
		index[j.ID] = i
		jobs[i] = j
		graph = graph || len(j.DependsOn) > 0 || j.OrderingKey != "" || j.UniqueKey != ""
	}
	if !graph {
		return jobs, false, nil
	}
	// A unique job may be a duplicate and then is not inserted: no other
	// member of the batch may wait for it.
	lastOfKey := map[string]int{}
	for i, j := range jobs {
		for _, d := range j.DependsOn {
			if d == j.ID {
				return nil, false, wrap(i, invalid("depends on", "job %s depends on itself", d))
			}
			if bi, ok := index[d]; ok && jobs[bi].UniqueKey != "" {
				return nil, false, wrap(i, invalid("depends on", "job %s has a unique key; batch members cannot depend on it", d))
			}
		}
		if k := j.OrderingKey; k != "" {
			if p, ok := lastOfKey[k]; ok && jobs[p].UniqueKey != "" {
				return nil, false, wrap(i, invalid("ordering key", "job %s has a unique key; no later batch member may share its ordering key", jobs[p].ID))
			}
			lastOfKey[k] = i
		}
	}
	if cyc := findCycle(jobs, index); cyc != nil {
		return nil, false, invalid("depends on", "the batch has a dependency cycle: %v", cyc)
	}
	return jobs, true, nil
}

// findCycle returns the IDs of a dependency cycle among batch members, or
// nil.
func findCycle(jobs []store.GraphJob, index map[uuid.UUID]int) []uuid.UUID {
	state := make([]uint8, len(jobs)) // 0 new, 1 on the stack, 2 done
	var stack []uuid.UUID
	var cycle []uuid.UUID
	var visit func(i int) bool
	visit = func(i int) bool {
		state[i] = 1
		stack = append(stack, jobs[i].ID)
		for _, d := range jobs[i].DependsOn {
			bi, ok := index[d]
			if !ok {
				continue
			}
			if state[bi] == 1 {
				for k, id := range stack {
					if id == d {
						cycle = append(append([]uuid.UUID(nil), stack[k:]...), d)
						return true
					}
				}
			}
			if state[bi] == 0 && visit(bi) {
				return true
			}
		}
		stack = stack[:len(stack)-1]
		state[i] = 2
		return false
	}
	for i := range jobs {
		if state[i] == 0 && visit(i) {
			return cycle
		}
	}
	return nil
}

// buildJob validates one spec and turns it into a row.
func buildJob(s JobSpec) (store.GraphJob, error) {
	if err := validateType(s.Type); err != nil {
		return store.GraphJob{}, err
	}
	c := enqueueConfig{priority: DefaultPriority, maxAttempts: DefaultMaxAttempts}
	for _, o := range s.Options {
		if o == nil {
			return store.GraphJob{}, invalid("options", "nil option")
		}
		o.applyEnqueue(&c)
	}
	args, err := encodeArgs(s.Args)
	if err != nil {
		return store.GraphJob{}, err
	}
	if err := validateTags("tags", c.tags); err != nil {
		return store.GraphJob{}, err
	}
	switch {
	case c.priority < MinPriority || c.priority > MaxPriority:
		return store.GraphJob{}, invalid("priority", "%d is outside [%d, %d]", c.priority, MinPriority, MaxPriority)
	case c.maxAttempts < 1 || c.maxAttempts > MaxAttemptsLimit:
		return store.GraphJob{}, invalid("max attempts", "must be in [1, %d], got %d", MaxAttemptsLimit, c.maxAttempts)
	case c.delay < 0:
		return store.GraphJob{}, invalid("delay", "must not be negative, got %s", c.delay)
	case c.runAt != nil && c.runAt.IsZero():
		return store.GraphJob{}, invalid("run at", "zero time")
	case c.runAt != nil && (c.runAt.Before(minRunAt) || c.runAt.After(maxRunAt)):
		return store.GraphJob{}, invalid("run at", "%s is outside the years 1 to 9999", c.runAt.UTC().Format(time.RFC3339))
	case c.catchUp != 0:
		return store.GraphJob{}, invalid("catch up", "only for periodic jobs (Every, Cron)")
	case len(c.dependsOn) > MaxDependsOn:
		return store.GraphJob{}, invalid("depends on", "%d prerequisites exceeds the limit of %d", len(c.dependsOn), MaxDependsOn)
	}
	if err := validateMillis("timeout", c.timeout, 0); err != nil {
		return store.GraphJob{}, err
	}
	if err := validateKey("ordering key", c.orderingKey); err != nil {
		return store.GraphJob{}, err
	}
	if err := validateKey("unique key", c.uniqueKey); err != nil {
		return store.GraphJob{}, err
	}
	var deps []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, d := range c.dependsOn {
		if d == uuid.Nil {
			return store.GraphJob{}, invalid("depends on", "nil job ID")
		}
		if !seen[d] {
			seen[d] = true
			deps = append(deps, d)
		}
	}
	tags := json.RawMessage(`{}`)
	if len(c.tags) > 0 {
		tags, _ = json.Marshal(map[string]string(c.tags)) // strings only: cannot fail
	}
	id := s.ID
	if id == uuid.Nil {
		id = NewID()
	}
	return store.GraphJob{
		NewJob: store.NewJob{ID: id, Type: s.Type, Args: args, Tags: tags, Priority: int16(c.priority), RunAt: c.runAt,
			Delay: ceilMillis(c.delay), MaxAttempts: int32(c.maxAttempts), Timeout: ceilMillis(c.timeout)},
		DependsOn: deps, OrderingKey: c.orderingKey, UniqueKey: c.uniqueKey,
	}, nil
}
