package main

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config holds every knob of a run; quick and full differ only here.
type config struct {
	quick     bool
	runs      int
	only      []string
	workloads []string
	out       string
	newDB     bool
	sqlStats  bool
	cpuProf   string
	analyze   bool

	poolConns int32

	burnJobs    int
	burnTimeout time.Duration

	largeJobs    int
	largeTimeout time.Duration

	historyRows   int
	historyVacuum bool

	offeredRates  []int
	offeredWarmup time.Duration
	offeredDur    time.Duration
	offeredDrain  time.Duration
	offeredCap    time.Duration
	producers     int

	latRates  []int
	latDurs   map[int]time.Duration
	latSettle time.Duration

	idleDur     time.Duration
	idleWarmup  time.Duration
	idleDomains int
	idleWorkers int

	floorConns int
	floorBatch int

	setupTimeout time.Duration
	stopTimeout  time.Duration
	totalTimeout time.Duration
}

var workloadNames = []string{"burndown", "large", "offered", "latency", "idle", "flow", "history"}

// optInWorkloads run only when -workloads names them.
var optInWorkloads = []string{"history"}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "the under-a-minute-or-two variant: fewer jobs, shorter phases, one run each, no 10/s latency rate")
	only := fs.String("only", "", "systems to run (comma-separated): backlog, backlog-discard, river, river-tuned, floor, graphile (default all, or backlog,river-tuned,floor,graphile with -quick)")
	wls := fs.String("workloads", "", "workloads to run (comma-separated): burndown, large (the burn-down of -large-jobs jobs), offered, latency, idle, flow (backlog only), history (backlog only, opt-in: an empty job_history against one of -history-rows rows) (default all but history, or all but large and history with -quick)")
	largeJobs := fs.Int("large-jobs", 1_000_000, "jobs of the large burn-down")
	historyRows := fs.Int("history-rows", 10_000_000, "finished jobs filled into job_history for the history workload")
	historyVacuum := fs.Bool("history-vacuum", true, "VACUUM job_history after filling it, as autovacuum does an insert-only table (false: ANALYZE and BRIN summaries only)")
	runs := fs.Int("runs", 0, "runs per system of every workload (flow: its burn-downs), reported as medians with their range (default 3, or 1 with -quick)")
	jobs := fs.Int("jobs", 0, "burn-down jobs (default 200000, or 20000 with -quick)")
	out := fs.String("out", "results/latest.md", "also write the report to this file (empty: stdout only)")
	pool := fs.Int("pool", 16, "MaxConns of each system's pgxpool")
	newDB := fs.Bool("newdb", true, "run in a dedicated database created for the run (so transaction counts are the benchmark's alone)")
	cpuProf := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	sqlStats := fs.Bool("sqlstats", false, "log each system's statements by text for every measured window (stderr)")
	analyze := fs.Bool("analyze", true, "ANALYZE the job table after the burn-down's bulk insert (planner statistics, as a long-lived table has them)")
	rates := fs.String("rates", "", "offered-load rates in jobs/s (comma-separated, ascending; default 5000,10000,20000,25000,30000,40000, or 5000,10000,20000 with -quick)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c := &config{quick: *quick, out: *out, newDB: *newDB, sqlStats: *sqlStats, cpuProf: *cpuProf, analyze: *analyze, poolConns: int32(*pool),
		producers: 4, idleDomains: 20, idleWorkers: 10, floorConns: 2, floorBatch: 1000,
		setupTimeout: 2 * time.Minute, stopTimeout: 20 * time.Second, latSettle: time.Second,
		idleWarmup: 11 * time.Second}
	systems := "backlog,backlog-discard,river,river-tuned,floor,graphile"
	if c.quick {
		// A few minutes: the comparison the targets name (backlog at its
		// defaults, River with its benchmark's settings, the floor,
		// graphile-worker with its high-throughput settings), smaller and
		// shorter. Idle transaction counts need the full
		// run's 11 s warm-up to be exact; -quick reports them after 2 s.
		systems = "backlog,river-tuned,floor,graphile"
		c.runs, c.burnJobs, c.burnTimeout = 1, 10_000, 20*time.Second
		c.idleDur, c.idleWarmup = 4*time.Second, 2*time.Second
		c.offeredRates = []int{5000, 10000, 20000}
		c.offeredWarmup, c.offeredDur, c.offeredDrain, c.offeredCap = time.Second, 4*time.Second, 5*time.Second, 2*time.Minute
		c.latRates = []int{100, 1000}
		c.latDurs = map[int]time.Duration{100: 2 * time.Second, 1000: 2 * time.Second}
		c.totalTimeout = 5 * time.Minute
		c.largeTimeout = time.Minute
	} else {
		c.runs, c.burnJobs, c.burnTimeout = 3, 200_000, 60*time.Second
		c.idleDur = 30 * time.Second
		c.offeredRates = []int{5000, 10000, 20000, 25000, 30000, 40000}
		c.offeredWarmup, c.offeredDur, c.offeredDrain, c.offeredCap = 2*time.Second, 10*time.Second, 10*time.Second, 10*time.Minute
		c.latRates = []int{10, 100, 1000}
		c.latDurs = map[int]time.Duration{10: 10 * time.Second, 100: 5 * time.Second, 1000: 5 * time.Second}
		c.totalTimeout = 70 * time.Minute
		c.largeTimeout = 5 * time.Minute
	}
	c.largeJobs = *largeJobs
	if c.largeJobs < 1 {
		return nil, fmt.Errorf("-large-jobs must be positive")
	}
	c.historyRows, c.historyVacuum = *historyRows, *historyVacuum
	if c.historyRows < 1 {
		return nil, fmt.Errorf("-history-rows must be positive")
	}
	if *runs > 0 {
		c.runs = *runs
	}
	if *jobs > 0 {
		c.burnJobs = *jobs
	}
	if *pool < 1 {
		return nil, fmt.Errorf("-pool must be at least 1")
	}
	var err error
	if *rates != "" {
		if c.offeredRates, err = parseRates(*rates); err != nil {
			return nil, fmt.Errorf("-rates: %w", err)
		}
	}
	if *only != "" {
		systems = *only
	}
	if c.only, err = parseList(systems, []string{"backlog", "backlog-discard", "river", "river-tuned", "floor", "graphile"}); err != nil {
		return nil, fmt.Errorf("-only: %w", err)
	}
	if *wls == "" {
		*wls = strings.Join(slices.DeleteFunc(slices.Clone(workloadNames), func(w string) bool {
			return slices.Contains(optInWorkloads, w) || c.quick && w == "large"
		}), ",")
	}
	if c.workloads, err = parseList(*wls, workloadNames); err != nil {
		return nil, fmt.Errorf("-workloads: %w", err)
	}
	return c, nil
}

