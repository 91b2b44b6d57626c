package backlog_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// gauge counts the jobs running at once, overall and per key, and keeps
// the highest counts seen.
type gauge struct {
	mu      sync.Mutex
	now     int
	peak    int
	keyNow  map[string]int
	keyPeak map[string]int
}

func newGauge() *gauge { return &gauge{keyNow: map[string]int{}, keyPeak: map[string]int{}} }

func (g *gauge) enter(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now++
	g.peak = max(g.peak, g.now)
	if key != "" {
		g.keyNow[key]++
		g.keyPeak[key] = max(g.keyPeak[key], g.keyNow[key])
	}
}

func (g *gauge) leave(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now--
	if key != "" {
		g.keyNow[key]--
	}
}

type keyArgs struct {
	Key  string `json:"key"`
	Mode string `json:"mode"` // "", "fail", "timeout", "slow"
}

// Several processes (Queues on separate pools) work one limited type whose
// jobs fail, retry, time out and get cancelled while they run: the running
// count never exceeds the type's limit, nor any key's, and the limit is
// used (the peak reaches it). The jobs cancelled are ones that hold their
// slot until cancelled, so every cancel lands on a running job whatever
// the machine's load.
func TestConcurrencyLimitAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const limit, keyLimit = 4, 2
	require.NoError(t, e.q.SetLimit(ctx, "lim", backlog.Limit{Concurrency: limit, KeyConcurrency: keyLimit}))

	rng := rand.New(rand.NewPCG(1, 2))
	var specs []backlog.JobSpec
	for i := range 150 {
		a := keyArgs{}
		var opts []backlog.EnqueueOption
		if i%5 != 0 { // a fifth without a key
			a.Key = fmt.Sprintf("k%d", rng.IntN(5))
			opts = append(opts, backlog.ConcurrencyKey(a.Key))
		}
		switch r := rng.IntN(10); {
		case i%15 == 7:
			a.Mode = "hold"
		case r == 0:
			a.Mode = "fail"
			opts = append(opts, backlog.MaxAttempts(2))
		case r == 1:
			a.Mode = "timeout"
			opts = append(opts, backlog.Timeout(20*time.Millisecond), backlog.MaxAttempts(2))
		case r == 2:
			a.Mode = "slow"
		}
		specs = append(specs, backlog.JobSpec{Type: "lim", Args: a, Options: opts})
	}
	ids, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)

	g := newGauge()
	holding := make(chan uuid.UUID, 1000)
	h := backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a keyArgs) error {
		g.enter(a.Key)
		defer g.leave(a.Key)
		if a.Mode == "hold" {
			holding <- job.ID
			<-ctx.Done() // until cancelled (or Work stops)
			return ctx.Err()
		}
		d := time.Duration(1+rand.IntN(5)) * time.Millisecond
		switch a.Mode {
		case "timeout", "slow":
			d = 60 * time.Millisecond
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
		if a.Mode == "fail" {
			return errors.New("failing on purpose")
		}
		return nil
	})
	bo := backlog.RetryBackoff(backlog.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond})
	for i := range 3 {
		q := e.q
		if i > 0 {
			q = e.queue(testdb.NewPool(t, 8))
		}
		work(t, q, h, backlog.Concurrency(6), bo, backlog.Types("lim"))
	}
	// Cancel the holding jobs as they run: each holds its slot until then.
	holds := 0
	for _, sp := range specs {
		if sp.Args.(keyArgs).Mode == "hold" {
			holds++
		}
	}
	for cancelled := 0; cancelled < holds; cancelled++ {
		select {
		case id := <-holding:
			st, err := e.q.Cancel(ctx, id)
			require.NoError(t, err)
			require.False(t, st.Terminal(), "a holding job ended before it was cancelled")
		case <-time.After(60 * time.Second):
			t.Fatalf("%d of %d holding jobs started within a minute", cancelled, holds)
		}
	}
	for _, id := range ids {
		e.waitJob(id, 60*time.Second, func(i *backlog.JobInfo) bool { return i.State.Terminal() })
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	require.LessOrEqual(t, g.peak, limit, "jobs running at once")
	require.Equal(t, limit, g.peak, "the limit was never reached: slots went unused")
	for k, p := range g.keyPeak {
		require.LessOrEqual(t, p, keyLimit, "jobs of key %s running at once", k)
	}
	require.Equal(t, 0, e.countLive("state = 'running'"))
}

