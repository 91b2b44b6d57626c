package store

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// graphFixture builds graphs through the store's own paths: InsertGraph,
// Claim and FinishGraph (which writes in place, as finishes of jobs with
// dependents do), Cancel, and Retire (which moves finished rows to
// job_history).
type graphFixture struct {
	t *testing.T
	s *Store
}

// add inserts one job of its own type (so that it can be claimed alone).
func (f graphFixture) add(typ, okey string, deps ...uuid.UUID) uuid.UUID {
	f.t.Helper()
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7())
	require.NoError(f.t, pgx.BeginFunc(ctx, f.s.pool, func(tx pgx.Tx) error {
		_, err := f.s.InsertGraph(ctx, tx, []GraphJob{{NewJob: NewJob{ID: id, Type: typ, Args: []byte(`{}`), Tags: []byte(`{}`),
			MaxAttempts: 1}, DependsOn: deps, OrderingKey: okey}})
		return err
	}))
	return id
}

// end claims the job of type typ and finishes it in state.
func (f graphFixture) end(typ, state string) {
	f.t.Helper()
	ctx := context.Background()
	res, err := f.s.Claim(ctx, []string{typ}, []byte(`{}`), 1, 1, time.Minute, "w", nil)
	require.NoError(f.t, err)
	require.Len(f.t, res.Jobs, 1, "claim of %s", typ)
	msg := "boom"
	out, err := f.s.FinishGraph(ctx, []Finish{{ID: res.Jobs[0].ID, Token: res.Jobs[0].Token, State: state, Err: &msg}}, true)
	require.NoError(f.t, err)
	require.Equal(f.t, Written, out.Status[res.Jobs[0].ID])
}

func (f graphFixture) graph(id uuid.UUID, limit, countCap int) Neighbourhood {
	f.t.Helper()
	n, err := f.s.Graph(context.Background(), id, limit, countCap)
	require.NoError(f.t, err)
	return n
}

func nb(id uuid.UUID, typ, state, kind string) Neighbour {
	return Neighbour{ID: id, Type: typ, State: state, Kind: kind}
}

