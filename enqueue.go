package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/store"
)

// JobSpec describes one job for EnqueueMany.
type JobSpec struct {
	// ID is the job's ID. Leave it zero to have one generated; set it (with
	// NewID) when other jobs of the same batch must refer to this one.
	ID uuid.UUID
	// Type selects the handler. Required.
	Type string
	// Args are marshalled to JSON; json.RawMessage and []byte are taken as
	// JSON text and validated.
	Args any
	// Options are the job's enqueue options (Tags, Priority, …).
	Options []EnqueueOption
}

// Enqueue inserts one job and returns its ID. The job is visible to workers
// as soon as Enqueue returns.
func (q *Queue) Enqueue(ctx context.Context, typ string, args any, opts ...EnqueueOption) (uuid.UUID, error) {
	ids, err := q.enqueue(ctx, nil, []JobSpec{{Type: typ, Args: args, Options: opts}})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

// EnqueueTx inserts one job inside the caller's transaction: the job exists,
// and workers are notified, only if tx commits.
func (q *Queue) EnqueueTx(ctx context.Context, tx pgx.Tx, typ string, args any, opts ...EnqueueOption) (uuid.UUID, error) {
	if tx == nil {
		return uuid.Nil, invalid("tx", "must not be nil")
	}
	ids, err := q.enqueue(ctx, tx, []JobSpec{{Type: typ, Args: args, Options: opts}})
	if err != nil {
		return uuid.Nil, err
	}
	return ids[0], nil
}

// EnqueueMany inserts many jobs in one statement (one round trip) and
// returns their IDs in order. Either all are inserted or none: one invalid
// spec rejects the batch with an error naming its index and field.
func (q *Queue) EnqueueMany(ctx context.Context, specs []JobSpec) ([]uuid.UUID, error) {
	return q.enqueue(ctx, nil, specs)
}

// EnqueueManyTx is EnqueueMany inside the caller's transaction.
func (q *Queue) EnqueueManyTx(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, invalid("tx", "must not be nil")
	}
	return q.enqueue(ctx, tx, specs)
}

// Inserted reports one job of InsertMany.
type Inserted struct {
	ID uuid.UUID
	// Duplicate is set when the job had a UniqueKey and a live job with the
	// same key existed: ID is that job's, and nothing was inserted.
	Duplicate bool
}

// InsertMany is EnqueueMany (tx nil) or EnqueueManyTx that also reports
// which unique jobs were duplicates.
func (q *Queue) InsertMany(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]Inserted, error) {
	return q.insert(ctx, tx, specs)
}

func (q *Queue) enqueue(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]uuid.UUID, error) {
	res, err := q.insert(ctx, tx, specs)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids, nil
}

func (q *Queue) insert(ctx context.Context, tx pgx.Tx, specs []JobSpec) (out []Inserted, err error) {
	if h := q.cfg.hooks.Enqueued; h != nil {
		start := time.Now()
		defer func() {
			ev := EnqueueEvent{Jobs: len(specs), Duration: time.Since(start), Err: err}
			for i, s := range specs {
				if i == 0 {
					ev.Type = s.Type
				} else if s.Type != ev.Type {
					ev.Type = ""
				}
			}
			for _, r := range out {
				if r.Duplicate {
					ev.Duplicates++
				}
			}
			h(ctx, ev)
		}()
	}
	return q.insertSpecs(ctx, tx, specs)
}

func (q *Queue) insertSpecs(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]Inserted, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	if len(specs) == 0 {
		return nil, invalid("jobs", "no jobs given")
	}
	jobs, graph, err := buildBatch(specs)
	if err != nil {
		return nil, err
	}
	if graph {
		return q.insertGraph(ctx, tx, jobs)
	}
	rows := make([]store.NewJob, len(jobs))
	out := make([]Inserted, len(jobs))
	posts := make([]posting, 0, 1)
	for i, j := range jobs {
		rows[i], out[i] = j.NewJob, Inserted{ID: j.ID}
		posts = append(posts, postingOf(j.Type, j.Tags, j.Delay, j.RunAt))
	}
	posts = dedupePostings(posts)

	var now []posting
	var db store.DB = q.pool
	inline := false
	switch {
	case q.cfg.pollOnly:
	case tx != nil:
		db = tx
		now = posts // delivered only if the caller's transaction commits
	case q.notif.inline():
		// Nothing else of this process is notifying: the insert carries
		// its own NOTIFY, saving the notifier's round trip.
		inline, now = true, posts
	}
	err = q.store.Insert(ctx, db, rows, encodePostings(now))
	if inline {
		q.notif.inlineDone()
	}
	if err != nil {
		return nil, classify(fmt.Errorf("enqueueing %d job(s): %w", len(rows), err))
	}
	if !inline {
		q.afterCommit(tx, posts)
	}
	return out, nil
}