// startsWithin returns the largest number of starts (sorted times) that
// fall within one window shorter than w.
func startsWithin(starts []time.Time, w time.Duration) int {
	most := 0
	for i := range starts {
		n := 0
		for _, s := range starts[i:] {
			if s.Sub(starts[i]) < w {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// A rate limit of 10 a second, default burst (1): what the limit promises
// is that no window of a second sees more than Rate + Burst - 1 = 10
// starts (on the database's clock, which charges the rate); and the rate
// is used (a busy machine may start fewer, never more).
func TestRateLimit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "rated", backlog.Limit{Rate: 10, Per: time.Second}))
	starts := rateStarts(t, e, "rated", 200, 5*time.Second)
	t.Logf("starts in 5 s: %d", len(starts))
	require.LessOrEqual(t, startsWithin(starts, time.Second), 10, "starts in one window of a second")
	require.LessOrEqual(t, len(starts), 51, "starts in 5 s")
	require.GreaterOrEqual(t, len(starts), 25, "the rate was not used: starts in 5 s")
}

// A rate of 10 a second with a burst of 5: after a quiet spell the burst
// starts at once, at most Burst of them, then one every 100 ms; no window
// of a second sees more than Rate + Burst - 1 = 14.
func TestRateLimitBurst(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "burst", backlog.Limit{Rate: 10, Per: time.Second, Burst: 5}))
	starts := rateStarts(t, e, "burst", 100, 3*time.Second)
	t.Logf("starts in 3 s: %d; in the first 250 ms: %d", len(starts), startsWithin(starts[:min(len(starts), 10)], 250*time.Millisecond))
	require.LessOrEqual(t, startsWithin(starts, 100*time.Millisecond), 5, "starts at once: more than the burst")
	require.LessOrEqual(t, startsWithin(starts, time.Second), 14, "starts in one window of a second")
	// The burst is allowed: the first 250 ms see it (and at most two
	// more starts of the rate).
	n := 0
	for _, s := range starts {
		if s.Sub(starts[0]) < 250*time.Millisecond {
			n++
		}
	}
	require.GreaterOrEqual(t, n, 5, "the burst was not allowed at once")
}

// rateStarts enqueues n jobs of typ, works them with ten workers, and
// returns the start times, on the database's clock (each job's claim: a
// rate is charged at the claim's now()), within window of the first.
func rateStarts(t *testing.T, e *env, typ string, n int, window time.Duration) []time.Time {
	t.Helper()
	first := make(chan struct{})
	var once sync.Once
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		once.Do(func() { close(first) })
		return nil
	}), backlog.Concurrency(10), backlog.Types(typ))
	specs := make([]backlog.JobSpec, n)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: typ}
	}
	_, err := e.q.EnqueueMany(context.Background(), specs)
	require.NoError(t, err)
	<-first
	<-time.After(window + 200*time.Millisecond) // the measured window, and a margin
	rows, err := e.pool.Query(context.Background(), `SELECT started_at FROM "`+e.schema+`".all_jobs
WHERE type = $1 AND started_at IS NOT NULL ORDER BY started_at`, typ)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	var out []time.Time
	for _, s := range all {
		if s.Sub(all[0]) < window {
			out = append(out, s)
		}
	}
	return out
}