func sortedNb(ns ...Neighbour) []Neighbour {
	slices.SortFunc(ns, func(a, b Neighbour) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	return ns
}

// TestGraphOfFinishedJobsAtStoreLevel: the graph around finished jobs is
// the same while their rows are still in jobs (written in place) and once
// they are in job_history: completed dependencies, a failed one and the
// dependents it cancelled (at its end, and at their enqueue), ordering
// keys, and deleted prerequisites.
func TestGraphOfFinishedJobsAtStoreLevel(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	f := graphFixture{t, s}
	a := f.add("a", "")
	x := f.add("x", "")
	b := f.add("b", "", a)
	c := f.add("c", "", b)
	d := f.add("d", "", a, x)
	k1 := f.add("k1", "key")
	k2 := f.add("k2", "key")
	k3 := f.add("k3", "key")
	fl := f.add("f", "")
	g := f.add("g", "", fl)
	g2 := f.add("g2", "", fl, x) // cancelled by f, its edge from x pending
	f.end("a", "completed")
	f.end("b", "completed")
	f.end("k1", "completed")
	f.end("k2", "completed")
	f.end("f", "failed")
	h := f.add("h", "", fl) // cancelled at its enqueue

	check := func(where string) {
		t.Helper()
		n := f.graph(b, 10, 100)
		require.Equal(t, []Neighbour{nb(a, "a", "completed", "depends")}, n.Prereqs, where)
		require.Equal(t, []Neighbour{nb(c, "c", "available", "depends")}, n.Dependents, where)
		require.Equal(t, sortedNb(nb(b, "b", "completed", "depends"), nb(d, "d", "blocked", "depends")), f.graph(a, 10, 100).Dependents, where)
		require.Equal(t, sortedNb(nb(a, "a", "completed", "depends"), nb(x, "x", "available", "depends")), f.graph(d, 10, 100).Prereqs, where)
		require.Equal(t, sortedNb(nb(g, "g", "cancelled", "depends"), nb(g2, "g2", "cancelled", "depends"), nb(h, "h", "cancelled", "depends")),
			f.graph(fl, 10, 100).Dependents, where)
		require.Equal(t, []Neighbour{nb(fl, "f", "failed", "depends")}, f.graph(g, 10, 100).Prereqs, where)
		require.Equal(t, sortedNb(nb(fl, "f", "failed", "depends"), nb(x, "x", "available", "depends")), f.graph(g2, 10, 100).Prereqs, where)
		require.Equal(t, sortedNb(nb(d, "d", "blocked", "depends"), nb(g2, "g2", "cancelled", "depends")), f.graph(x, 10, 100).Dependents, where)
		require.Equal(t, []Neighbour{nb(fl, "f", "failed", "depends")}, f.graph(h, 10, 100).Prereqs, where)
		n = f.graph(k2, 10, 100)
		require.Equal(t, []Neighbour{nb(k1, "k1", "completed", "order")}, n.Prereqs, where)
		require.Equal(t, []Neighbour{nb(k3, "k3", "available", "order")}, n.Dependents, where)
		require.Equal(t, []Neighbour{{ID: k3, Type: "k3", State: "available"}}, n.Chain, where)
		n = f.graph(k1, 10, 100)
		require.Empty(t, n.Prereqs, where)
		require.Equal(t, []Neighbour{nb(k2, "k2", "completed", "order")}, n.Dependents, where)
		require.Equal(t, []Neighbour{nb(k2, "k2", "completed", "order")}, f.graph(k3, 10, 100).Prereqs, where)
	}
	check("finished rows in jobs")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s.jobs+` WHERE state IN ('completed', 'failed', 'cancelled')`).Scan(&left))
	require.Equal(t, 8, left)
	moved, err := s.Retire(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 8, moved)
	check("finished rows in job_history")

	// Deleted by retention: known by ID, with its type while its result
	// is kept (d is live and lists a), without once the cleaner took it.
	_, err = pool.Exec(ctx, `DELETE FROM `+s.history+` WHERE id = $1`, a)
	require.NoError(t, err)
	gone := Neighbour{ID: a, Type: "a", Kind: "depends", Deleted: true}
	require.Equal(t, []Neighbour{gone}, f.graph(b, 10, 100).Prereqs)
	_, err = pool.Exec(ctx, `DELETE FROM `+s.inputs+` WHERE id = $1`, a)
	require.NoError(t, err)
	gone.Type = ""
	require.Equal(t, []Neighbour{gone}, f.graph(b, 10, 100).Prereqs)
	_, err = f.s.Graph(ctx, a, 10, 100)
	require.ErrorIs(t, err, ErrNotFound)
	// A deleted dependent leaves nothing to find.
	_, err = pool.Exec(ctx, `DELETE FROM `+s.history+` WHERE id = $1`, g)
	require.NoError(t, err)
	require.Equal(t, sortedNb(nb(g2, "g2", "cancelled", "depends"), nb(h, "h", "cancelled", "depends")), f.graph(fl, 10, 100).Dependents)
}

// TestGraphFollowsPendingOrderEdges: while an ordering key's edge is
// pending it is the one shown, not the key's neighbour by ID (a cancelled
// job in the middle of a chain was spliced out).
func TestGraphFollowsPendingOrderEdges(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newTestStore(t)
	f := graphFixture{t, s}
	s1 := f.add("s1", "chain")
	s2 := f.add("s2", "chain")
	s3 := f.add("s3", "chain")
	_, err := s.Cancel(ctx, s2)
	require.NoError(t, err)
	require.Equal(t, []Neighbour{nb(s1, "s1", "available", "order")}, f.graph(s3, 10, 100).Prereqs)
	// s1's edge to s2 is consumed when s1 ends.
	require.Equal(t, []Neighbour{nb(s2, "s2", "cancelled", "order"), nb(s3, "s3", "blocked", "order")}, f.graph(s1, 10, 100).Dependents)
	f.end("s1", "completed")
	_, err = s.Retire(ctx, 100)
	require.NoError(t, err)
	// Consumed: neighbours by ID, s2 (cancelled) between them.
	require.Equal(t, []Neighbour{nb(s2, "s2", "cancelled", "order")}, f.graph(s3, 10, 100).Prereqs)
	require.Equal(t, []Neighbour{nb(s2, "s2", "cancelled", "order")}, f.graph(s1, 10, 100).Dependents)
}

