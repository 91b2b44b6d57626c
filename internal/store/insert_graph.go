package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/pgerr"
)

// ErrUnknownPrerequisites is wrapped by InsertGraph when a dependency names
// a job that does not exist.
var ErrUnknownPrerequisites = errors.New("unknown prerequisite job IDs")

// ErrUniqueKeyContention is returned by InsertGraph when the live job
// holding a unique key kept finishing while a duplicate was inserted.
// It is transient: try again.
var ErrUniqueKeyContention = errors.New("the job holding the unique key kept finishing during the insert")

// GraphJob is a job with graph features; see InsertGraph.
type GraphJob struct {
	NewJob
	DependsOn   []uuid.UUID // prerequisites: earlier jobs or members of the batch
	OrderingKey string
	UniqueKey   string
}

// Inserted reports one job of InsertGraph.
type Inserted struct {
	ID        uuid.UUID // the new job, or the existing one for a duplicate
	Duplicate bool      // a live job with the same unique key existed
	State     string    // state of the new job (blocked, scheduled, available, cancelled)
	Type      string
	Tags      []byte
	In        time.Duration // scheduled: how long until it is due
}

// GraphResult is what InsertGraph did.
type GraphResult struct {
	Jobs []Inserted
	// Locked are available prerequisites it locked: concurrent claims skip
	// them until the transaction ends, so they must be announced at its
	// commit.
	Locked []Avail
}

// InsertGraph inserts jobs with dependencies, ordering keys or unique keys
// inside tx (a pgx.Tx, or a database/sql one through SQL), taking its
// locks in the lock order of graph.go: the ordering keys (and their rows,
// orderkeys.go), then the prerequisites (FOR KEY SHARE). The batch has
// been validated (no cycles, no self-dependency, no unique job that
// another batch member depends on).
//
// In a transaction at REPEATABLE READ or SERIALIZABLE, a change the insert
// depends on that was committed after the transaction's snapshot fails it
// with ErrSnapshot (see orderkeys.go) rather than going unseen.
func (s *Store) InsertGraph(ctx context.Context, tx DB, jobs []GraphJob) (GraphResult, error) {
	g := newGraphInsert(s, tx, jobs)
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"locking ordering keys", g.lockChains},
		{"locking prerequisites", g.lockPrerequisites},
		{"", g.planEdges},
		{"looking up unique keys", g.findHeldKeys},
		{"inserting jobs", g.insertRows},
		{"inserting edges", g.insertEdges},
	}
	for _, st := range steps {
		if err := st.run(ctx); err != nil {
			switch {
			case st.what == "" || errors.Is(err, ErrUnknownPrerequisites) || errors.Is(err, ErrUniqueKeyContention) || errors.Is(err, ErrSnapshot):
				return GraphResult{}, err
			case pgerr.Code(err) == "40001":
				// Only a transaction above READ COMMITTED gets one here
				// (orderkeys.go).
				return GraphResult{}, fmt.Errorf("%s: %w: %w", st.what, ErrSnapshot, err)
			}
			return GraphResult{}, fmt.Errorf("%s: %w", st.what, err)
		}
	}
	return GraphResult{Jobs: g.out, Locked: g.locked}, nil
}

// graphInsert is one InsertGraph call's working state.
type graphInsert struct {
	s       *Store
	tx      DB
	jobs    []GraphJob
	inBatch map[uuid.UUID]int

	tails  map[string]uuid.UUID // ordering key → tail of its chain
	states map[uuid.UUID]string // external prerequisites → state after the lock
	locked []Avail

	out      []Inserted
	blocked  []int32
	lastErr  []*string
	eP, eJ   []uuid.UUID // edges: prerequisite, job
	eK       []string    // edge kinds
	inserted map[uuid.UUID]bool
}

func newGraphInsert(s *Store, tx DB, jobs []GraphJob) *graphInsert {
	g := &graphInsert{s: s, tx: tx, jobs: jobs, inBatch: make(map[uuid.UUID]int, len(jobs)),
		tails: map[string]uuid.UUID{}, states: map[uuid.UUID]string{},
		out: make([]Inserted, len(jobs)), blocked: make([]int32, len(jobs)), lastErr: make([]*string, len(jobs))}
	for i, j := range jobs {
		g.inBatch[j.ID] = i
	}
	return g
}

