package store

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Reading the graph around one job, for operators (Queue.Graph), live or
// finished. An edge of job_edges is consumed when its prerequisite ends,
// so the graph around finished jobs is read from what the jobs keep of
// their edges. Each kind of neighbour, and where it is found:
//
//   - A pending edge: job_edges, both ways (its primary key, and
//     job_edges_job_idx).
//   - A dependency that completed: the dependent's prereqs (migration
//     0012). A job's prerequisites come from its own row; its dependents
//     through the GIN indexes on prereqs of jobs and of job_history (0016).
//   - A dependency that failed or was cancelled: the dependent was
//     cancelled with the reason "cancelled: prerequisite <id> <state>"
//     (cancelReason). The job's own reason names its prerequisite; the
//     dependents a job cancelled are found by that ID
//     (job_history_cancelled_by_idx, 0016). Only that prerequisite is
//     known: the other pending edges of a cancelled dependent are consumed
//     without a trace when their prerequisites end.
//   - The ordering key: the jobs just before and just after it in its key
//     (ID order, which is enqueue order) among those kept, unless a
//     pending edge of that kind exists (it is the truth while it lasts: a
//     splice may have linked the job past a cancelled one). Read through
//     jobs_ordering_live_idx and job_history_ordering_key_id_idx (0016).
//
// Finished rows still in jobs (written in place by the graph paths until
// the retirer moves them; few) are read through jobs_finished_idx. No
// statement reads more than a few index entries per neighbour it returns,
// whatever the size of job_history (TestGraphStaysOnTheIndexes); counting
// a large fan-out stops at a cap.
//
// A prerequisite known by its ID alone (prereqs, a reason) that no table
// holds any more was deleted (retention, Delete): it is returned Deleted,
// with its type when job_inputs still keeps its result. A deleted
// dependent or key neighbour leaves nothing to find.

// Neighbour is a job next to another in the graph.
type Neighbour struct {
	ID    uuid.UUID
	Type  string // "" when deleted and its type is not kept
	State string // "" when deleted
	Kind  string // "depends" or "order"; empty in a chain
	// Deleted: the job is known by its ID only; its row is gone.
	Deleted bool
}

// Neighbourhood is what Graph reads around a job.
type Neighbourhood struct {
	OrderingKey, UniqueKey string
	Prereqs, Dependents    []Neighbour
	// MorePrereqs and MoreDependents: how many neighbours the lists leave
	// out. Dependents are counted up to the count cap per source: when
	// DependentsCapped, MoreDependents is a lower bound.
	MorePrereqs, MoreDependents int
	DependentsCapped            bool
	Chain                       []Neighbour // live jobs of the ordering key, oldest first
}

type neighboursSQL struct {
	selfLive, selfDone, prereqEdges, resolveLive, resolveDone, before, after, dependents, chain string
}

// cancelPrefix starts the reason of a dependent cancelled by its
// prerequisite (the release, InsertGraph, and SQL enqueue() of migration
// 0012), followed by the prerequisite's ID (from the 25th character, which
// job_history_cancelled_by_idx reads) and its state.
const cancelPrefix = "cancelled: prerequisite "

var cancelReason = regexp.MustCompile(`^` + cancelPrefix + `([0-9a-f-]{36}) (?:failed|cancelled)$`)

