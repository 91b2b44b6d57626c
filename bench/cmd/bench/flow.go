package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backlogq/backlog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Workload 7 (backlog only): flow control. Burn-downs of the same jobs
// with no limit, a global limit that never binds (10,000), a binding one
// (50) and 1,000 concurrency keys limited to 2 each; the utilisation of a
// binding limit of 50 with 20 ms jobs; the wait of small keys' jobs
// behind one big key; the accuracy of a rate limit.

func defineFlowRows(res *results) {
	res.define("flow.none", "flow: burn-down jobs/s, no limit", fmtRate, false)
	res.define("flow.nb", "flow: burn-down jobs/s, global limit 10,000 (not binding)", fmtRate, false)
	res.define("flow.b50", "flow: burn-down jobs/s, global limit 50 (binding)", fmtRate, false)
	res.define("flow.keys", "flow: burn-down jobs/s, 1,000 keys, 2 per key", fmtRate, false)
	res.define("flow.keysall", "flow: burn-down jobs/s, a key a job (100,000 keys; -quick 20,000), 1 per key", fmtRate, false)
	res.define("flow.util", "flow: utilisation of a limit of 50 with 20 ms jobs, % (handlers running ÷ 50, sampled)", fmtDec, false)
	res.define("flow.utildb", "flow: the same, % (rows in state running ÷ 50, sampled; with jobs whose handlers ended, outcomes not yet written)", fmtDec, false)
	res.define("flow.fair", "flow: small keys' p99 wait behind one big key, ms", fmtMs, false)
	res.define("flow.rate", "flow: rate limit 100/s over 5 s, starts (ideal 500)", fmtInt, false)
}

func runFlow(ctx context.Context, env *benchEnv, k kind, res *results) {
	if k.key != "backlog" {
		return
	}
	jobs := 50_000
	bigKey := 100_000
	if env.cfg.quick {
		jobs, bigKey = 10_000, 20_000
	}
	for run := range env.cfg.runs {
		for _, v := range []struct {
			key   string
			limit *backlog.Limit
			keys  int
			jobs  int // 0: jobs
		}{
			{"flow.none", nil, 0, 0},
			{"flow.nb", &backlog.Limit{Concurrency: 10_000}, 0, 0},
			{"flow.b50", &backlog.Limit{Concurrency: 50}, 0, 0},
			{"flow.keys", &backlog.Limit{KeyConcurrency: 2}, 1000, 0},
			{"flow.keysall", &backlog.Limit{KeyConcurrency: 1}, 2 * jobs, 2 * jobs},
		} {
			n := jobs
			if v.jobs > 0 {
				n = v.jobs
			}
			logf("flow: %s, run %d/%d, %d jobs", v.key, run+1, env.cfg.runs, n)
			r, err := flowBurn(ctx, env, n, v.limit, v.keys)
			if err != nil {
				logf("flow: %s: %v", v.key, err)
				res.fail(v.key, k.key, statusOf(err))
				continue
			}
			logf("flow: %s: %.0f jobs/s", v.key, r)
			res.add(v.key, k.key, r)
		}
	}
	if u, udb, err := flowUtilisation(ctx, env); err != nil {
		res.fail("flow.util", k.key, statusOf(err))
		res.fail("flow.utildb", k.key, statusOf(err))
		logf("flow: utilisation: %v", err)
	} else {
		res.add("flow.util", k.key, u)
		res.add("flow.utildb", k.key, udb)
		logf("flow: utilisation: handlers %.1f %%, database %.1f %%", u, udb)
	}
	if p99, err := flowFairness(ctx, env, bigKey); err != nil {
		res.fail("flow.fair", k.key, statusOf(err))
		logf("flow: fairness: %v", err)
	} else {
		res.add("flow.fair", k.key, p99)
		res.note("flow: fairness: %d jobs of one key; 10 workers (no limit) start on them, and once %d have started, 50 keys × 5 jobs are enqueued; the p99 of the 250 small jobs' waits (enqueue → start), while the workers and their prefetch buffer are busy with the big key.", bigKey, min(bigKey/10, 5000))
	}
	if n, err := flowRate(ctx, env); err != nil {
		res.fail("flow.rate", k.key, statusOf(err))
		logf("flow: rate: %v", err)
	} else {
		res.add("flow.rate", k.key, n)
	}
	res.note("flow: burn-downs of no-op jobs at backlog's defaults (Concurrency %d); each variant in a fresh schema, %d jobs, %d run(s), medians.", backlogConcurrency, jobs, env.cfg.runs)
}

