package backlog

import (
	"context"
	"encoding/json"
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

func (q *Queue) enqueue(ctx context.Context, tx pgx.Tx, specs []JobSpec) ([]uuid.UUID, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	if len(specs) == 0 {
		return nil, invalid("jobs", "no jobs given")
	}
	rows := make([]store.NewJob, len(specs))
	ids := make([]uuid.UUID, len(specs))
	posts := make([]posting, 0, 1)
	seen := make(map[uuid.UUID]bool, len(specs))
	for i, s := range specs {
		r, err := buildJob(s)
		if err != nil {
			if len(specs) > 1 {
				return nil, fmt.Errorf("job %d: %w", i, err)
			}
			return nil, err
		}
		if seen[r.ID] {
			return nil, fmt.Errorf("job %d: %w", i, invalid("id", "%s appears twice in the batch", r.ID))
		}
		seen[r.ID] = true
		rows[i], ids[i] = r, r.ID
		p := posting{Type: r.Type, In: r.Delay.Milliseconds()}
		if r.RunAt != nil {
			p.In = time.Until(*r.RunAt).Milliseconds()
		}
		p.In = max(p.In, 0)
		if len(specs[i].Options) > 0 {
			_ = json.Unmarshal(r.Tags, &p.Tags)
		}
		posts = append(posts, p)
	}
	posts = dedupePostings(posts)

	var now, held []posting
	switch {
	case q.cfg.pollOnly:
		// no NOTIFY; local wake after commit below
	case tx != nil:
		now = posts // delivered only if the caller's transaction commits
	default:
		now, held = q.notif.take(posts)
	}
	var db store.DB = q.pool
	if tx != nil {
		db = tx
	}
	if err := q.store.Insert(ctx, db, rows, encodePostings(now)); err != nil {
		return nil, fmt.Errorf("enqueueing %d job(s): %w", len(rows), err)
	}
	switch {
	case q.cfg.pollOnly && tx == nil:
		q.postLocal(posts)
	case tx == nil:
		q.notif.hold(held)
	}
	return ids, nil
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

// buildJob validates one spec and turns it into a row.
func buildJob(s JobSpec) (store.NewJob, error) {
	if err := validateType(s.Type); err != nil {
		return store.NewJob{}, err
	}
	c := enqueueConfig{priority: DefaultPriority, maxAttempts: DefaultMaxAttempts}
	for _, o := range s.Options {
		if o == nil {
			return store.NewJob{}, invalid("options", "nil option")
		}
		o.applyEnqueue(&c)
	}
	args, err := encodeArgs(s.Args)
	if err != nil {
		return store.NewJob{}, err
	}
	if err := validateTags("tags", c.tags); err != nil {
		return store.NewJob{}, err
	}
	switch {
	case c.priority < MinPriority || c.priority > MaxPriority:
		return store.NewJob{}, invalid("priority", "%d is outside [%d, %d]", c.priority, MinPriority, MaxPriority)
	case c.maxAttempts < 1:
		return store.NewJob{}, invalid("max attempts", "must be at least 1, got %d", c.maxAttempts)
	case c.delay < 0:
		return store.NewJob{}, invalid("delay", "must not be negative, got %s", c.delay)
	case c.timeout < 0:
		return store.NewJob{}, invalid("timeout", "must not be negative, got %s", c.timeout)
	case c.runAt != nil && c.runAt.IsZero():
		return store.NewJob{}, invalid("run at", "zero time")
	}
	tags := json.RawMessage(`{}`)
	if len(c.tags) > 0 {
		tags, _ = json.Marshal(map[string]string(c.tags)) // strings only: cannot fail
	}
	id := s.ID
	if id == uuid.Nil {
		id = NewID()
	}
	return store.NewJob{ID: id, Type: s.Type, Args: args, Tags: tags, Priority: int16(c.priority), RunAt: c.runAt,
		Delay: c.delay, MaxAttempts: int32(c.maxAttempts), Timeout: c.timeout}, nil
}

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