func parseList(s string, known []string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("unknown name %q (known: %s)", f, strings.Join(known, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

// parseRates parses an ascending list of positive rates.
func parseRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		r, err := strconv.Atoi(f)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("%q is not a positive whole number of jobs/s", f)
		}
		if len(out) > 0 && r <= out[len(out)-1] {
			return nil, fmt.Errorf("rates must be ascending (%d after %d)", r, out[len(out)-1])
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

func (c *config) latDur(rate int) time.Duration { return c.latDurs[rate] }

func (c *config) modeName() string {
	if c.quick {
		return "quick"
	}
	return "full"
}

func (c *config) runsText() string {
	if c.runs == 1 {
		return "one run"
	}
	return fmt.Sprintf("median of %d runs, range in parentheses", c.runs)
}

// describe explains how each row was measured.
func (c *config) describe() []string {
	var d []string
	has := func(w string) bool { return slices.Contains(c.workloads, w) }
	if has("burndown") {
		analyzeText := "each job table ANALYZEd (planner statistics, as a long-lived table has them; -analyze=false skips it), "
		if !c.analyze {
			analyzeText = "the job table not ANALYZEd (-analyze=false: the fetch queries are planned without statistics), "
		}
		d = append(d,
			fmt.Sprintf("burn-down: %s jobs inserted first with each system's bulk insert (backlog EnqueueMany, River InsertManyFast, graphile-worker add_jobs; %d per call), %sthen timed from starting the workers until no job is available or running (polled every 10 ms on a separate connection); %s; timeout %s.",
				fmtInt(float64(c.burnJobs)), insertChunk, analyzeText, c.runsText(), c.burnTimeout),
			"per job (during the burn-down): WAL = pg_current_wal_lsn() delta (server-wide: other databases' writes would be included); transactions = xact_commit + xact_rollback delta of the benchmark database in pg_stat_database, read after every connection of the phase exited, minus the harness's own; statements = statements the system's pool sent (pgx tracer; graphile-worker: plus the query calls its Node process counts); PostgreSQL CPU = utime+stime (schedstat) of the backends of the benchmark database plus the postmaster and background processes (walwriter, checkpointer, …), from /proc; client CPU = getrusage of this process (the system's client library plus the harness's 10 ms poll; graphile-worker: plus its Node process, utime+stime from /proc/<pid>/stat).")
	}
	if has("offered") {
		d = append(d, offeredDescription(c))
	}
	if has("latency") {
		var rs []string
		for _, r := range c.latRates {
			rs = append(rs, fmt.Sprintf("%d/s for %s", r, c.latDur(r)))
		}
		d = append(d, fmt.Sprintf("pickup latency: single inserts on a fixed schedule (%s; %d producer goroutines share the schedule) while the workers are otherwise idle; latency = handler start − the moment the insert call returned (after its commit), both on this process's monotonic clock (graphile-worker: the handler start is the Node process's wall-clock reading, placed on this clock through the wall clock; checked at start-up to fall between sending a request for it and reading the reply); percentiles over all jobs of a run; %s.",
			strings.Join(rs, ", "), latProducers, c.runsText()))
	}
	if has("idle") {
		d = append(d, fmt.Sprintf("idle: %d domains × %d workers (backlog: %d Work calls, each Concurrency(%d) with its own job type; River: %d queues with MaxWorkers %d, each config keeping its fetch settings; graphile-worker: %d runners in its one Node process, each with concurrentJobs %d, a task identifier, local queue and LISTEN connection of its own, sharing one pg.Pool — a runner's concurrency is shared by all its tasks, so separate runners are what gives each domain its own workers), no jobs; measured over %s after %s of warm-up (longer than the 10 s for which an idle backend may hold back its statistics, so startup work stays out of the window); %s. pg_stat_database counts transactions, not statements (a first execution in pgx's describe modes adds one), and lags by up to 10 s, so it is approximate; the client-side statement count is exact.",
			c.idleDomains, c.idleWorkers, c.idleDomains, c.idleWorkers, c.idleDomains, c.idleWorkers, c.idleDomains, c.idleWorkers, c.idleDur, c.idleWarmup, c.runsText()))
	}
	return d
}