// One key with many waiting jobs and many keys with a few each: the small
// keys' jobs are taken in turn with the big key's, not after it.
func TestFairnessAcrossKeys(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var specs []backlog.JobSpec
	for range 2000 {
		specs = append(specs, backlog.JobSpec{Type: "fair", Args: keyArgs{Key: "big"}, Options: []backlog.EnqueueOption{backlog.ConcurrencyKey("big")}})
	}
	for k := range 20 {
		key := fmt.Sprintf("small-%02d", k)
		for range 5 {
			specs = append(specs, backlog.JobSpec{Type: "fair", Args: keyArgs{Key: key}, Options: []backlog.EnqueueOption{backlog.ConcurrencyKey(key)}})
		}
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	var mu sync.Mutex
	var order []string
	smallDone := make(chan struct{})
	small := 0
	work(t, e.q, backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a keyArgs) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, a.Key)
		if a.Key != "big" {
			if small++; small == 100 {
				close(smallDone)
			}
		}
		return nil
	}), backlog.Concurrency(4), backlog.Types("fair"))
	select {
	case <-smallDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the small keys' jobs did not all run")
	}
	mu.Lock()
	defer mu.Unlock()
	last := 0
	for i, k := range order {
		if k != "big" {
			last = i
		}
	}
	t.Logf("the last small-key job started as number %d of %d started", last+1, len(order))
	// Round-robin: about one big job per round of 21 groups, so the 100
	// small jobs are claimed within about 105 (prefetch adds a batch);
	// first in, first out, they would start after the 2,000 big ones. The
	// bound is on starts, which a loaded machine reorders: a worker handed
	// a small job can be descheduled while the others run hundreds of big
	// ones (423 starts seen beside a CPU burner).
	require.Less(t, last, 1000, "small keys waited behind the big one")
}

// Raising a limit lets more jobs start at once, and removing it releases
// every waiting job.
func TestLimitChangesTakeEffectAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "chg", backlog.Limit{Concurrency: 1}))
	specs := make([]backlog.JobSpec, 20)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "chg"}
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	release := make(chan struct{})
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}), backlog.Concurrency(10), backlog.Types("chg"))
	e.waitCount("state = 'running'", 1, 5*time.Second)
	// Still one while the limit is 1 (the claim path had every chance:
	// ten idle workers).
	require.Equal(t, 1, e.countLive("state = 'running'"))
	start := time.Now()
	require.NoError(t, e.q.SetLimit(ctx, "chg", backlog.Limit{Concurrency: 4}))
	e.waitCount("state = 'running'", 4, time.Second)
	require.Equal(t, 4, e.countLive("state = 'running'"))
	require.NoError(t, e.q.RemoveLimit(ctx, "chg"))
	e.waitCount("state = 'running'", 10, time.Second)
	t.Logf("raised and removed within %s", time.Since(start))
	lims, err := e.q.Limits(ctx)
	require.NoError(t, err)
	require.Empty(t, lims)
	close(release)
}

// With a limit of 1 and the next job waiting, the end of the running job
// starts the next one in another process at once: the freed slot is
// announced, not found by a poll (the backup poll is an hour here, and a
// held-back domain's own look every second comes later).
func TestFreedSlotStartsTheNextJobAtOnce(t *testing.T) {
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "one", backlog.Limit{Concurrency: 1}))
	q2 := e.queue(testdb.NewPool(t, 4), backlog.WithPollInterval(time.Hour))
	a, err := e.q.Enqueue(ctx, "one", nil)
	require.NoError(t, err)
	release := make(chan struct{})
	running := make(chan uuid.UUID, 2)
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		running <- job.ID
		if job.ID == a {
			<-release
		}
		return nil
	})
	work(t, e.q, h, backlog.Concurrency(1), backlog.Types("one"))
	require.Equal(t, a, <-running)
	b, err := e.q.Enqueue(ctx, "one", nil)
	require.NoError(t, err)
	work(t, q2, h, backlog.Concurrency(2), backlog.Types("one"))
	select {
	case id := <-running:
		t.Fatalf("job %s started while the only slot was taken", id)
	case <-time.After(300 * time.Millisecond): // every process had the chance
	}
	close(release)
	// Sooner than a held-back domain's own look every second (the last
	// one was about 300 ms ago): the freed slot's announcement woke it.
	select {
	case id := <-running:
		require.Equal(t, b, id)
	case <-time.After(600 * time.Millisecond):
		t.Fatal("the waiting job did not start when the slot was freed")
	}
}

func TestLimitBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []struct {
		typ   string
		l     backlog.Limit
		field string
	}{
		{"", backlog.Limit{Concurrency: 1}, "type"},
		{"t", backlog.Limit{}, "limit"},
		{"t", backlog.Limit{Concurrency: -1}, "concurrency"},
		{"t", backlog.Limit{KeyConcurrency: -2}, "key concurrency"},
		{"t", backlog.Limit{Rate: -1, Per: time.Second}, "rate"},
		{"t", backlog.Limit{Rate: 5}, "per"},
		{"t", backlog.Limit{Rate: 5, Per: time.Microsecond}, "per"},
		{"t", backlog.Limit{Rate: 5, Per: 1500 * time.Microsecond}, "per"},
		{"t", backlog.Limit{Rate: 5, Per: time.Second, Burst: 6}, "burst"},
		{"t", backlog.Limit{Concurrency: 1, Burst: 1}, "rate"},
		{"t", backlog.Limit{Concurrency: 2, KeyConcurrency: 3}, "key concurrency"},
		{"t", backlog.Limit{Concurrency: backlog.MaxLimit + 1}, "concurrency"},
	} {
		err := e.q.SetLimit(ctx, c.typ, c.l)
		var ie *backlog.InputError
		require.ErrorAs(t, err, &ie, "%+v", c)
		require.Equal(t, c.field, ie.Field, "%+v: %v", c, err)
	}
	_, err := e.q.Enqueue(ctx, "t", nil, backlog.ConcurrencyKey("bad\x00key"))
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "concurrency key", ie.Field)
	lims, err := e.q.Limits(ctx)
	require.NoError(t, err)
	require.Empty(t, lims, "nothing written")
	require.Equal(t, 0, e.count("true"))

	// Burst's default: the starts of 100 ms, at least 1.
	require.NoError(t, e.q.SetLimit(ctx, "t", backlog.Limit{Rate: 100, Per: time.Second}))
	require.NoError(t, e.q.SetLimit(ctx, "u", backlog.Limit{Rate: 10, Per: time.Second, RatePerKey: true}))
	lims, err = e.q.Limits(ctx)
	require.NoError(t, err)
	require.Len(t, lims, 2)
	require.Equal(t, 10, lims[0].Burst)
	require.Equal(t, 1, lims[1].Burst)
	require.True(t, lims[1].RatePerKey)
}

// A concurrency key survives a finish and a retry from history, and keyed
// jobs without limits are claimed round-robin too.
func TestConcurrencyKeyKeptAcrossRetry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id, err := e.q.Enqueue(ctx, "keep", nil, backlog.ConcurrencyKey("tenant:1"), backlog.MaxAttempts(1))
	require.NoError(t, err)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		return backlog.Permanent(errors.New("no"))
	}), backlog.Types("keep"))
	e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Equal(t, 1, e.count("concurrency_key = 'tenant:1' AND state = 'failed'"))
	_, err = e.q.Retry(ctx, id)
	require.NoError(t, err)
	e.waitState(id, 10*time.Second, backlog.StateFailed)
	require.Equal(t, 1, e.count("concurrency_key = 'tenant:1' AND attempt = 2"))
}