func (s *Store) buildNeighbours() {
	n := &s.nb
	// Jobs are looked up in jobs first, and in job_history only when not
	// found there: a statement over job_history costs a millisecond or two
	// of planning (its partitions), which the graph of live jobs, read at
	// every refresh of the dashboard's job page, need not pay.
	cols := `ordering_key, unique_key, prereqs, COALESCE(last_error, '')`
	n.selfLive = `SELECT ` + cols + ` FROM ` + s.jobs + ` WHERE id = $1`
	n.selfDone = `SELECT ` + cols + ` FROM ` + s.history + ` WHERE id = $1 LIMIT 1`
	n.prereqEdges = `SELECT prereq, kind FROM ` + s.edges + ` WHERE job = $1`
	n.resolveLive = `SELECT id, type, state FROM ` + s.jobs + ` WHERE id = ANY($1::uuid[])`
	// Finished jobs' types and states; a deleted one's kept type.
	n.resolveDone = `SELECT x.id, COALESCE(h.type, k.type, ''), COALESCE(h.state, '')
FROM unnest($1::uuid[]) AS x(id)
LEFT JOIN LATERAL (SELECT f.type, f.state FROM ` + s.history + ` f WHERE f.id = x.id LIMIT 1) h ON true
LEFT JOIN LATERAL (SELECT i.type FROM ` + s.inputs + ` i WHERE i.id = x.id AND h.state IS NULL
	ORDER BY i.finished_at DESC NULLS LAST, i.kept_at DESC LIMIT 1) k ON true`
	// The nearest job of the key before or after an ID: live, finished in
	// place, or finished.
	near := func(cmp, order string) string {
		return `SELECT n.id, n.type, n.state FROM (
	(SELECT id, type, state FROM ` + s.jobs + ` WHERE ordering_key = $1 AND id ` + cmp + ` $2 AND state IN ` + live + `
	 ORDER BY id ` + order + ` LIMIT 1)
	UNION ALL
	(SELECT id, type, state FROM ` + s.jobs + ` WHERE ordering_key = $1 AND id ` + cmp + ` $2 AND state IN ('completed', 'failed', 'cancelled')
	 ORDER BY id ` + order + ` LIMIT 1)
	UNION ALL
	(SELECT id, type, state FROM ` + s.history + ` WHERE ordering_key = $1 AND id ` + cmp + ` $2 ORDER BY id ` + order + ` LIMIT 1)
) n ORDER BY n.id ` + order + ` LIMIT 1`
	}
	n.before, n.after = near("<", "DESC"), near(">", "ASC")
	// Each place dependents are found, read once: up to $2 (the count
	// cap + 1) of them counted, the first $3 (the limit) returned, each
	// row with its place's count ($4: the job's ID as text, for the
	// reasons). A pending edge's dependent not in jobs is looked up later
	// (rare: a cancelled dependent moved to job_history while another
	// prerequisite's edge waits). The GIN places are not ordered: an
	// order would read every row of a large fan-out.
	// A job is counted in one place: since migration 0018 a dependent
	// lists every prerequisite in prereqs, also while its edge is pending,
	// and also when the prerequisite cancelled it.
	prereqsOf := `prereqs @> ARRAY[$1::uuid] AND prereqs IS NOT NULL`
	cancelledBy := `state = 'cancelled' AND last_error LIKE '` + cancelPrefix + `%' AND substr(last_error, 25, 36) = $4::text
	AND NOT COALESCE(prereqs @> ARRAY[$1::uuid], false)`
	n.dependents = `WITH e AS (SELECT job, kind FROM ` + s.edges + ` WHERE prereq = $1 ORDER BY job, kind LIMIT $2),
jp AS (SELECT id, type, state FROM ` + s.jobs + ` j WHERE ` + prereqsOf + `
	AND NOT EXISTS (SELECT 1 FROM ` + s.edges + ` x WHERE x.prereq = $1 AND x.job = j.id) LIMIT $2),
hp AS (SELECT id, type, state FROM ` + s.history + ` WHERE ` + prereqsOf + ` LIMIT $2),
jc AS (SELECT id, type, state FROM ` + s.jobs + ` WHERE ` + cancelledBy + ` LIMIT $2),
hc AS (SELECT id, type, state FROM ` + s.history + ` WHERE ` + cancelledBy + ` LIMIT $2)
SELECT 0, e.job, COALESCE(j.type, ''), COALESCE(j.state, ''), e.kind, (SELECT count(*) FROM e)
FROM (SELECT * FROM e LIMIT $3) e LEFT JOIN ` + s.jobs + ` j ON j.id = e.job
UNION ALL
SELECT 1, id, type, state, 'depends', (SELECT count(*) FROM jp) FROM (SELECT * FROM jp LIMIT $3) d
UNION ALL
SELECT 2, id, type, state, 'depends', (SELECT count(*) FROM hp) FROM (SELECT * FROM hp LIMIT $3) d
UNION ALL
SELECT 3, id, type, state, 'depends', (SELECT count(*) FROM jc) FROM (SELECT * FROM jc LIMIT $3) d
UNION ALL
SELECT 4, id, type, state, 'depends', (SELECT count(*) FROM hc) FROM (SELECT * FROM hc LIMIT $3) d`
	n.chain = `SELECT id, type, state FROM ` + s.jobs + `
WHERE ordering_key = $1 AND state IN ` + live + `
ORDER BY id LIMIT $2`
}

