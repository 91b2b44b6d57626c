package backlog

import (
	"encoding/json"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// posting is the payload of a NOTIFY on the schema's channel. Most announce
// that jobs of a type and tags became available, now or after In; Cancel
// asks the worker holding a job to stop it; Done tells waiters a job has
// finished.
type posting struct {
	Type   string            `json:"type,omitempty"`
	Tags   map[string]string `json:"tags,omitempty"`
	In     int64             `json:"in,omitempty"` // milliseconds until due; 0: due now
	Cancel string            `json:"cancel,omitempty"`
	Done   string            `json:"done,omitempty"`
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

// encodePostings returns one payload per distinct (type, tags), carrying
// the earliest due time among the postings of that pair.
func encodePostings(ps []posting) []string {
	ps = dedupePostings(ps)
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, encodePosting(p))
	}
	return out
}

// dedupePostings keeps one posting per (type, tags), with the earliest due
// time.
func dedupePostings(ps []posting) []posting {
	if len(ps) < 2 {
		return ps
	}
	idx := make(map[string]int, len(ps))
	out := ps[:0:0]
	for _, p := range ps {
		k := postingKey(p.Type, p.Tags)
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

// postingOf is the posting of one job about to be inserted.
func postingOf(typ string, tags []byte, delay time.Duration, runAt *time.Time) posting {
	p := posting{Type: typ, In: delay.Milliseconds()}
	if runAt != nil {
		p.In = time.Until(*runAt).Milliseconds()
	}
	p.In = max(p.In, 0)
	p.Tags = decodeTags(tags)
	return p
}

// postingsOf are the postings of jobs the store made available.
func postingsOf(avail []store.Avail) []posting {
	out := make([]posting, 0, len(avail))
	for _, a := range avail {
		out = append(out, posting{Type: a.Type, Tags: decodeTags(a.Tags), In: max(a.In.Milliseconds(), 0)})
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
