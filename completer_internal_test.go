package backlog

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/complete"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testdb"
)

// migratedQueue is a quiet Queue on a fresh, migrated schema, closed at
// the test's end; nothing is started.
func migratedQueue(t *testing.T) *Queue {
	ctx := context.Background()
	q, err := New(ctx, testdb.Pool(t), WithSchema(testdb.Schema(t)), WithLogger(quiet()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.NoError(t, q.Migrate(ctx))
	return q
}

// The completer writes every outcome it holds exactly once, however many
// batches they take: 2.25 batches' worth are queued before it starts, and
// each is written, and reported written, once.
func TestCompleterWritesEveryBatch(t *testing.T) {
	ctx := context.Background()
	q := migratedQueue(t)
	n := complete.MaxBatch*2 + complete.MaxBatch/4
	for i := 0; i < n; i += 5000 {
		specs := make([]JobSpec, min(5000, n-i))
		for k := range specs {
			specs[k] = JobSpec{Type: "batch"}
		}
		_, err := q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
	}
	var took []store.Claimed
	for len(took) < n {
		res, err := q.store.Claim(ctx, []string{"batch"}, []byte(`{}`), n-len(took), n-len(took), time.Minute, "test", nil)
		require.NoError(t, err)
		require.NotEmpty(t, res.Jobs)
		took = append(took, res.Jobs...)
	}

	var mu sync.Mutex
	reported := map[uuid.UUID]int{}
	all := make(chan struct{})
	for _, c := range took {
		q.comp.Submit(&complete.Request{F: store.Finish{ID: c.ID, Token: c.Token, State: string(StateCompleted)}, Type: c.Type,
			Done: func(written bool) {
				mu.Lock()
				defer mu.Unlock()
				require.True(t, written, "job %s", c.ID)
				if reported[c.ID]++; len(reported) == n {
					close(all)
				}
			}})
	}
	q.comp.Start()
	select {
	case <-all:
	case <-time.After(time.Minute):
		mu.Lock()
		t.Fatalf("%d of %d outcomes reported", len(reported), n)
	}
	mu.Lock()
	for id, k := range reported {
		require.Equal(t, 1, k, "job %s reported %d times", id, k)
	}
	mu.Unlock()
	var done int
	require.NoError(t, q.pool.QueryRow(ctx, `SELECT count(*) FROM `+q.cfg.schema+`.all_jobs WHERE state = 'completed'`).Scan(&done))
	require.Equal(t, n, done)
}

// A batch of outcomes announces what it made available once a (type,
// tags), not once a job: the slots of a concurrency limit it freed (a
// limit that does not bind frees hundreds a batch), and retries due now;
// every domain of the type still hears it.
func TestCompleterAnnouncesFreedSlotsOncePerType(t *testing.T) {
	ctx := context.Background()
	q := migratedQueue(t)
	var took []store.Claimed
	for typ, n := range map[string]int{"slot-a": 30, "slot-b": 20, "retry": 10} {
		if typ != "retry" {
			require.NoError(t, q.SetLimit(ctx, typ, Limit{Concurrency: 1000}))
		}
		specs := make([]JobSpec, n)
		for k := range specs {
			specs[k] = JobSpec{Type: typ}
		}
		_, err := q.EnqueueMany(ctx, specs)
		require.NoError(t, err)
		res, err := q.store.Claim(ctx, []string{typ}, []byte(`{}`), n, n, time.Minute, "test", nil)
		require.NoError(t, err)
		require.Len(t, res.Jobs, n)
		took = append(took, res.Jobs...)
	}
	var mu sync.Mutex
	var posted []posting.Posting
	c := complete.New(q.store, complete.Config{Lease: time.Minute, Announce: func(ps []posting.Posting) {
		mu.Lock()
		defer mu.Unlock()
		posted = append(posted, ps...)
	}}, quiet(), q.faults)
	var written sync.WaitGroup
	for _, j := range took {
		f := store.Finish{ID: j.ID, Token: j.Token, State: string(StateCompleted)}
		if j.Type == "retry" {
			f.State, f.Err = string(StateAvailable), store.ErrorText(errors.New("again")) // due now
		} else {
			require.True(t, j.Slot, "job %s holds a slot", j.ID)
		}
		written.Add(1)
		c.Submit(&complete.Request{F: f, Type: j.Type, Slot: j.Slot,
			Done: func(ok bool) {
				assert.True(t, ok, "job %s", j.ID)
				written.Done()
			}})
	}
	c.Start() // everything queued before the writer starts: one batch
	written.Wait()
	c.Stop()
	mu.Lock()
	defer mu.Unlock()
	types := map[string]int{}
	for _, p := range posted {
		types[p.Type]++
	}
	require.Equal(t, map[string]int{"slot-a": 1, "slot-b": 1, "retry": 1}, types, "postings: %+v", posted)
}