// lockChains serialises enqueues of each ordering key, writes each key's
// row (orderkeys.go) and finds each key's tail.
func (g *graphInsert) lockChains(ctx context.Context) error {
	last := map[string]uuid.UUID{} // the batch's last job of each key
	var keys []string
	for _, j := range g.jobs {
		if j.OrderingKey == "" {
			continue
		}
		if _, ok := last[j.OrderingKey]; !ok {
			keys = append(keys, j.OrderingKey)
		}
		last[j.OrderingKey] = j.ID
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	if err := g.s.lockKeys(ctx, g.tx, keys); err != nil {
		return err
	}
	ids := make([]uuid.UUID, len(keys))
	for i, k := range keys {
		ids[i] = last[k]
	}
	var err error
	g.tails, err = g.s.tails(ctx, g.tx, keys, ids)
	return err
}

// lockPrerequisites takes KEY SHARE on the external prerequisites
// (dependencies outside the batch and the chain tails) and reads their
// state after the lock, keeping the results of the dependencies that
// completed (inputs.go).
func (g *graphInsert) lockPrerequisites(ctx context.Context) error {
	var ids, deps []uuid.UUID
	add := func(id uuid.UUID) {
		if _, in := g.inBatch[id]; !in && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, j := range g.jobs {
		for _, d := range j.DependsOn {
			add(d)
		}
	}
	deps = slices.Clone(ids)
	for _, t := range g.tails {
		add(t)
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := g.tx.Query(ctx, g.s.graph.lockPrereqs, Mode, ids, deps)
	if err != nil {
		return err
	}
	var (
		id    uuid.UUID
		state string
		typ   string
		tags  []byte
		runAt time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &state, &typ, &tags, &runAt}, func() error {
		g.states[id] = state
		if state == "available" {
			g.locked = append(g.locked, Avail{Type: typ, Tags: slices.Clone(tags), RunAt: runAt})
		}
		return nil
	}); err != nil {
		return err
	}
	// Not live: finished (in job_history; read on a newer snapshot, so a
	// job whose move committed while the lock waited is found) or unknown.
	var gone []uuid.UUID
	for _, id := range ids {
		if _, ok := g.states[id]; !ok {
			gone = append(gone, id)
		}
	}
	if len(gone) > 0 {
		rows, err := g.tx.Query(ctx, g.s.graph.finishedStates, Mode, gone, deps)
		if err != nil {
			return err
		}
		if _, err := pgx.ForEachRow(rows, []any{&id, &state}, func() error {
			g.states[id] = state
			return nil
		}); err != nil {
			return err
		}
	}
	var unknown []string
	var unseen []uuid.UUID
	for _, id := range ids {
		if _, ok := g.states[id]; !ok {
			unknown, unseen = append(unknown, id.String()), append(unseen, id)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		// Or only unseen: enqueued after a REPEATABLE READ snapshot.
		after, err := g.s.invisibleAll(ctx, g.tx, unseen)
		if err != nil {
			return err
		}
		if after {
			return fmt.Errorf("%w: prerequisites %v were enqueued after the snapshot", ErrSnapshot, unknown)
		}
		return fmt.Errorf("%w: %v", ErrUnknownPrerequisites, unknown)
	}
	return nil
}

// planEdges decides each job's state and edges: dependencies first (a
// failed or cancelled prerequisite cancels the job, an unfinished one
// blocks it), then ordering chains in batch order (a job cancelled on
// arrival is not part of its chain). A job that depends on its chain
// predecessor gets both edges: the dependency's and the chain's.
func (g *graphInsert) planEdges(context.Context) error {
	for _, i := range topoOrder(g.jobs, g.inBatch) {
		j := g.jobs[i]
		g.out[i] = Inserted{ID: j.ID, State: "available", Type: j.Type, Tags: j.Tags}
		for _, d := range j.DependsOn {
			st := g.states[d]
			if bi, in := g.inBatch[d]; in {
				st = g.out[bi].State
			}
			switch {
			case st == "completed":
				// Its result was kept by the statement that read it
				// (lockPrerequisites), and the job lists it.
			case st == "failed" || st == "cancelled":
				if g.lastErr[i] == nil {
					msg := fmt.Sprintf("%s%s %s", cancelPrefix, d, st)
					g.lastErr[i] = &msg
					g.out[i].State = "cancelled"
				}
			default:
				g.addEdge(i, d, "depends")
			}
		}
		if g.out[i].State != "cancelled" && g.blocked[i] > 0 {
			g.out[i].State = "blocked"
		}
	}
	prev := map[string]uuid.UUID{}
	for k, t := range g.tails {
		if !terminal(g.states[t]) {
			prev[k] = t
		}
	}
	for i, j := range g.jobs {
		k := j.OrderingKey
		if k == "" || g.out[i].State == "cancelled" {
			continue
		}
		if p, ok := prev[k]; ok {
			g.addEdge(i, p, "order")
			g.out[i].State = "blocked"
		}
		prev[k] = j.ID
	}
	return nil
}

func (g *graphInsert) addEdge(i int, prereq uuid.UUID, kind string) {
	g.blocked[i]++
	g.eP, g.eJ, g.eK = append(g.eP, prereq), append(g.eJ, g.jobs[i].ID), append(g.eK, kind)
}

// findHeldKeys turns unique jobs that would arrive cancelled (a
// prerequisite failed) into duplicates when a live job holds their key:
// the unique index covers live jobs only, so the insert alone would let
// them in beside the live one.
func (g *graphInsert) findHeldKeys(ctx context.Context) error {
	var keys []string
	for i, j := range g.jobs {
		if j.UniqueKey != "" && g.out[i].State == "cancelled" {
			keys = append(keys, j.UniqueKey)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	holders, err := idsByKey(ctx, g.tx, g.s.graph.liveHolders, keys)
	if err != nil {
		return err
	}
	for i, j := range g.jobs {
		if id, ok := holders[j.UniqueKey]; ok && j.UniqueKey != "" && g.out[i].State == "cancelled" {
			g.out[i] = Inserted{ID: id, Duplicate: true}
		}
	}
	return nil
}

// insertRows inserts the jobs; a unique job whose key a live job holds is
// a duplicate and reports that job's ID. A holder that finishes between
// the insert and the look-up frees the key: the job is inserted again.
func (g *graphInsert) insertRows(ctx context.Context) error {
	g.inserted = map[uuid.UUID]bool{}
	todo := make([]int, 0, len(g.jobs))
	for i := range g.jobs {
		if !g.out[i].Duplicate {
			todo = append(todo, i)
		}
	}
	for attempt := 0; len(todo) > 0; attempt++ {
		if attempt == 5 {
			return ErrUniqueKeyContention
		}
		got, err := g.insertSome(ctx, todo)
		if err != nil {
			return err
		}
		var dupKeys []string
		var missing []int
		for _, i := range todo {
			if got[g.jobs[i].ID] {
				g.inserted[g.jobs[i].ID] = true
			} else {
				missing = append(missing, i)
				dupKeys = append(dupKeys, g.jobs[i].UniqueKey)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		holders, err := idsByKey(ctx, g.tx, g.s.graph.liveHolders, dupKeys)
		if err != nil {
			return fmt.Errorf("reading duplicates: %w", err)
		}
		todo = todo[:0]
		for _, i := range missing {
			if id, ok := holders[g.jobs[i].UniqueKey]; ok {
				g.out[i] = Inserted{ID: id, Duplicate: true}
			} else {
				todo = append(todo, i) // the holder ended meanwhile: insert again
			}
		}
	}
	return nil
}

func (g *graphInsert) insertSome(ctx context.Context, idx []int) (map[uuid.UUID]bool, error) {
	n := len(idx)
	ids := make([]uuid.UUID, n)
	types := make([]string, n)
	args := make([][]byte, n)
	tags := make([][]byte, n)
	prios := make([]int16, n)
	runAts := make([]*time.Time, n)
	delays := make([]int64, n)
	maxAtt := make([]int32, n)
	timeouts := make([]int64, n)
	states := make([]string, n)
	blocked := make([]int32, n)
	okeys := make([]*string, n)
	ukeys := make([]*string, n)
	lastErr := make([]*string, n)
	ckeys := make([]*string, n)
	metas := make([]json.RawMessage, n) // nil: NULL
	prereqs := make([]*string, n)       // nil: NULL (no dependencies)
	unique := false
	for x, i := range idx {
		j := &g.jobs[i]
		ids[x], types[x], args[x], tags[x] = j.ID, j.Type, j.Args, j.Tags
		prios[x], runAts[x], maxAtt[x] = j.Priority, j.RunAt, j.MaxAttempts
		delays[x], timeouts[x] = j.Delay.Milliseconds(), j.Timeout.Milliseconds()
		states[x], blocked[x], lastErr[x] = g.out[i].State, g.blocked[i], g.lastErr[i]
		if j.OrderingKey != "" {
			okeys[x] = &j.OrderingKey
		}
		if j.UniqueKey != "" {
			ukeys[x] = &j.UniqueKey
			unique = true
		}
		if j.ConcurrencyKey != "" {
			ckeys[x] = &j.ConcurrencyKey
		}
		metas[x] = j.Meta
		if len(j.DependsOn) > 0 {
			ps := make([]string, len(j.DependsOn))
			for k, d := range j.DependsOn {
				ps[k] = d.String()
			}
			joined := strings.Join(ps, ",")
			prereqs[x] = &joined
		}
	}
	q := g.s.graph.insert
	if unique {
		q = g.s.graph.insertUnique
	}
	rows, err := g.tx.Query(ctx, q, Mode, ids, types, args, tags, prios, runAts, delays, maxAtt, timeouts,
		states, blocked, okeys, ukeys, lastErr, ckeys, metas, prereqs)
	if err != nil {
		return nil, err
	}
	out := make(map[uuid.UUID]bool, len(idx))
	var (
		id    uuid.UUID
		state string
		inMS  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &inMS}, func() error {
		out[id] = true
		if x, ok := g.inBatch[id]; ok {
			g.out[x].State = state // as the database decided (scheduled when due later)
			g.out[x].In = time.Duration(inMS) * time.Millisecond
		}
		return nil
	})
	return out, err
}

// insertEdges writes the edges of the jobs that were inserted.
func (g *graphInsert) insertEdges(ctx context.Context) error {
	var p, j []uuid.UUID
	var k []string
	for x := range g.eJ {
		if g.inserted[g.eJ[x]] {
			p, j, k = append(p, g.eP[x]), append(j, g.eJ[x]), append(k, g.eK[x])
		}
	}
	if len(p) == 0 {
		return nil
	}
	_, err := g.tx.Exec(ctx, g.s.graph.edges, Mode, p, j, k)
	return err
}

// idsByKey runs a query returning (key, id) rows for keys ($1; more
// parameters after it).
func idsByKey(ctx context.Context, tx DB, sql string, keys []string, more ...any) (map[string]uuid.UUID, error) {
	rows, err := tx.Query(ctx, sql, append([]any{Mode, keys}, more...)...)
	if err != nil {
		return nil, err
	}
	out := map[string]uuid.UUID{}
	var k string
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&k, &id}, func() error { out[k] = id; return nil }); err != nil {
		return nil, err
	}
	return out, nil
}

// topoOrder returns batch indexes with in-batch prerequisites first. The
// batch is acyclic (validated by the caller).
func topoOrder(jobs []GraphJob, inBatch map[uuid.UUID]int) []int {
	order := make([]int, 0, len(jobs))
	state := make([]uint8, len(jobs)) // 0 new, 1 visiting, 2 done
	var visit func(i int)
	visit = func(i int) {
		if state[i] != 0 {
			return
		}
		state[i] = 1
		for _, d := range jobs[i].DependsOn {
			if bi, ok := inBatch[d]; ok {
				visit(bi)
			}
		}
		state[i] = 2
		order = append(order, i)
	}
	for i := range jobs {
		visit(i)
	}
	return order
}

func terminal(state string) bool {
	return state == "completed" || state == "failed" || state == "cancelled"
}
