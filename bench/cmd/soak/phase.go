package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backlogq/backlog"
	"github.com/jackc/pgx/v5"
)

const jobType = "soak.noop"

// latStat summarizes latencies.
type latStat struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(ds []time.Duration) latStat {
	if len(ds) == 0 {
		return latStat{}
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return latStat{n: len(ds), p50: at(0.50), p99: at(0.99), max: ds[len(ds)-1]}
}

// latencies collects durations between two samples.
type latencies struct {
	mu  sync.Mutex
	cur []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.cur = append(l.cur, d)
	l.mu.Unlock()
}

func (l *latencies) take() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.cur
	l.cur = make([]time.Duration, 0, len(out))
	return out
}

// counters are updated by the producers and the queue's hooks.
type counters struct {
	enqueued, enqueueErrs, completed, other atomic.Int64
	lagMax                                  atomic.Int64 // ns; the most a batch went out behind schedule since the last sample
	claim, start                            latencies

	mu          sync.Mutex
	firstEnqErr error
	outcomes    map[backlog.Outcome]int64 // other than completed
}

func (c *counters) noteLag(d time.Duration) {
	for {
		old := c.lagMax.Load()
		if int64(d) <= old || c.lagMax.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// dbSample is what the monitor reads from the database at a sample.
type dbSample struct {
	available, running   int64
	heap, total          int64 // jobs: pg_relation_size (main fork), pg_total_relation_size
	idx                  []int64
	history              int64 // job_history: all partitions, pg_total_relation_size
	dead, live           int64
	vacuums, autovacuums int64
	analyzes, autoanlz   int64
	otherActive          int           // statements running in other databases of the server
	longest              time.Duration // the longest-running statement of the soak queue's pool
	longestQuery         string        // its first 60 bytes
	dur                  time.Duration
	err                  string
}

func (d dbSample) indexTotal() int64 {
	var t int64
	for _, v := range d.idx {
		t += v
	}
	return t
}

// sample is one sampling interval of a phase.
type sample struct {
	mark                time.Duration // the interval's scheduled end since the phase began (k × -every)
	at, span            time.Duration // its actual end since the phase began; its length
	completed, enqueued int64
	other, enqErrs      int64
	lag                 time.Duration
	claim, start        latStat
	db                  dbSample
	oldest              *backlog.OldTransaction // the queue's Stats().OldestTransaction
	statsDur            time.Duration
	statsErr            string
	oldTxWarns          int // cumulative
	otherWarns          int // cumulative
	load1               float64
	cpuBusy             float64 // the machine's CPUs, busy share over the interval (0..1; -1 unknown)
}

func (s sample) rate() float64    { return float64(s.completed) / s.span.Seconds() }
func (s sample) enqRate() float64 { return float64(s.enqueued) / s.span.Seconds() }

// minuteLat are the latencies of one minute of a phase (exact, not merged
// from the samples').
type minuteLat struct {
	minute       int
	claim, start latStat
}

// statsCall is one call of the soak queue's own Stats.
type statsCall struct {
	at        time.Duration
	dur       time.Duration
	oldest    *backlog.OldTransaction
	completed int64
	err       error
}

// holdInfo is what became of the REPEATABLE READ transaction.
type holdInfo struct {
	pid          int
	began, ended time.Duration // since the phase began; ended 0: never
	rows         int64
	err          error
}

type phaseResult struct {
	name       string
	hold       bool
	schema     string
	started    time.Time
	planned    time.Duration
	indexNames []string
	base       dbSample
	samples    []sample
	minutes    []minuteLat
	holdInfo   holdInfo
	logs       []logEntry
	infos      map[string]int
	final      statsCall
	vacRuns    []vacuumRun
	vacErrs    []string

	enqueued, completed, enqErrs, other int64
	firstEnqErr                         string
	outcomes                            map[backlog.Outcome]int64
	drainTook                           time.Duration
	leftover                            int64
	workErr                             error
	interrupted                         bool
}

// runPhase runs one phase: a fresh schema, producers at the configured
// rate, Work at its defaults with a no-op handler, sampling, and (phase
// "hold") the REPEATABLE READ transaction.
func runPhase(ctx context.Context, e *env, cfg *config, name string, emulate *avSettings) (*phaseResult, error) {
	res := &phaseResult{name: name, hold: name == "hold", planned: cfg.duration,
		schema: fmt.Sprintf("soak_%s_%d", name, os.Getpid()), outcomes: map[backlog.Outcome]int64{}}
	defer e.dropSchema(ctx, res.schema)

	cnt := &counters{outcomes: map[backlog.Outcome]int64{}}
	capture := newLogCapture()
	logger := slog.New(capture.handler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	hooks := backlog.Hooks{
		Started: func(ctx context.Context, j *backlog.Job) context.Context {
			if t, ok := enqueuedAt(j.Args); ok {
				cnt.start.add(time.Duration(time.Now().UnixNano() - t))
			}
			return nil
		},
		Finished: func(_ context.Context, _ *backlog.Job, ev backlog.JobEvent) {
			if ev.Outcome == backlog.OutcomeCompleted {
				cnt.completed.Add(1)
				cnt.claim.add(ev.QueueLatency)
				return
			}
			cnt.other.Add(1)
			cnt.mu.Lock()
			cnt.outcomes[ev.Outcome]++
			cnt.mu.Unlock()
		},
	}

	pool, err := e.newPool(ctx, "backlog-soak", cfg.pool)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	q, err := backlog.New(ctx, pool, backlog.WithSchema(res.schema), backlog.WithLogger(logger), backlog.WithHooks(hooks))
	if err != nil {
		return nil, err
	}
	defer q.Close()
	if err := q.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	mon, err := e.connect(ctx, "backlog-soak-monitor")
	if err != nil {
		return nil, err
	}
	defer mon.Close(context.WithoutCancel(ctx))
	jobsT := pgx.Identifier{res.schema, "jobs"}.Sanitize()
	var idxOIDs []uint32
	rows, err := mon.Query(ctx, `SELECT c.relname, i.indexrelid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass ORDER BY 1`, jobsT)
	if err == nil {
		err = forRows(rows, func(r pgx.Rows) error {
			var n string
			var o uint32
			if err := r.Scan(&n, &o); err != nil {
				return err
			}
			res.indexNames = append(res.indexNames, n)
			idxOIDs = append(idxOIDs, o)
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("listing the indexes of jobs: %w", err)
	}
	read := func(ctx context.Context) dbSample { return readDB(ctx, mon, res.schema, idxOIDs) }
	res.base = read(ctx)

	// Go.
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	workDone := make(chan error, 1)
	// A no-op handler for the one job type, on a Mux as the README's
	// quickstart does (Work needs to know its types).
	h := backlog.NewMux()
	h.Handle(jobType, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }))
	res.started = time.Now()
	start := res.started
	go func() { workDone <- q.Work(workCtx, h) }()

	var prodWG sync.WaitGroup
	defer prodWG.Wait()
	prodCtx, stopProducers := context.WithDeadline(ctx, start.Add(cfg.duration))
	defer stopProducers()
	startProducers(ctx, prodCtx, &prodWG, cfg, q, cnt, start)

	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(ctx)
	defer func() { stopBG(); bg.Wait() }()
	var vac *vacuumer
	if emulate != nil {
		vac = &vacuumer{env: e, schema: res.schema, s: emulate, nap: cmp.Or(cfg.naptime, emulate.naptime)}
		bg.Go(func() { vac.run(bgCtx) })
	}
	var holdMu sync.Mutex
	if res.hold {
		bg.Go(func() {
			hi := holdTx(bgCtx, e, jobsT, start, cfg.holdAt, cfg.holdFor, func(hi holdInfo) {
				holdMu.Lock()
				res.holdInfo = hi
				holdMu.Unlock()
			})
			holdMu.Lock()
			res.holdInfo = hi
			holdMu.Unlock()
		})
	}

	// Sample.
	var minuteClaim, minuteStart []time.Duration
	prev, cpuPrev := start, readCPU()
	var prevEnq, prevDone, prevOther, prevErrs int64
	logf("%s: %s at %.0f jobs/s (%d producers × EnqueueMany of %d), Work at its defaults, sampling every %s", name, cfg.duration, cfg.rate, cfg.producers, cfg.batch, cfg.every)
	for k := 1; ; k++ {
		at := start.Add(time.Duration(k) * cfg.every)
		if at.After(start.Add(cfg.duration)) {
			break
		}
		if !sleepUntil(ctx, at) {
			res.interrupted = true
			break
		}
		select {
		case err := <-workDone:
			return nil, fmt.Errorf("the Work call returned after %s: %v", fmtOffset(time.Since(start)), err)
		default:
		}
		now := time.Now()
		s := sample{mark: time.Duration(k) * cfg.every, at: now.Sub(start), span: now.Sub(prev)}
		prev = now
		enq, done, oth, errs := cnt.enqueued.Load(), cnt.completed.Load(), cnt.other.Load(), cnt.enqueueErrs.Load()
		s.enqueued, s.completed, s.other, s.enqErrs = enq-prevEnq, done-prevDone, oth-prevOther, errs-prevErrs
		prevEnq, prevDone, prevOther, prevErrs = enq, done, oth, errs
		s.lag = time.Duration(cnt.lagMax.Swap(0))
		claim, started := cnt.claim.take(), cnt.start.take()
		minuteClaim, minuteStart = append(minuteClaim, claim...), append(minuteStart, started...)
		s.claim, s.start = summarize(claim), summarize(started)
		s.db = read(ctx)
		// The queue's own Stats, as an operator's dashboard would call it
		// (live counts from jobs, finished ones from its counters).
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, cfg.every)
		st, err := q.Stats(sctx)
		cancel()
		s.statsDur = time.Since(t0)
		if err != nil {
			s.statsErr = err.Error()
		} else {
			s.oldest = st.OldestTransaction
		}
		s.oldTxWarns, s.otherWarns = capture.counts()
		s.load1 = load1()
		cpuNow := readCPU()
		s.cpuBusy = cpuNow.busySince(cpuPrev)
		cpuPrev = cpuNow
		res.samples = append(res.samples, s)
		if s.mark%time.Minute == 0 {
			res.minutes = append(res.minutes, minuteLat{minute: int(s.mark / time.Minute), claim: summarize(minuteClaim), start: summarize(minuteStart)})
			minuteClaim, minuteStart = minuteClaim[:0], minuteStart[:0]
		}
		if k%6 == 0 || k == 1 {
			logf("%s %s: %.0f completed/s, %.0f enqueued/s, %d available, jobs %s + indexes %s, dead rows %d, claim p99 %s, oldest xact %s",
				name, fmtOffset(s.mark), s.rate(), s.enqRate(), s.db.available, fmtMB(s.db.heap), fmtMB(s.db.indexTotal()), s.db.dead, fmtMS(s.claim.p99), oldestText(s.oldest))
		}
	}
	if len(res.samples) > 0 && (len(minuteClaim) > 0 || len(minuteStart) > 0) {
		last := res.samples[len(res.samples)-1].mark
		res.minutes = append(res.minutes, minuteLat{minute: int(last/time.Minute) + 1, claim: summarize(minuteClaim), start: summarize(minuteStart)})
	}

	// Stop: producers first, then let the workers run what is left.
	stopProducers()
	prodWG.Wait()
	stopBG()
	bg.Wait()
	drainStart := time.Now()
	for cnt.completed.Load()+cnt.other.Load() < cnt.enqueued.Load() && time.Since(drainStart) < cfg.drain && ctx.Err() == nil {
		sleepUntil(ctx, time.Now().Add(100*time.Millisecond))
	}
	res.drainTook = time.Since(drainStart)
	stopWork()
	select {
	case err := <-workDone:
		if err != nil && !errors.Is(err, context.Canceled) {
			res.workErr = err
		}
	case <-time.After(time.Minute):
		res.workErr = fmt.Errorf("the Work call did not return within a minute of its context ending")
	}
	res.enqueued, res.completed, res.enqErrs, res.other = cnt.enqueued.Load(), cnt.completed.Load(), cnt.enqueueErrs.Load(), cnt.other.Load()
	res.leftover = res.enqueued - res.completed - res.other
	cnt.mu.Lock()
	if cnt.firstEnqErr != nil {
		res.firstEnqErr = cnt.firstEnqErr.Error()
	}
	for k, v := range cnt.outcomes {
		res.outcomes[k] = v
	}
	cnt.mu.Unlock()
	if ctx.Err() == nil {
		res.final = ownStats(ctx, q, start)
	} else {
		res.interrupted = true
	}
	res.logs, res.infos = capture.snapshot()
	if vac != nil {
		res.vacRuns, res.vacErrs = vac.snapshot()
	}
	return res, nil
}

// ownStats calls the soak queue's Stats and keeps what the report needs.
func ownStats(ctx context.Context, q *backlog.Queue, start time.Time) statsCall {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	st, err := q.Stats(ctx)
	c := statsCall{at: t0.Sub(start), dur: time.Since(t0), err: err}
	if err == nil {
		c.oldest = st.OldestTransaction
		c.completed = st.ByState[backlog.StateCompleted]
	}
	return c
}

// startProducers starts the producers: they share one schedule (batch k is
// due at start + k × batch/rate) and each takes the next batch when its
// last call returned, so a slow call delays only its own batch; a batch
// that goes out late still goes out (the average rate holds while the
// producers can catch up). No batch is due once sched ends; a call already
// made runs under ctx, so that a batch that commits is counted.
func startProducers(ctx, sched context.Context, wg *sync.WaitGroup, cfg *config, q *backlog.Queue, cnt *counters, start time.Time) {
	var next atomic.Int64
	iv := cfg.interval()
	for range cfg.producers {
		wg.Go(func() {
			specs := make([]backlog.JobSpec, cfg.batch)
			for {
				k := next.Add(1) - 1
				due := start.Add(time.Duration(k) * iv)
				if !sleepUntil(sched, due) {
					return
				}
				if late := time.Since(due); late > 0 {
					cnt.noteLag(late)
				}
				args := json.RawMessage(`{"t":` + strconv.FormatInt(time.Now().UnixNano(), 10) + `}`)
				for i := range specs {
					specs[i] = backlog.JobSpec{Type: jobType, Args: args}
				}
				if _, err := q.EnqueueMany(ctx, specs); err != nil {
					if ctx.Err() != nil {
						return
					}
					cnt.enqueueErrs.Add(int64(len(specs)))
					cnt.mu.Lock()
					if cnt.firstEnqErr == nil {
						cnt.firstEnqErr = err
					}
					cnt.mu.Unlock()
					continue
				}
				cnt.enqueued.Add(int64(len(specs)))
			}
		})
	}
}

// enqueuedAt reads the producer's clock reading from a job's args
// ({"t": unix nanoseconds}, as jsonb prints it).
func enqueuedAt(args []byte) (int64, bool) {
	i := 0
	for i < len(args) && (args[i] < '0' || args[i] > '9') {
		i++
	}
	j := i
	for j < len(args) && args[j] >= '0' && args[j] <= '9' {
		j++
	}
	t, err := strconv.ParseInt(string(args[i:j]), 10, 64)
	return t, err == nil
}

// holdTx opens the REPEATABLE READ transaction at start+at, runs one query
// in it (which takes its snapshot), keeps it open until start+at+length and
// commits. began reports the transaction once its snapshot is taken.
func holdTx(ctx context.Context, e *env, jobsT string, start time.Time, at, length time.Duration, began func(holdInfo)) holdInfo {
	var hi holdInfo
	if !sleepUntil(ctx, start.Add(at)) {
		return hi
	}
	conn, err := e.connect(ctx, "backlog-soak-hold")
	if err != nil {
		hi.err = err
		return hi
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&hi.pid); err != nil {
		hi.err = err
		return hi
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		hi.err = err
		return hi
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+jobsT).Scan(&hi.rows); err != nil {
		hi.err = err
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return hi
	}
	hi.began = time.Since(start)
	began(hi)
	logf("hold: REPEATABLE READ transaction open (pid %d, its query saw %d live jobs); it stays open for %s", hi.pid, hi.rows, length)
	sleepUntil(ctx, start.Add(at+length))
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		hi.err = err
	}
	hi.ended = time.Since(start)
	logf("hold: transaction ended at %s", fmtOffset(hi.ended))
	return hi
}

// readDB reads the queue depth, the sizes of jobs and its indexes, and
// jobs' row statistics. The depth (a count over jobs, slow while jobs is
// bloated) is a statement of its own: the sizes lock every job_history
// partition (ACCESS SHARE, until the statement ends), and the queue's
// partition maintenance tries its locks for 5 ms only.
func readDB(ctx context.Context, conn *pgx.Conn, schema string, idx []uint32) dbSample {
	var d dbSample
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	hist := pgx.Identifier{schema, "job_history"}.Sanitize()
	t0 := time.Now()
	var longestMS int64
	err := conn.QueryRow(ctx, `SELECT
		pg_relation_size($1::regclass), pg_total_relation_size($1::regclass),
		(SELECT COALESCE(array_agg(pg_relation_size(i::regclass) ORDER BY o), '{}') FROM unnest($3::oid[]) WITH ORDINALITY AS t(i, o)),
		(SELECT COALESCE(sum(pg_total_relation_size(relid)), 0)::bigint FROM pg_partition_tree($2::regclass)),
		st.n_dead_tup, st.n_live_tup, st.vacuum_count, st.autovacuum_count, st.analyze_count, st.autoanalyze_count,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND state = 'active'
			AND datname IS DISTINCT FROM current_database()),
		COALESCE(a.ms, 0), COALESCE(a.query, '')
		FROM pg_stat_user_tables st
		LEFT JOIN LATERAL (SELECT (extract(epoch FROM clock_timestamp() - query_start) * 1000)::bigint AS ms, left(query, 60) AS query
			FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'backlog-soak' AND state = 'active'
			ORDER BY query_start LIMIT 1) a ON true
		WHERE st.relid = $1::regclass`, jobs, hist, idx).Scan(
		&d.heap, &d.total, &d.idx, &d.history,
		&d.dead, &d.live, &d.vacuums, &d.autovacuums, &d.analyzes, &d.autoanlz, &d.otherActive, &longestMS, &d.longestQuery)
	if err == nil {
		// Each count can read the partial index of its state.
		err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+jobs+` WHERE state = 'available'),
			(SELECT count(*) FROM `+jobs+` WHERE state = 'running')`).Scan(&d.available, &d.running)
	}
	d.longest = time.Duration(longestMS) * time.Millisecond
	d.dur = time.Since(t0)
	if err != nil {
		d.err = err.Error()
	}
	return d
}

func forRows(rows pgx.Rows, f func(pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// cpuTimes is the first line of /proc/stat: the machine's CPU time, all
// CPUs together, in ticks.
type cpuTimes struct{ busy, total uint64 }

func readCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var c cpuTimes
	for i, v := range f[1:] {
		if i >= 8 { // guest time is already in user and nice
			break
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		c.total += n
		if i != 3 && i != 4 { // idle, iowait
			c.busy += n
		}
	}
	return c
}

// busySince is the busy share of the CPUs since an earlier reading; -1
// when unknown.
func (c cpuTimes) busySince(prev cpuTimes) float64 {
	if c.total <= prev.total || prev.total == 0 {
		return -1
	}
	return float64(c.busy-prev.busy) / float64(c.total-prev.total)
}

// load1 is the machine's one-minute load average.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return -1
	}
	return l
}