// A key's limit counts the jobs a claim takes at every priority: a key
// with jobs at three priorities still runs one at a time.
func TestKeyConcurrencyAcrossPriorities(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "prio", backlog.Limit{KeyConcurrency: 1}))
	var specs []backlog.JobSpec
	for i := range 9 {
		specs = append(specs, backlog.JobSpec{Type: "prio", Args: keyArgs{Key: "tenant"},
			Options: []backlog.EnqueueOption{backlog.ConcurrencyKey("tenant"), backlog.Priority(i % 3)}})
	}
	ids, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	g := newGauge()
	work(t, e.q, backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a keyArgs) error {
		g.enter(a.Key)
		defer g.leave(a.Key)
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	}), backlog.Concurrency(3), backlog.Types("prio"))
	for _, id := range ids {
		e.waitState(id, 30*time.Second, backlog.StateCompleted)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Equal(t, 1, g.keyPeak["tenant"], "jobs of the key running at once")
}

// Changing a type's limits forgets what the claims knew of its running
// jobs: 8 jobs started under a rate limit keep a new Concurrency of 5 from
// starting any more.
func TestNewLimitCountsJobsAlreadyRunning(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "chg2", backlog.Limit{Concurrency: 2}))
	specs := make([]backlog.JobSpec, 14)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "chg2"}
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	release := make(chan struct{})
	var started atomic.Int64
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if started.Add(1) <= 2 {
			return nil // the first two end at once
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	work(t, e.q, h, backlog.Concurrency(8), backlog.Types("chg2"))
	e.waitCount("state = 'completed'", 2, 10*time.Second)
	require.NoError(t, e.q.SetLimit(ctx, "chg2", backlog.Limit{Rate: 1000, Per: time.Second}))
	// Every worker runs a handler (8: the first two ended at once).
	for deadline := time.Now().Add(10 * time.Second); started.Load() < 10; {
		require.True(t, time.Now().Before(deadline), "%d of 10 handlers started", started.Load())
		<-time.After(5 * time.Millisecond)
	}
	require.NoError(t, e.q.SetLimit(ctx, "chg2", backlog.Limit{Concurrency: 5}))
	// What the first process claimed ahead under the rate goes back: the
	// 8 handlers are all that run.
	deadline := time.Now().Add(10 * time.Second)
	for e.countLive("state = 'running'") != 8 {
		require.True(t, time.Now().Before(deadline), "jobs claimed ahead were not given back: %d running", e.countLive("state = 'running'"))
		<-time.After(5 * time.Millisecond)
	}
	running := 8
	var second atomic.Int64
	q2 := e.queue(testdb.NewPool(t, 4))
	work(t, q2, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		second.Add(1)
		return nil
	}), backlog.Concurrency(4), backlog.Types("chg2"))
	<-time.After(500 * time.Millisecond) // every process had the chance to claim
	require.Zero(t, second.Load(), "jobs started over the new limit")
	require.Equal(t, running, e.countLive("state = 'running'"), "jobs claimed over the new limit")
	close(release)
}

// Keys whose jobs the worker's tags exclude do not keep it from the keys
// after them.
func TestKeysOfOtherTagsDoNotStarveTheRest(t *testing.T) {
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		_, err := e.q.Enqueue(ctx, "tagged", nil, backlog.ConcurrencyKey(k), backlog.Tags{"gpu": "1"})
		require.NoError(t, err)
	}
	z, err := e.q.Enqueue(ctx, "tagged", nil, backlog.ConcurrencyKey("z"))
	require.NoError(t, err)
	work(t, e.q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
		backlog.Concurrency(1), backlog.Types("tagged"))
	e.waitState(z, 5*time.Second, backlog.StateCompleted)
}

