package backlog

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// JobSpec describes one job for EnqueueMany.
type JobSpec struct {
	// ID is the job's ID. Leave it zero to have one generated; set it (with
	// NewID) when other jobs of the same batch must refer to this one. It
	// must be a UUIDv7 (IDs ordered by creation time are what lookups of
	// finished jobs rely on) and name no existing job.
	ID uuid.UUID
	// Type selects the handler. Required, unless Args is a JobArgs: its
	// Kind is then the type (and Type, when set, must equal it).
	Type string
	// Args are marshalled to JSON; json.RawMessage and []byte are taken as
	// JSON text and validated. A JobArgs (see Spec) brings its Kind and
	// its default options (JobArgsWithOptions), which apply before Options.
	Args any
	// Options are the job's enqueue options (Tags, Priority, …).
	Options []EnqueueOption
}

// buildBatch validates specs and turns them into rows; graph reports
// whether any job uses dependencies, ordering or unique keys.
func buildBatch(specs []resolvedSpec) ([]store.GraphJob, bool, error) {
	if len(specs) > MaxBatchJobs {
		return nil, false, invalid("jobs", "%d jobs in one call exceeds the limit of %d (split the batch; inside one transaction, call EnqueueManyTx several times)", len(specs), MaxBatchJobs)
	}
	jobs := make([]store.GraphJob, len(specs))
	index := make(map[uuid.UUID]int, len(specs))
	graph := false
	wrap := func(i int, err error) error { return fieldErr(i, len(specs) > 1, err) }
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
func buildJob(s resolvedSpec) (store.GraphJob, error) {
	if s.err != nil {
		return store.GraphJob{}, s.err
	}
	c := enqueueConfig{priority: DefaultPriority, maxAttempts: DefaultMaxAttempts}
	for _, o := range s.options() {
		if o == nil {
			return store.GraphJob{}, invalid("options", "nil option")
		}
		o.applyEnqueue(&c)
	}
	if _, typed := s.Args.(JobArgs); !typed { // resolve validated a Kind
		if err := validateType(s.typ); err != nil {
			return store.GraphJob{}, err
		}
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
	case c.maxAttempts < 1 || c.maxAttempts > maxAttemptsLimit:
		return store.GraphJob{}, invalid("max attempts", "must be in [1, %d], got %d", maxAttemptsLimit, c.maxAttempts)
	case c.delay < 0:
		return store.GraphJob{}, invalid("delay", "must not be negative, got %s", c.delay)
	case c.runAt != nil && c.runAt.IsZero():
		return store.GraphJob{}, invalid("run at", "zero time")
	case c.runAt != nil && (c.runAt.Before(minRunAt) || c.runAt.After(maxRunAt)):
		return store.GraphJob{}, invalid("run at", "%s is outside the years 1 to 9999", c.runAt.UTC().Format(time.RFC3339))
	case c.catchUp != 0:
		return store.GraphJob{}, invalid("catch up", "only for periodic jobs (Every, Cron)")
	case len(c.dependsOn) > maxDependsOn:
		return store.GraphJob{}, invalid("depends on", "%d prerequisites exceeds the limit of %d", len(c.dependsOn), maxDependsOn)
	}
	if err := validateMillis("timeout", c.timeout, 0); err != nil {
		return store.GraphJob{}, err
	}
	if err := validateKey("ordering key", c.orderingKey); err != nil {
		return store.GraphJob{}, err
	}
	if err := validateKey("unique key", c.uniqueKey); err != nil {
		return store.GraphJob{}, err
	}
	if err := validateKey("concurrency key", c.concKey); err != nil {
		return store.GraphJob{}, err
	}
	meta, err := validateMetadata(c.meta)
	if err != nil {
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
	switch {
	case id == uuid.Nil:
		id = NewID()
	case id.Version() != 7:
		// Finished jobs are found by ID through an index that relies on
		// IDs ordered by creation time.
		return store.GraphJob{}, invalid("id", "%s is a version %d UUID; use backlog.NewID (a UUIDv7)", id, id.Version())
	}
	return store.GraphJob{
		NewJob: store.NewJob{ID: id, Type: s.typ, Args: args, Tags: tags, Priority: int16(c.priority), RunAt: c.runAt,
			Delay: ceilMillis(c.delay), MaxAttempts: int32(c.maxAttempts), Timeout: ceilMillis(c.timeout),
			ConcurrencyKey: c.concKey, Meta: meta},
		DependsOn: deps, OrderingKey: c.orderingKey, UniqueKey: c.uniqueKey,
	}, nil
}

// fieldErr names the batch member err is about, when there are several.
func fieldErr(index int, batch bool, err error) error {
	if !batch {
		return err
	}
	return fmt.Errorf("job %d: %w", index, err)
}