// Graph reads the keys of a job, its prerequisites and its dependents,
// pending or finished (at most limit of each, by ID, with how many more
// there are; dependents counted up to countCap a source), and the live jobs
// of its ordering key (at most limit), or returns ErrNotFound.
func (s *Store) Graph(ctx context.Context, id uuid.UUID, limit, countCap int) (Neighbourhood, error) {
	var n Neighbourhood
	var okey, ukey *string
	var prereqs [][16]byte
	var lastErr string
	dst := []any{&okey, &ukey, &prereqs, &lastErr}
	err := s.graphRow(ctx, s.nb.selfLive, id).Scan(dst...)
	if errors.Is(err, pgx.ErrNoRows) {
		err = s.graphRow(ctx, s.nb.selfDone, id).Scan(dst...)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return n, ErrNotFound
	}
	if err != nil {
		return n, err
	}
	if okey != nil {
		n.OrderingKey = *okey
	}
	if ukey != nil {
		n.UniqueKey = *ukey
	}
	if err := s.graphPrereqs(ctx, &n, id, prereqs, lastErr, limit); err != nil {
		return n, err
	}
	if err := s.graphDependents(ctx, &n, id, limit, countCap); err != nil {
		return n, err
	}
	if n.OrderingKey != "" {
		n.Chain, err = s.graphNodes(ctx, "", s.nb.chain, n.OrderingKey, limit)
	}
	return n, err
}

// graphPrereqs reads a job's prerequisites: pending edges, completed
// dependencies (prereqs), the one that cancelled it (its reason), and the
// job before it in its key.
func (s *Store) graphPrereqs(ctx context.Context, n *Neighbourhood, id uuid.UUID, prereqs [][16]byte, lastErr string, limit int) error {
	type edge struct {
		id   uuid.UUID
		kind string
	}
	var all []edge
	rows, err := s.graphQuery(ctx, s.nb.prereqEdges, id)
	if err != nil {
		return err
	}
	var e edge
	if _, err := pgx.ForEachRow(rows, []any{&e.id, &e.kind}, func() error {
		all = append(all, e)
		return nil
	}); err != nil {
		return err
	}
	for _, p := range prereqs {
		all = append(all, edge{uuid.UUID(p), "depends"})
	}
	if m := cancelReason.FindStringSubmatch(lastErr); m != nil {
		if p, err := uuid.Parse(m[1]); err == nil {
			all = append(all, edge{p, "depends"})
		}
	}
	pending := slices.ContainsFunc(all, func(e edge) bool { return e.kind == "order" })
	var before []Neighbour
	if n.OrderingKey != "" && !pending {
		if before, err = s.graphNodes(ctx, "order", s.nb.before, n.OrderingKey, id); err != nil {
			return err
		}
		for _, b := range before {
			all = append(all, edge{b.ID, "order"})
		}
	}
	slices.SortFunc(all, func(a, b edge) int {
		if c := bytes.Compare(a.id[:], b.id[:]); c != 0 {
			return c
		}
		return strings.Compare(a.kind, b.kind)
	})
	all = slices.Compact(all)
	n.MorePrereqs = max(0, len(all)-limit)
	all = all[:min(len(all), limit)]
	if len(all) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(all))
	for i, e := range all {
		ids[i] = e.id
	}
	found, err := s.resolve(ctx, ids)
	if err != nil {
		return err
	}
	for _, e := range all {
		nb := found[e.id]
		nb.ID, nb.Kind, nb.Deleted = e.id, e.kind, nb.State == ""
		n.Prereqs = append(n.Prereqs, nb)
	}
	return nil
}