// TestGraphCountsAFanOut: beyond the limit, dependents are counted, from
// every place they are found, up to the cap.
func TestGraphCountsAFanOut(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newTestStore(t)
	f := graphFixture{t, s}
	r := f.add("r", "")
	var deps []uuid.UUID
	for range 7 {
		deps = append(deps, f.add("dep", "", r))
	}
	sink := f.add("sink", "", deps...)
	// Each place is counted up to the cap: the count is a lower bound
	// when one reaches it.
	check := func(where string, countCap, more int, capped bool) {
		t.Helper()
		n := f.graph(r, 3, 100)
		require.Len(t, n.Dependents, 3, where)
		require.Equal(t, 4, n.MoreDependents, where)
		require.False(t, n.DependentsCapped, where)
		n = f.graph(r, 3, countCap)
		require.Len(t, n.Dependents, 3, where)
		require.Equal(t, more, n.MoreDependents, where)
		require.Equal(t, capped, n.DependentsCapped, where)
		n = f.graph(sink, 3, 5)
		require.Len(t, n.Prereqs, 3, where)
		require.Equal(t, 4, n.MorePrereqs, where)
	}
	check("pending edges", 5, 2, true)
	require.Equal(t, deps[:3], []uuid.UUID{f.graph(r, 3, 100).Dependents[0].ID, f.graph(r, 3, 100).Dependents[1].ID,
		f.graph(r, 3, 100).Dependents[2].ID}, "pending edges are listed by ID")
	f.end("r", "completed")
	check("prerequisite completed", 5, 2, true)
	for range 3 {
		f.end("dep", "completed")
	}
	_, err := s.Retire(ctx, 100)
	require.NoError(t, err)
	check("dependents in jobs (4) and in job_history (3)", 5, 4, false)
	check("dependents in jobs (4) and in job_history (3)", 3, 3, true)
}

