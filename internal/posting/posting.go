// Package posting defines the payload of a NOTIFY on a queue's channel, as
// Go sends and reads it (the SQL functions send the same format), and the
// coalescing of postings into one payload per (type, tags).
package posting

import (
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// Posting is the payload of a NOTIFY on the schema's channel. Most announce
// that jobs of a type and tags became available; Sched that jobs were
// scheduled, the earliest due in In (for the promoters, whatever the type);
// Cancel asks the worker holding a job to stop it; Done tells waiters a job
// has finished.
type Posting struct {
	Type  string            `json:"type,omitempty"`
	Tags  map[string]string `json:"tags,omitempty"`
	Sched bool              `json:"sched,omitempty"`
	Src   string            `json:"src,omitempty"` // the Queue that sent it, when it woke its own workers already
	// Hold: types paused, or whose limits were tightened: processes give
	// back their prefetched jobs (acquirer.drop). Named "pause" on the
	// wire, which processes of earlier versions act on the same way.
	Hold   []string `json:"pause,omitempty"`
	In     int64    `json:"in,omitempty"` // Sched: milliseconds until due
	Cancel string   `json:"cancel,omitempty"`
	Done   string   `json:"done,omitempty"`
}

// schedKey is the coalescing key of scheduled postings: one is enough,
// carrying the earliest due time.
const schedKey = "\x00sched"

// Key identifies what a posting announces, for coalescing.
func (p Posting) Key() string {
	if p.Sched {
		return schedKey
	}
	if len(p.Hold) > 0 {
		return "\x00hold\x00" + strings.Join(p.Hold, "\x00")
	}
	return typeKey(p.Type, p.Tags)
}

// Sched announces jobs scheduled, the earliest due in in.
func Sched(in time.Duration) Posting {
	return Posting{Sched: true, In: max(in.Milliseconds(), 0)}
}

// MaxBytes bounds one NOTIFY payload (PostgreSQL refuses payloads of
// 8,000 bytes or more). A posting whose tags would not fit is sent without
// them: it then wakes every domain of its type, a superset of those it
// concerns, which is harmless.
const MaxBytes = 7000

// Encode returns p's payload, bounded by MaxBytes by construction: types
// are at most the root package's maxTypeBytes, and tags are dropped when
// they do not fit. Payloads built in SQL come from its twin, the schema's
// posting() function (migration 0019), which the root package's
// posting_sql_test.go holds to it.
func Encode(p Posting) string {
	b, _ := json.Marshal(p) // strings and ints only: cannot fail
	if len(b) > MaxBytes {
		p.Tags = nil
		b, _ = json.Marshal(p)
	}
	return string(b)
}

// EncodeAll returns one payload per distinct (type, tags), and one
// scheduled posting carrying the earliest due time.
func EncodeAll(ps []Posting) []string {
	ps = Dedupe(ps)
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, Encode(p))
	}
	return out
}

// Dedupe keeps one posting per (type, tags), and one scheduled
// posting with the earliest due time.
func Dedupe(ps []Posting) []Posting {
	if len(ps) < 2 {
		return ps
	}
	idx := make(map[string]int, len(ps))
	out := ps[:0:0]
	for _, p := range ps {
		k := p.Key()
		if i, ok := idx[k]; ok {
			out[i].In = min(out[i].In, p.In)
			continue
		}
		idx[k] = len(out)
		out = append(out, p)
	}
	return out
}

// typeKey identifies a (type, tags) pair.
func typeKey(typ string, tags map[string]string) string {
	return Key([]string{typ}, tags)
}

// Of is the posting of jobs of a type and tags made available.
func Of(typ string, tags []byte) Posting {
	return Posting{Type: typ, Tags: DecodeTags(tags)}
}

// OfAvail are the postings of jobs the store made available or
// scheduled.
func OfAvail(avail []store.Avail) []Posting {
	out := make([]Posting, 0, len(avail))
	for _, a := range avail {
		if a.Scheduled {
			out = append(out, Sched(a.In))
		} else {
			out = append(out, Of(a.Type, a.Tags))
		}
	}
	return Dedupe(out)
}

// DecodeTags decodes a job's tags for a posting; tags too large for one
// are left out (see MaxBytes).
func DecodeTags(tags []byte) map[string]string {
	if len(tags) <= 2 || len(tags) > MaxBytes { // "{}", or too large to post
		return nil
	}
	var m map[string]string
	if json.Unmarshal(tags, &m) != nil {
		return nil // not ours to judge: a type-only posting still wakes the domain
	}
	return m
}

// Key is the canonical key of (types, tags), shared by postings (for
// coalescing) and the acquirer's domains (a posting wakes the domain of
// its key): sorted types, then sorted
// key=value tags, every item NUL-terminated, with a NUL between the two
// lists. Types and tags never contain NUL, so distinct domains never share
// a key.
func Key(sortedTypes []string, tags map[string]string) string {
	var b strings.Builder
	for _, t := range sortedTypes {
		b.WriteString(t)
		b.WriteByte(0)
	}
	b.WriteByte(0)
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(tags[k])
		b.WriteByte(0)
	}
	return b.String()
}
