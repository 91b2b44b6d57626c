package backlog

import (
	"encoding/json"
	"sort"

	"github.com/backlogq/backlog/internal/posting"
)

// A domain is the set of workers that want the same job types with the same
// worker tags. They share one claim query at a time (see Acquirer).
type domainSpec struct {
	key   string            // canonical: see posting.Key
	types []string          // sorted, distinct
	tags  map[string]string // worker tags
	tagsJ json.RawMessage   // tags as a JSON object, for the claim
}

// newDomainSpec validates and canonicalises types and tags.
func newDomainSpec(types []string, tags map[string]string) (*domainSpec, error) {
	if len(types) == 0 {
		return nil, invalid("types", "a Work call needs at least one job type (register handlers on a Mux or pass backlog.Types)")
	}
	ts := append([]string(nil), types...)
	sort.Strings(ts)
	out := ts[:0]
	for i, t := range ts {
		if err := validateType(t); err != nil {
			return nil, err
		}
		if i == 0 || t != ts[i-1] {
			out = append(out, t)
		}
	}
	if err := validateTags("worker tags", tags); err != nil {
		return nil, err
	}
	tg := make(map[string]string, len(tags))
	for k, v := range tags {
		tg[k] = v
	}
	tj, err := json.Marshal(tg)
	if err != nil {
		return nil, invalid("worker tags", "%v", err)
	}
	return &domainSpec{key: posting.Key(out, tg), types: out, tags: tg, tagsJ: tj}, nil
}

// matches reports whether a job of this type and tags can run in the
// domain: the same rule as the claim's SQL (type = ANY(types) AND
// job.tags <@ worker.tags).
func (d *domainSpec) matches(typ string, tags map[string]string) bool {
	i := sort.SearchStrings(d.types, typ)
	if i == len(d.types) || d.types[i] != typ {
		return false
	}
	return tagsSubset(tags, d.tags)
}

// tagsSubset reports whether every tag of job is in worker with the same
// value (jsonb containment of two string→string objects).
func tagsSubset(job, worker map[string]string) bool {
	for k, v := range job {
		if wv, ok := worker[k]; !ok || wv != v {
			return false
		}
	}
	return true
}
