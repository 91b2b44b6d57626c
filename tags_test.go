package backlog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

// TestTagMatchingTable runs the tag rule against real PostgreSQL: a job is
// claimed by a worker iff every job tag is among the worker tags with the
// same value, and the Go matcher used for postings agrees with the SQL.
func TestTagMatchingTable(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	_, err = migrate.Up(context.Background(), pool, schema, ms)
	require.NoError(t, err)
	st := store.New(pool, schema)

	type tags = map[string]string
	cases := []struct {
		name   string
		job    tags
		worker tags
		match  bool
	}{
		{"untagged job, untagged worker", nil, nil, true},
		{"untagged job, tagged worker", nil, tags{"region": "eu"}, true},
		{"untagged job, many worker tags", nil, tags{"a": "1", "b": "2", "c": "3"}, true},
		{"equal single tag", tags{"region": "eu"}, tags{"region": "eu"}, true},
		{"equal two tags", tags{"region": "eu", "gpu": "a100"}, tags{"gpu": "a100", "region": "eu"}, true},
		{"worker superset", tags{"region": "eu"}, tags{"region": "eu", "gpu": "a100"}, true},
		{"worker superset of two", tags{"a": "1", "b": "2"}, tags{"a": "1", "b": "2", "c": "3"}, true},
		{"tagged job, untagged worker", tags{"region": "eu"}, nil, false},
		{"conflicting value", tags{"region": "eu"}, tags{"region": "us"}, false},
		{"one of two conflicts", tags{"region": "eu", "gpu": "a100"}, tags{"region": "eu", "gpu": "h100"}, false},
		{"extra job tag", tags{"region": "eu", "gpu": "a100"}, tags{"region": "eu"}, false},
		{"disjoint keys", tags{"a": "1"}, tags{"b": "1"}, false},
		{"value case differs", tags{"region": "EU"}, tags{"region": "eu"}, false},
		{"key case differs", tags{"Region": "eu"}, tags{"region": "eu"}, false},
		{"empty value matches empty value", tags{"flag": ""}, tags{"flag": ""}, true},
		{"empty value vs non-empty", tags{"flag": ""}, tags{"flag": "x"}, false},
		{"non-empty vs empty value", tags{"flag": "x"}, tags{"flag": ""}, false},
		{"unicode equal", tags{"zone": "zürich"}, tags{"zone": "zürich"}, true},
		{"unicode differs", tags{"zone": "zürich"}, tags{"zone": "zurich"}, false},
		{"value with spaces", tags{"team": "data eng"}, tags{"team": "data eng", "x": "y"}, true},
		{"numeric-looking strings", tags{"n": "1"}, tags{"n": "01"}, false},
		{"value equals other key", tags{"a": "b"}, tags{"b": "a"}, false},
		{"three of three", tags{"a": "1", "b": "2", "c": "3"}, tags{"a": "1", "b": "2", "c": "3"}, true},
		{"three of two", tags{"a": "1", "b": "2", "c": "3"}, tags{"a": "1", "b": "2"}, false},
	}
	ctx := context.Background()
	// Each case runs twice: against a worker of one type, and against a
	// worker of several types (the claim function has a separate branch
	// for those, with its own tag filter). The several-types worker also
	// wants a type with a matching job queued behind the case's job, so a
	// branch that ignored tags would claim the wrong one.
	for i, c := range cases {
		for _, several := range []bool{false, true} {
			name := c.name + " (one type)"
			typ := fmt.Sprintf("tag.case.%d", i)
			types := []string{typ}
			if several {
				name = c.name + " (several types)"
				typ = fmt.Sprintf("tag.multi.%d.a", i)
				types = []string{typ, fmt.Sprintf("tag.multi.%d.b", i), fmt.Sprintf("tag.multi.%d.c", i)}
			}
			r, err := buildJob(JobSpec{Type: typ, Options: []EnqueueOption{Tags(c.job)}}.resolve())
			require.NoError(t, err, name)
			_, err = st.Insert(ctx, pool, []store.NewJob{r.NewJob}, nil)
			require.NoError(t, err, name)

			d, err := newDomainSpec(types, c.worker)
			require.NoError(t, err, name)
			require.Equal(t, c.match, d.matches(typ, c.job), "Go matcher: %s", name)
			res, err := st.Claim(ctx, d.types, d.tagsJ, 10, 10, time.Minute, "w", nil)
			require.NoError(t, err, name)
			require.False(t, res.Skipped, name)
			got := res.Jobs
			if c.match {
				require.Len(t, got, 1, "SQL claim: %s", name)
				require.Equal(t, r.ID, got[0].ID)
			} else {
				require.Empty(t, got, "SQL claim: %s", name)
				row, err := st.Get(ctx, pool, r.ID)
				require.NoError(t, err)
				require.Equal(t, "available", row.State, "untouched: %s", name)
				require.Equal(t, 0, row.Attempt, "untouched: %s", name)
			}
		}
	}
	// Several types, several tagged jobs at once: exactly the matching ones
	// are claimed, across types.
	type job struct {
		typ   string
		tags  tags
		match bool
	}
	worker := tags{"region": "eu", "gpu": "a100"}
	mixed := []job{
		{"mixed.a", nil, true},
		{"mixed.a", tags{"region": "us"}, false},
		{"mixed.b", tags{"region": "eu"}, true},
		{"mixed.b", tags{"region": "eu", "gpu": "h100"}, false},
		{"mixed.c", tags{"region": "eu", "gpu": "a100"}, true},
		{"mixed.c", tags{"zone": "x"}, false},
	}
	want := map[string]bool{}
	for _, j := range mixed {
		r, err := buildJob(JobSpec{Type: j.typ, Options: []EnqueueOption{Tags(j.tags)}}.resolve())
		require.NoError(t, err)
		_, err = st.Insert(ctx, pool, []store.NewJob{r.NewJob}, nil)
		require.NoError(t, err)
		if j.match {
			want[r.ID.String()] = true
		}
	}
	d, err := newDomainSpec([]string{"mixed.a", "mixed.b", "mixed.c"}, worker)
	require.NoError(t, err)
	res, err := st.Claim(ctx, d.types, d.tagsJ, 10, 10, time.Minute, "w", nil)
	require.NoError(t, err)
	got := map[string]bool{}
	for _, j := range res.Jobs {
		got[j.ID.String()] = true
	}
	require.Equal(t, want, got, "a worker of several types claims exactly the jobs whose tags it has")

	// A worker of several types claims across them in priority order.
	var ids []string
	for i, p := range []int{5, 1, 3} {
		r, err := buildJob(JobSpec{Type: fmt.Sprintf("multi.%d", i), Options: []EnqueueOption{Priority(p)}}.resolve())
		require.NoError(t, err)
		_, err = st.Insert(ctx, pool, []store.NewJob{r.NewJob}, nil)
		require.NoError(t, err)
		ids = append(ids, r.ID.String())
	}
	d, err = newDomainSpec([]string{"multi.0", "multi.1", "multi.2"}, nil)
	require.NoError(t, err)
	res, err = st.Claim(ctx, d.types, d.tagsJ, 2, 2, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, res.Jobs, 2)
	require.ElementsMatch(t, []string{ids[1], ids[2]}, []string{res.Jobs[0].ID.String(), res.Jobs[1].ID.String()})
}
