package backlog

import (
	"encoding/json"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on input that callers may need to size or check their own input
// against (the package doc's "Limits and defaults" lists every limit).
// Inputs over them are rejected with an *InputError naming the field.
const (
	MaxArgsBytes     = 1 << 20  // encoded args
	MaxResultBytes   = 64 << 10 // encoded result (Job.SetResult)
	MaxProgressBytes = 4 << 10  // encoded progress (Job.SetProgress)
	MaxMetadataBytes = 4096     // the JSON encoding of one job's metadata
	MinPriority      = 0        // runs first
	MaxPriority      = 100      // runs last
	MaxBatchJobs     = 10_000   // jobs in one EnqueueMany, EnqueueManyTx or InsertMany call
)

// The other limits on input, stated in the package doc ("Limits and
// defaults") and in the docs of the options they bound.
const (
	maxTypeBytes     = 200       // length of a job type or schedule name
	maxTagBytes      = 200       // length of a tag key or value
	maxTags          = 32        // tags per job or worker
	maxTagsBytes     = 4096      // the JSON encoding of one job's or worker's tags
	maxKeyBytes      = 255       // length of an ordering, unique or concurrency key
	maxDependsOn     = 1000      // prerequisites of one job
	maxAttemptsLimit = 1_000_000 // the largest MaxAttempts
	maxWorkerIDBytes = 200       // length of WithWorkerID
)

var schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

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

func validateType(t string) error { return validateText("type", t, maxTypeBytes, false) }

// validateKey checks an ordering, unique or concurrency key ("" means none).
func validateKey(field, k string) error { return validateText(field, k, maxKeyBytes, true) }

// validateTags checks a job's or worker's tags: each key and value, their
// number, and the size of their JSON encoding (which postings carry).
func validateTags(field string, tags map[string]string) error {
	if len(tags) > maxTags {
		return invalid(field, "%d tags exceeds the limit of %d", len(tags), maxTags)
	}
	size := 2
	for k, v := range tags {
		switch {
		case k == "":
			return invalid(field, "empty tag key")
		case len(k) > maxTagBytes || len(v) > maxTagBytes:
			return invalid(field, "tag %q: key and value must be at most %d bytes", k, maxTagBytes)
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
	if size > maxTagsBytes {
		return invalid(field, "%d bytes of tags (JSON) exceeds the %d-byte limit", size, maxTagsBytes)
	}
	return nil
}

// validateMetadata checks a job's metadata: keys not empty, keys and
// values valid UTF-8 without NUL bytes, and its JSON encoding (returned,
// nil when there is none) within MaxMetadataBytes.
func validateMetadata(m map[string]string) (json.RawMessage, error) {
	if len(m) == 0 {
		return nil, nil
	}
	for k, v := range m {
		switch {
		case k == "":
			return nil, invalid("metadata", "empty key")
		case strings.IndexByte(k, 0) >= 0:
			return nil, invalid("metadata", "key %q contains a NUL byte", k)
		case strings.IndexByte(v, 0) >= 0:
			return nil, invalid("metadata", "%q: value contains a NUL byte", k)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return nil, invalid("metadata", "%q is not valid UTF-8", k)
		case len(k)+len(v) > MaxMetadataBytes:
			return nil, invalid("metadata", "%q: %d bytes exceeds the %d-byte limit", k, len(k)+len(v), MaxMetadataBytes)
		}
	}
	b, err := json.Marshal(m) // strings only: cannot fail
	if err != nil {
		return nil, invalid("metadata", "%v", err)
	}
	if len(b) > MaxMetadataBytes {
		return nil, invalid("metadata", "%d bytes (JSON) exceeds the %d-byte limit", len(b), MaxMetadataBytes)
	}
	return b, nil
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