// flowQueue opens a queue on a fresh schema; close drops it.
func flowQueue(ctx context.Context, env *benchEnv) (*backlog.Queue, *pgxpool.Pool, func(), error) {
	schema := env.newSchema("flow")
	var counter stmtCounter
	pool, err := env.newPool(ctx, &counter)
	if err != nil {
		return nil, nil, nil, err
	}
	q, err := backlog.New(ctx, pool, backlog.WithSchema(schema))
	if err == nil {
		err = q.Migrate(ctx)
	}
	closeAll := func() {
		if q != nil {
			_ = q.Close()
		}
		pool.Close()
		env.dropSchema(context.WithoutCancel(ctx), schema)
	}
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return q, pool, closeAll, nil
}

// flowInsert enqueues n jobs of benchType, with keys%keys concurrency keys
// when keys > 0.
func flowInsert(ctx context.Context, q *backlog.Queue, n, keys int, key func(i int) string) error {
	specs := make([]backlog.JobSpec, 0, insertChunk)
	for done := 0; done < n; done += len(specs) {
		specs = specs[:0]
		for i := done; i < n && len(specs) < insertChunk; i++ {
			s := backlog.JobSpec{Type: benchType, Args: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i))}
			if keys > 0 || key != nil {
				k := fmt.Sprintf("tenant-%04d", i%max(keys, 1))
				if key != nil {
					k = key(i)
				}
				s.Options = []backlog.EnqueueOption{backlog.ConcurrencyKey(k)}
			}
			specs = append(specs, s)
		}
		if _, err := q.EnqueueMany(ctx, specs); err != nil {
			return err
		}
	}
	return nil
}

// flowBurn burns down n no-op jobs under limit (nil: none) and returns
// jobs/s.
func flowBurn(ctx context.Context, env *benchEnv, n int, limit *backlog.Limit, keys int) (float64, error) {
	q, pool, closeAll, err := flowQueue(ctx, env)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	if limit != nil {
		if err := q.SetLimit(ctx, benchType, *limit); err != nil {
			return 0, err
		}
	}
	if err := flowInsert(ctx, q, n, keys, nil); err != nil {
		return 0, err
	}
	var done atomic.Int64
	finished := make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = q.Work(wctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error {
			if done.Add(1) == int64(n) {
				close(finished)
			}
			return nil
		}), backlog.Types(benchType))
	})
	defer func() { stop(); wg.Wait() }()
	select {
	case <-finished:
	case <-time.After(env.cfg.burnTimeout * 3):
		return 0, &timeoutError{fmt.Sprintf("%d of %d jobs in %s", done.Load(), n, env.cfg.burnTimeout*3)}
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	// Until the last outcome is written, as the burn-down workload counts.
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{q.Schema(), "jobs"}.Sanitize()).Scan(&left); err != nil {
			return 0, err
		}
		if left == 0 {
			break
		}
		pause(ctx, 2*time.Millisecond)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// flowUtilisation runs 20 ms jobs under a limit of 50 with 100 workers and