// A job swept to failed (its lease expired on its last attempt) frees its
// slot, and the sweep announces it: the next job starts at once, not at a
// held-back domain's own look a second later.
func TestSweptJobFreesItsSlotAtOnce(t *testing.T) {
	e := newEnv(t, backlog.WithPollInterval(time.Hour))
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "swept", backlog.Limit{Concurrency: 1}))
	a, err := e.q.Enqueue(ctx, "swept", nil, backlog.MaxAttempts(1))
	require.NoError(t, err)
	started := make(chan uuid.UUID, 2)
	release := make(chan struct{})
	defer close(release)
	work(t, e.q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		started <- job.ID
		if job.ID == a {
			<-release // stuck: its lease will be taken from it
		}
		return nil
	}), backlog.Concurrency(2), backlog.Types("swept"))
	require.Equal(t, a, <-started)
	b, err := e.q.Enqueue(ctx, "swept", nil)
	require.NoError(t, err)
	select {
	case id := <-started:
		t.Fatalf("job %s started while the only slot was taken", id)
	case <-time.After(300 * time.Millisecond):
	}
	// The process holding a is cut off: its lease expires (a token it does
	// not hold, so its heartbeat cannot renew it) and another sweeps.
	_, err = e.pool.Exec(ctx, `UPDATE "`+e.schema+`".jobs SET lease_expires_at = now() - interval '1 second',
		lease_token = gen_random_uuid() WHERE id = $1`, a)
	require.NoError(t, err)
	q2 := e.queue(e.pool)
	_, err = q2.SweepExpired(ctx)
	require.NoError(t, err)
	select {
	case id := <-started:
		require.Equal(t, b, id)
	case <-time.After(600 * time.Millisecond):
		t.Fatal("the waiting job did not start when the sweep freed the slot")
	}
	e.waitState(a, 5*time.Second, backlog.StateFailed)
}

// TestMigration22RollingUpgrade: processes of version 21 keep running
// against a schema at 0022. Migration 0022 replaced only claim_type's body
// (same signature), which claim_jobs calls; the claim statement a process
// sends (internal/store's claim) is the same in versions 21 and 22, so a
// process of either version claims through the new body: keyed jobs under
// a per-key limit of 1, worked by two processes, all complete, and no key
// ever runs two at once.
func TestMigration22RollingUpgrade(t *testing.T) {
	t.Parallel()
	var specs []backlog.JobSpec
	for i := range 60 {
		key := fmt.Sprintf("tenant-%d", i%6)
		specs = append(specs, backlog.JobSpec{Type: "v21", Args: keyArgs{Key: key}, Options: []backlog.EnqueueOption{backlog.ConcurrencyKey(key)}})
	}
	peaks := keyedAcrossProcesses(t, 22, 1, specs, 2, 8, 5*time.Millisecond)
	for k, peak := range peaks {
		require.Equal(t, 1, peak, "jobs of %s running at once", k)
	}
}

// keyedAcrossProcesses works specs (one type, keyed jobs' args keyArgs)
// under a per-key limit of keyLimit in processes processes of concurrency
// workers each, each job taking d, against a schema at version (or
// later): every job completes in one attempt and no key runs more than
// keyLimit at once. It returns each key's peak.
func keyedAcrossProcesses(t *testing.T, version int64, keyLimit int, specs []backlog.JobSpec, processes, concurrency int, d time.Duration) map[string]int {
	e := newEnv(t)
	ctx := context.Background()
	st, err := e.q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Version, version)
	typ := specs[0].Type
	require.NoError(t, e.q.SetLimit(ctx, typ, backlog.Limit{KeyConcurrency: keyLimit}))
	_, err = e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	g := newGauge()
	h := backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a keyArgs) error {
		g.enter(a.Key)
		defer g.leave(a.Key)
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return nil
	})
	for range processes {
		work(t, e.queue(testdb.NewPool(t, 4)), h, backlog.Concurrency(concurrency), backlog.Types(typ))
	}
	e.waitCount(`state = 'completed'`, len(specs), 60*time.Second)
	require.Zero(t, e.count(`attempt <> 1`), "jobs that ran more than once")
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, p := range g.keyPeak {
		require.LessOrEqual(t, p, keyLimit, "jobs of key %s running at once", k)
	}
	return maps.Clone(g.keyPeak)
}

