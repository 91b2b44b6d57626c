package backlog

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// posting is the payload of a NOTIFY on the schema's channel. Most announce
// that jobs of a type and tags became available; Sched that jobs were
// scheduled, the earliest due in In (for the promoters, whatever the type);
// Cancel asks the worker holding a job to stop it; Done tells waiters a job
// has finished.
type posting struct {
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

// key identifies what a posting announces, for coalescing.
func (p posting) key() string {
	if p.Sched {
		return schedKey
	}
	if len(p.Hold) > 0 {
		return "\x00hold\x00" + strings.Join(p.Hold, "\x00")
	}
	return postingKey(p.Type, p.Tags)
}

// schedPosting announces jobs scheduled, the earliest due in in.
func schedPosting(in time.Duration) posting {
	return posting{Sched: true, In: max(in.Milliseconds(), 0)}
}

// maxPostingBytes bounds one NOTIFY payload (PostgreSQL refuses payloads of
// 8,000 bytes or more). A posting whose tags would not fit is sent without
// them: it then wakes every domain of its type, a superset of those it
// concerns, which is harmless.
const maxPostingBytes = 7000

// encodePosting returns p's payload, bounded by maxPostingBytes by
// construction: types are at most MaxTypeBytes, and tags are dropped when
// they do not fit.
func encodePosting(p posting) string {
	b, _ := json.Marshal(p) // strings and ints only: cannot fail
	if len(b) > maxPostingBytes {
		p.Tags = nil
		b, _ = json.Marshal(p)
	}
	return string(b)
}

// encodePostings returns one payload per distinct (type, tags), and one
// scheduled posting carrying the earliest due time.
func encodePostings(ps []posting) []string {
	ps = dedupePostings(ps)
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, encodePosting(p))
	}
	return out
}

// dedupePostings keeps one posting per (type, tags), and one scheduled
// posting with the earliest due time.
func dedupePostings(ps []posting) []posting {
	if len(ps) < 2 {
		return ps
	}
	idx := make(map[string]int, len(ps))
	out := ps[:0:0]
	for _, p := range ps {
		k := p.key()
		if i, ok := idx[k]; ok {
			out[i].In = min(out[i].In, p.In)
			continue
		}
		idx[k] = len(out)
		out = append(out, p)
	}
	return out
}

// postingKey identifies a (type, tags) pair.
func postingKey(typ string, tags map[string]string) string {
	return domainKey([]string{typ}, tags)
}

// postingOf is the posting of jobs of a type and tags made available.
func postingOf(typ string, tags []byte) posting {
	return posting{Type: typ, Tags: decodeTags(tags)}
}

// postingsOf are the postings of jobs the store made available or
// scheduled.
func postingsOf(avail []store.Avail) []posting {
	out := make([]posting, 0, len(avail))
	for _, a := range avail {
		if a.Scheduled {
			out = append(out, schedPosting(a.In))
		} else {
			out = append(out, postingOf(a.Type, a.Tags))
		}
	}
	return dedupePostings(out)
}

// decodeTags decodes a job's tags for a posting; tags too large for one
// are left out (see maxPostingBytes).
func decodeTags(tags []byte) map[string]string {
	if len(tags) <= 2 || len(tags) > maxPostingBytes { // "{}", or too large to post
		return nil
	}
	var m map[string]string
	if json.Unmarshal(tags, &m) != nil {
		return nil // not ours to judge: a type-only posting still wakes the domain
	}
	return m
}