// insertGraph inserts jobs with dependencies, ordering keys or unique keys
// in one transaction: the caller's, or one of its own.
func (q *Queue) insertGraph(ctx context.Context, tx pgx.Tx, jobs []store.GraphJob) ([]Inserted, error) {
	var out []Inserted
	var posts []posting
	callerTx := tx
	run := func(tx pgx.Tx) error {
		res, err := q.store.InsertGraph(ctx, tx, jobs)
		if errors.Is(err, store.ErrUnknownPrerequisites) {
			return invalid("depends on", "%v", err)
		}
		if err != nil {
			return fmt.Errorf("enqueueing %d job(s): %w", len(jobs), err)
		}
		out, posts = make([]Inserted, len(res)), nil
		for i, r := range res {
			out[i] = Inserted{ID: r.ID, Duplicate: r.Duplicate}
			if !r.Duplicate && r.State == string(StateAvailable) {
				posts = append(posts, postingOf(r.Type, r.Tags, r.Delay, r.RunAt))
			}
		}
		posts = dedupePostings(posts)
		if callerTx == nil || q.cfg.pollOnly {
			return nil // announced after the commit
		}
		return q.store.NotifyTx(ctx, tx, encodePostings(posts))
	}
	var err error
	if tx != nil {
		err = run(tx)
	} else {
		err = pgx.BeginFunc(ctx, q.pool, run)
	}
	if err != nil {
		return nil, classify(err)
	}
	q.afterCommit(tx, posts)
	return out, nil
}

// afterCommit announces jobs inserted outside a caller's transaction once
// they are committed: to this process's workers in poll-only mode, else
// through the notifier.
func (q *Queue) afterCommit(tx pgx.Tx, posts []posting) {
	switch {
	case tx != nil:
	case q.cfg.pollOnly:
		q.postLocal(posts)
	default:
		q.notif.post(posts)
	}
}

func postingOf(typ string, tags []byte, delay time.Duration, runAt *time.Time) posting {
	p := posting{Type: typ, In: delay.Milliseconds()}
	if runAt != nil {
		p.In = time.Until(*runAt).Milliseconds()
	}
	p.In = max(p.In, 0)
	if len(tags) > 2 { // not "{}"
		_ = json.Unmarshal(tags, &p.Tags)
	}
	return p
}

// dedupePostings keeps the earliest posting per (type, tags).
func dedupePostings(ps []posting) []posting {
	if len(ps) < 2 {
		return ps
	}
	idx := map[string]int{}
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

func (q *Queue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// buildBatch validates specs and turns them into rows; graph reports
// whether any job uses dependencies, ordering or unique keys.
func buildBatch(specs []JobSpec) ([]store.GraphJob, bool, error) {
	jobs := make([]store.GraphJob, len(specs))
	index := make(map[uuid.UUID]int, len(specs))
	graph := false
	wrap := func(i int, err error) error {
		if len(specs) > 1 {
			return fmt.Errorf("job %d: %w", i, err)
		}
		return err
	}
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
	case c.maxAttempts < 1:
		return store.GraphJob{}, invalid("max attempts", "must be at least 1, got %d", c.maxAttempts)
	case c.delay < 0:
		return store.GraphJob{}, invalid("delay", "must not be negative, got %s", c.delay)
	case c.timeout < 0:
		return store.GraphJob{}, invalid("timeout", "must not be negative, got %s", c.timeout)
	case c.runAt != nil && c.runAt.IsZero():
		return store.GraphJob{}, invalid("run at", "zero time")
	case c.catchUp != 0:
		return store.GraphJob{}, invalid("catch up", "only for periodic jobs (Every, Cron)")
	case len(c.dependsOn) > MaxDependsOn:
		return store.GraphJob{}, invalid("depends on", "%d prerequisites exceeds the limit of %d", len(c.dependsOn), MaxDependsOn)
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
			Delay: c.delay, MaxAttempts: int32(c.maxAttempts), Timeout: c.timeout},
		DependsOn: deps, OrderingKey: c.orderingKey, UniqueKey: c.uniqueKey,
	}, nil
}

// validateKey checks an ordering or unique key ("" means none).
func validateKey(field, k string) error { return validateText(field, k, MaxKeyBytes, true) }

// encodeArgs turns args into JSON text: raw JSON is validated, anything else
// marshalled. The result must fit MaxArgsBytes and contain no NUL character
// (PostgreSQL's jsonb cannot store \u0000).
func encodeArgs(args any) (json.RawMessage, error) {
	var b []byte
	switch a := args.(type) {
	case nil:
		b = []byte("null")
	case json.RawMessage:
		if !json.Valid(a) {
			return nil, invalid("args", "not valid JSON")
		}
		b = a
	case []byte:
		if !json.Valid(a) {
			return nil, invalid("args", "not valid JSON")
		}
		b = a
	default:
		var err error
		if b, err = json.Marshal(args); err != nil {
			return nil, invalid("args", "cannot marshal %T: %v", args, err)
		}
	}
	if len(b) > MaxArgsBytes {
		return nil, invalid("args", "%d bytes exceeds the %d-byte limit", len(b), MaxArgsBytes)
	}
	if containsJSONNul(b) {
		return nil, invalid("args", "contains a NUL character (\\u0000), which PostgreSQL cannot store")
	}
	return append(json.RawMessage(nil), b...), nil
}

func containsJSONNul(b []byte) bool {
	for i := 0; i+5 < len(b); i++ {
		if b[i] == '\\' {
			if string(b[i+1:i+6]) == "u0000" {
				// Make sure the backslash itself is not escaped.
				n := 0
				for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
					n++
				}
				if n%2 == 0 {
					return true
				}
			}
			i++ // skip the escaped character
		}
	}
	return false
}
