// Command scale measures backlog with many worker processes on one
// database: for each count of processes (1, 2, 4, 8, 16, 32 by default)
// it starts that many worker OS processes (this command re-executed, each
// with its own pgxpool and a Queue and Work call with default settings),
// then measures, in a fresh schema:
//
//   - idle: statements per second per process (client-side count of each
//     process's pool) and PostgreSQL CPU per second, over -idle with no
//     job;
//   - burn-down: -jobs jobs inserted while their type is paused, then
//     resumed: jobs/s until none is left, PostgreSQL CPU per job and the
//     workers' statements per job (claims and outcomes);
//   - fixed load: -rate jobs/s offered for -load (EnqueueMany every 10
//     ms): jobs/s completed, PostgreSQL CPU per job, and the wait from due
//     to start (p50, p99, from job_history);
//   - connections the workers hold (pg_stat_activity, by the workers'
//     application_name): idle, and the most seen under fixed load.
//
// Each cell is the median of -runs runs. PostgreSQL CPU is read from /proc
// (bench/internal/pgcpu, as cmd/bench does), so it needs the server on
// this machine; else it is left out.
//
//	cd bench && ../scripts/with-db.sh go run ./cmd/scale [-procs 1,2,4] [-runs 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The job types: burn-down and fixed load, so that each phase's jobs are
// told apart in job_history.
const (
	burnType = "scale_burn"
	loadType = "scale_load"
)

type config struct {
	procs    []int
	runs     int
	jobs     int
	rate     int
	load     time.Duration
	idle     time.Duration
	settle   time.Duration
	out      string
	dbURL    string
	cmdline  string
	deadline time.Duration
	limit    int
}

func main() {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	var cfg config
	var procs string
	flag.StringVar(&procs, "procs", "1,2,4,8,16,32", "worker process counts, comma-separated")
	flag.IntVar(&cfg.runs, "runs", 3, "runs per process count (each cell is their median)")
	flag.IntVar(&cfg.jobs, "jobs", 20000, "burn-down: jobs")
	flag.IntVar(&cfg.rate, "rate", 1000, "fixed load: jobs offered per second")
	flag.DurationVar(&cfg.load, "load", 10*time.Second, "fixed load: how long")
	flag.DurationVar(&cfg.idle, "idle", 20*time.Second, "idle window")
	flag.DurationVar(&cfg.settle, "settle", 3*time.Second, "pause after the processes start, before the idle window")
	flag.StringVar(&cfg.out, "out", "results/scale.md", "markdown report (also printed)")
	flag.IntVar(&cfg.limit, "limit", 0, "a concurrency limit this high on both job types, so that claims take the flow-control path (0: none, the default)")
	flag.DurationVar(&cfg.deadline, "burn-timeout", 5*time.Minute, "give up a burn-down after this long")
	flag.Parse()
	for _, f := range strings.Split(procs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "scale: -procs: %q is not a positive number\n", f)
			os.Exit(2)
		}
		cfg.procs = append(cfg.procs, n)
	}
	if cfg.runs < 1 || cfg.jobs < 1 || cfg.rate < 100 || cfg.load <= 0 || cfg.idle <= 0 {
		fmt.Fprintln(os.Stderr, "scale: -runs, -jobs, -load and -idle must be positive, -rate at least 100")
		os.Exit(2)
	}
	cfg.dbURL = os.Getenv("DATABASE_URL")
	if cfg.dbURL == "" {
		fmt.Fprintln(os.Stderr, "scale: set DATABASE_URL (or run under scripts/with-db.sh)")
		os.Exit(2)
	}
	cfg.cmdline = "go run ./cmd/scale " + strings.Join(os.Args[1:], " ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rows := map[int][]result{}
	for run := range cfg.runs {
		for _, n := range cfg.procs {
			if ctx.Err() != nil {
				break
			}
			logf("%d process(es), run %d/%d", n, run+1, cfg.runs)
			r, err := measure(ctx, &cfg, n)
			if err != nil {
				fmt.Fprintf(os.Stderr, "scale: %d process(es): %v\n", n, err)
				os.Exit(1)
			}
			logf("  %s", r)
			rows[n] = append(rows[n], r)
		}
	}
	report := render(&cfg, rows)
	fmt.Print(report)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(report), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
		}
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

// median of a run's field.
func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func render(cfg *config, rows map[int][]result) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Produced by `cd bench && ../scripts/with-db.sh %s` on %s, %s, %d CPUs (shared with other work: read the numbers as trends), %s. Medians of %d runs.\n\n",
		cfg.cmdline, host, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), cfg.runs)
	b.WriteString("| worker processes | burn-down jobs/s | PG CPU µs/job (burn-down) | worker statements/job (burn-down) | fixed load: jobs/s done (offered " + strconv.Itoa(cfg.rate) +
		") | PG CPU µs/job (fixed load) | wait p50 / p99 ms (fixed load) | connections held idle (per process) | connections held under load, most seen (per process) | idle statements/s per process | idle PG CPU ms/s |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range cfg.procs {
		rs := rows[n]
		if len(rs) == 0 {
			continue
		}
		m := func(f func(result) float64) float64 { return median(rs, f) }
		idleConns, loadConns := m(func(r result) float64 { return float64(r.idleConns) }), m(func(r result) float64 { return float64(r.loadConns) })
		fmt.Fprintf(&b, "| %d | %.0f | %s | %.2f | %.0f | %s | %.1f / %.1f | %.0f (%.1f) | %.0f (%.1f) | %.2f | %s |\n", n,
			m(func(r result) float64 { return r.burnRate }), cpuCell(rs, func(r result) float64 { return r.burnCPU }),
			m(func(r result) float64 { return r.burnStmts }),
			m(func(r result) float64 { return r.loadRate }), cpuCell(rs, func(r result) float64 { return r.loadCPU }),
			m(func(r result) float64 { return r.waitP50 }), m(func(r result) float64 { return r.waitP99 }),
			idleConns, idleConns/float64(n), loadConns, loadConns/float64(n),
			m(func(r result) float64 { return r.idleStmts }), cpuCell(rs, func(r result) float64 { return r.idleCPU }))
	}
	return b.String()
}

func cpuCell(rs []result, f func(result) float64) string {
	for _, r := range rs {
		if !r.cpuKnown {
			return "—"
		}
	}
	v := median(rs, f)
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