// TestGraphStaysOnTheIndexes: with a large history (every finished job in
// an ordering key, a third of them dependents of one job, some cancelled
// by another), every statement of Graph reads a bounded number of
// buffers, far below the table's pages: around the job itself, around a
// prerequisite with a fan-out of tens of thousands (counted up to the
// cap), and around one that cancelled thousands.
func TestGraphStaysOnTheIndexes(t *testing.T) {
	n := 300_000
	if testing.Short() {
		n = 60_000
	}
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	fanOut, canceller := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	// UUIDv7s a millisecond apart, as finish() writes them; 50 ordering
	// keys; a third list fanOut as a completed prerequisite, a third
	// another job; one in 100 was cancelled by canceller.
	_, err := pool.Exec(ctx, `INSERT INTO `+s.history+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
		timeout_ms, errors, last_error, ordering_key, prereqs, created_at, started_at, finished_at, expires_at)
	SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12))::uuid,
	       'a', '{}', '{}', CASE WHEN g % 100 = 0 THEN 'cancelled' ELSE 'completed' END, 0, now(), 1, 25, 0, '[]',
	       CASE WHEN g % 100 = 0 THEN 'cancelled: prerequisite ' || $3::text || ' failed' END, 'k' || (g % 50),
	       CASE g % 3 WHEN 0 THEN ARRAY[$2::uuid] WHEN 1 THEN ARRAY[md5(g::text)::uuid] END,
	       now(), now(), now() - (($1 - g) || ' milliseconds')::interval, now() + interval '1 day'
	FROM generate_series(1, $1) g,
	LATERAL (SELECT lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - $1 + g), 12, '0') AS h, md5(g::text) AS r) x`,
		n, fanOut, canceller.String())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s.history+` (id, type, args, tags, state, priority, run_at, attempt, max_attempts,
		timeout_ms, errors, created_at, finished_at, expires_at)
	SELECT id, 'p', '{}', '{}', st, 0, now(), 1, 25, 0, '[]', now(), now(), now() + interval '1 day'
	FROM unnest($1::uuid[], $2::text[]) AS u(id, st)`, []uuid.UUID{fanOut, canceller}, []string{"completed", "failed"})
	require.NoError(t, err)
	// Live jobs of the same keys.
	_, err = pool.Exec(ctx, `INSERT INTO `+s.jobs+` (id, type, args, state, ordering_key)
	SELECT gen_random_uuid(), 'a', '{}', 'available', 'k' || (g % 50) FROM generate_series(1, 2000) g`)
	require.NoError(t, err)
	_, err = s.SummarizeHistory(ctx)
	require.NoError(t, err)
	for _, tbl := range []string{s.history, s.jobs} {
		_, err = pool.Exec(ctx, `VACUUM ANALYZE `+tbl)
		require.NoError(t, err)
	}
	var pages int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(relpages) FROM pg_class WHERE relname LIKE 'job_history_%' AND relkind = 'r'
		AND relnamespace = $1::regnamespace`, s.schema).Scan(&pages))
	var mid uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM `+s.history+` WHERE ordering_key = 'k3' AND prereqs = ARRAY[$1::uuid]
		ORDER BY id OFFSET 1000 LIMIT 1`, fanOut).Scan(&mid))

	const countCap = 500
	for name, id := range map[string]uuid.UUID{"a finished job": mid, "a prerequisite of a third": fanOut, "a canceller": canceller} {
		var worst int
		var worstSQL string
		s.explain = func(sql string, args []any) {
			if b := explainGraphBuffers(t, s, sql, args); b > worst {
				worst, worstSQL = b, sql
			}
		}
		g, err := s.Graph(ctx, id, 100, countCap)
		s.explain = nil
		require.NoError(t, err, name)
		t.Logf("%-26s prerequisites %d (+%d), dependents %d (+%d, at least: %v); worst statement %d buffers; the table has %d pages",
			name, len(g.Prereqs), g.MorePrereqs, len(g.Dependents), g.MoreDependents, g.DependentsCapped, worst, pages)
		// The count reads up to countCap index entries and rows of each
		// place; the rest a few pages per neighbour.
		require.Less(t, worst, 4*countCap, "%s: a statement read %d buffers (the table has %d pages):\n%s", name, worst, pages, worstSQL)
		require.Less(t, int64(worst)*5, pages, name)
		switch id {
		case mid:
			require.Len(t, g.Prereqs, 2) // the key's previous job, and fanOut (made later)
			require.Equal(t, "order", g.Prereqs[0].Kind)
			require.Equal(t, Neighbour{ID: fanOut, Type: "p", State: "completed", Kind: "depends"}, g.Prereqs[1])
			require.Len(t, g.Dependents, 1)
			require.Equal(t, "order", g.Dependents[0].Kind)
		default: // n/3 and n/100 dependents: counted up to the cap
			require.Len(t, g.Dependents, 100)
			require.Equal(t, countCap-100, g.MoreDependents)
			require.True(t, g.DependentsCapped)
		}
	}
}

// explainGraphBuffers runs sql (with its arguments) under EXPLAIN
// (ANALYZE, BUFFERS) and returns the shared buffers it touched.
func explainGraphBuffers(t *testing.T, s *Store, sql string, args []any) int {
	t.Helper()
	var plan []map[string]any
	require.NoError(t, s.pool.QueryRow(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql, args...).Scan(&plan))
	p := plan[0]["Plan"].(map[string]any)
	return int(p["Shared Hit Blocks"].(float64) + p["Shared Read Blocks"].(float64))
}