// samples how many run at once: handlers running, and rows in state
// running (a job's row is running from the claim to the written outcome;
// since migration 0028 its process's claims stop counting it once its
// handler has ended, so this exceeds 100 %).
func flowUtilisation(ctx context.Context, env *benchEnv) (handlers, database float64, err error) {
	q, pool, closeAll, err := flowQueue(ctx, env)
	if err != nil {
		return 0, 0, err
	}
	defer closeAll()
	const limit = 50
	if err := q.SetLimit(ctx, benchType, backlog.Limit{Concurrency: limit}); err != nil {
		return 0, 0, err
	}
	if err := flowInsert(ctx, q, 20_000, 0, nil); err != nil {
		return 0, 0, err
	}
	var running atomic.Int64
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = q.Work(wctx, backlog.HandlerFunc(func(ctx context.Context, _ *backlog.Job) error {
			running.Add(1)
			defer running.Add(-1)
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
			}
			return nil
		}), backlog.Types(benchType), backlog.Concurrency(100))
	})
	defer func() { stop(); wg.Wait() }()
	pause(ctx, time.Second) // ramp-up
	count := `SELECT count(*) FROM ` + pgx.Identifier{q.Schema(), "jobs"}.Sanitize() + ` WHERE state = 'running'`
	var sum, sumDB, samples float64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		<-tick.C
		sum += float64(running.Load())
		var n int
		if err := pool.QueryRow(ctx, count).Scan(&n); err != nil {
			return 0, 0, err
		}
		sumDB += float64(n)
		samples++
	}
	return 100 * sum / samples / limit, 100 * sumDB / samples / limit, ctx.Err()
}

// flowFairness enqueues big jobs of one key, then 5 jobs each of 50 small
// keys, and returns the p99 of the small jobs' waits in milliseconds.
func flowFairness(ctx context.Context, env *benchEnv, big int) (float64, error) {
	q, _, closeAll, err := flowQueue(ctx, env)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	if err := flowInsert(ctx, q, big, 0, func(int) string { return "big" }); err != nil {
		return 0, err
	}
	const small = 250
	specs := make([]backlog.JobSpec, small)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: benchType, Args: json.RawMessage(`{"small":true}`),
			Options: []backlog.EnqueueOption{backlog.ConcurrencyKey(fmt.Sprintf("small-%02d", i%50))}}
	}
	var mu sync.Mutex
	var waits []float64
	var enqueued time.Time
	var bigStarts atomic.Int64
	working := make(chan struct{}) // closed once the big key's jobs run at full speed
	all := make(chan struct{})
	warm := int64(min(big/10, 5000))
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = q.Work(wctx, backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
			if !bytes.Contains(j.Args, []byte("small")) {
				if bigStarts.Add(1) == warm {
					close(working)
				}
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			waits = append(waits, float64(time.Since(enqueued).Microseconds())/1000)
			if len(waits) == small {
				close(all)
			}
			return nil
		}), backlog.Types(benchType), backlog.Concurrency(10))
	})
	defer func() { stop(); wg.Wait() }()
	// The small keys' jobs come while the workers (and their prefetch
	// buffer) are busy with the big key's.
	select {
	case <-working:
	case <-time.After(2 * time.Minute):
		return 0, &timeoutError{"the big key's jobs did not start within 2 minutes"}
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	mu.Lock()
	enqueued = time.Now()
	mu.Unlock()
	if _, err := q.EnqueueMany(ctx, specs); err != nil {
		return 0, err
	}
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		return 0, &timeoutError{"the small keys' jobs did not all start within 2 minutes"}
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if left := int64(big) - bigStarts.Load(); left < int64(big)/2 {
		return 0, fmt.Errorf("the big key had only %d of %d jobs left when the last small one started: not a wait behind it", left, big)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(waits)
	return waits[len(waits)*99/100], nil
}

// flowRate runs jobs under a rate of 100 a second for 5 seconds from the
// first start and counts the starts.
func flowRate(ctx context.Context, env *benchEnv) (float64, error) {
	q, _, closeAll, err := flowQueue(ctx, env)
	if err != nil {
		return 0, err
	}
	defer closeAll()
	if err := q.SetLimit(ctx, benchType, backlog.Limit{Rate: 100, Per: time.Second}); err != nil {
		return 0, err
	}
	if err := flowInsert(ctx, q, 2000, 0, nil); err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var starts []time.Time
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = q.Work(wctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			return nil
		}), backlog.Types(benchType), backlog.Concurrency(20))
	})
	pause(ctx, 5500*time.Millisecond)
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(starts) == 0 {
		return 0, fmt.Errorf("no job started")
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	n := 0
	for _, s := range starts {
		if s.Sub(starts[0]) < 5*time.Second {
			n++
		}
	}
	return float64(n), ctx.Err()
}