// resolve reads the types and states of jobs, live or finished, by ID; a
// job found nowhere has an empty state (and its type when job_inputs keeps
// its result).
func (s *Store) resolve(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]Neighbour, error) {
	found := make(map[uuid.UUID]Neighbour, len(ids))
	add := func(ns []Neighbour, err error) error {
		for _, nb := range ns {
			found[nb.ID] = nb
		}
		return err
	}
	if err := add(s.graphNodes(ctx, "", s.nb.resolveLive, ids)); err != nil {
		return nil, err
	}
	var rest []uuid.UUID
	for _, id := range ids {
		if _, ok := found[id]; !ok {
			rest = append(rest, id)
		}
	}
	if len(rest) > 0 {
		if err := add(s.graphNodes(ctx, "", s.nb.resolveDone, rest)); err != nil {
			return nil, err
		}
	}
	return found, nil
}

// graphDependents reads a job's dependents: pending edges, jobs that list
// it in prereqs, jobs it cancelled, and the job after it in its key.
func (s *Store) graphDependents(ctx context.Context, n *Neighbourhood, id uuid.UUID, limit, countCap int) error {
	rows, err := s.graphQuery(ctx, s.nb.dependents, id, countCap+1, limit, id.String())
	if err != nil {
		return err
	}
	var all []Neighbour
	var missing []uuid.UUID // pending edges' dependents not in jobs
	counts := map[int]int{} // place → how many it holds (up to the cap + 1)
	var place int
	var count int64
	var nb Neighbour
	if _, err := pgx.ForEachRow(rows, []any{&place, &nb.ID, &nb.Type, &nb.State, &nb.Kind, &count}, func() error {
		if nb.State == "" {
			missing = append(missing, nb.ID)
		}
		all = append(all, nb)
		counts[place] = int(count)
		return nil
	}); err != nil {
		return err
	}
	if len(missing) > 0 {
		found, err := s.graphNodes(ctx, "", s.nb.resolveDone, missing)
		if err != nil {
			return err
		}
		for i, d := range all {
			if j := slices.IndexFunc(found, func(f Neighbour) bool { return f.ID == d.ID }); j >= 0 && d.State == "" {
				all[i].Type, all[i].State = found[j].Type, found[j].State
				all[i].Deleted = found[j].State == ""
			}
		}
	}
	pending := slices.ContainsFunc(all, func(d Neighbour) bool { return d.Kind == "order" })
	counted := 0
	if n.OrderingKey != "" && !pending {
		next, err := s.graphNodes(ctx, "order", s.nb.after, n.OrderingKey, id)
		if err != nil {
			return err
		}
		all, counted = append(all, next...), len(next)
	}
	slices.SortFunc(all, func(a, b Neighbour) int {
		if c := bytes.Compare(a.ID[:], b.ID[:]); c != 0 {
			return c
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	all = slices.CompactFunc(all, func(a, b Neighbour) bool { return a.ID == b.ID && a.Kind == b.Kind })
	total, over := len(all), false
	for _, c := range counts {
		over = over || c > limit
		if c > countCap {
			n.DependentsCapped, c = true, countCap
		}
		counted += c
	}
	if over {
		// Some were counted, not listed.
		total = max(total, counted)
	}
	n.Dependents = all[:min(len(all), limit)]
	n.MoreDependents = total - len(n.Dependents)
	return nil
}

// graphNodes reads neighbours of one kind (type and state) with sql.
func (s *Store) graphNodes(ctx context.Context, kind, sql string, args ...any) ([]Neighbour, error) {
	rows, err := s.graphQuery(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var out []Neighbour
	nb := Neighbour{Kind: kind}
	_, err = pgx.ForEachRow(rows, []any{&nb.ID, &nb.Type, &nb.State}, func() error {
		out = append(out, nb)
		return nil
	})
	return out, err
}

func (s *Store) graphQuery(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.explain != nil {
		s.explain(sql, args)
	}
	return s.pool.Query(ctx, sql, append([]any{Mode}, args...)...)
}

func (s *Store) graphRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.explain != nil {
		s.explain(sql, args)
	}
	return s.pool.QueryRow(ctx, sql, append([]any{Mode}, args...)...)
}