// TestMigration24RollingUpgrade: processes of version 23 keep running
// against a schema at 0024. Migration 0024 replaced only claim_jobs's body
// (same signature and columns): the claim statement a process sends is
// the same in versions 23 and 24, so processes of either version claim
// through the new body, whose plain claims now take the claim lock the
// claims of limited types already took. Three processes working plain
// jobs and jobs of a type limited to 2 at once: every job completes in
// one attempt, and the limit holds.
func TestMigration24RollingUpgrade(t *testing.T) {
	t.Parallel()
	limitedAcrossProcesses(t, 24, "v23", "v23limited", backlog.Limit{Concurrency: 2})
}

// TestMigration26RollingUpgrade: processes of version 25 keep running
// against a schema at 0026, which replaced only claim_type's body (same
// signature; claim_jobs calls it): the claim statement a process sends is
// the same in versions 25 and 26. Three processes working plain jobs and
// jobs of a type limited to 2 at once, of which a limit of 1,000 (never
// binding) on the plain type now counts its running jobs again when a
// stale bound would cap a claim: every job completes in one attempt, and
// the limit of 2 holds.
func TestMigration26RollingUpgrade(t *testing.T) {
	t.Parallel()
	limitedAcrossProcesses(t, 26, "v25", "v25limited", backlog.Limit{Concurrency: 2}, backlog.Limit{Concurrency: 1000})
}

// TestMigration27RollingUpgrade: processes of version 26 keep running
// against a schema at 0027, which replaced only claim_type's body (same
// signature; claim_jobs calls it, and the claim statement a process sends
// is the same in versions 26 and 27). Three processes work jobs of 30 keys
// limited to 2 each, a key with many jobs and keys with one, and jobs
// without a key: every job completes in one attempt, no key ever runs
// more than 2 at once, and the limit is used.
func TestMigration27RollingUpgrade(t *testing.T) {
	t.Parallel()
	var specs []backlog.JobSpec
	for i := range 300 {
		key := fmt.Sprintf("k%02d", i%30)
		if i%3 == 0 {
			key = "big"
		}
		a := keyArgs{Key: key}
		opts := []backlog.EnqueueOption{backlog.ConcurrencyKey(key)}
		if i%10 == 1 {
			a, opts = keyArgs{}, nil
		}
		specs = append(specs, backlog.JobSpec{Type: "v26keys", Args: a, Options: opts})
	}
	peaks := keyedAcrossProcesses(t, 27, 2, specs, 3, 10, 2*time.Millisecond)
	require.Equal(t, 2, peaks["big"], "the big key never ran 2 at once: its limit went unused")
}

// limitedAcrossProcesses runs 600 jobs of type plain and 40 of type
// limited, whose limit is lim (at most 2 at once), in three processes
// against a schema at version (or later), plain's limit being plainLim
// when given; every job completes in one attempt and at most 2 of limited
// run at once.
func limitedAcrossProcesses(t *testing.T, version int64, plain, limited string, lim backlog.Limit, plainLim ...backlog.Limit) {
	e := newEnv(t)
	ctx := context.Background()
	st, err := e.q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Version, version)
	require.NoError(t, e.q.SetLimit(ctx, limited, lim))
	for _, l := range plainLim {
		require.NoError(t, e.q.SetLimit(ctx, plain, l))
	}
	var specs []backlog.JobSpec
	for i := range 600 {
		specs = append(specs, backlog.JobSpec{Type: plain, Args: i})
	}
	for i := range 40 {
		specs = append(specs, backlog.JobSpec{Type: limited, Args: i})
	}
	_, err = e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	var running, peak atomic.Int32
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		if job.Type != limited {
			return nil
		}
		n := running.Add(1)
		defer running.Add(-1)
		raisePeak(&peak, n)
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	for range 3 {
		work(t, e.queue(testdb.NewPool(t, 4)), h, backlog.Concurrency(10), backlog.Types(plain, limited))
	}
	e.waitCount(`state = 'completed'`, len(specs), 60*time.Second)
	require.Zero(t, e.count(`attempt <> 1`), "jobs that ran more than once")
	require.LessOrEqual(t, peak.Load(), int32(2), "the limit of 2")
}
