// Command bench compares backlog with River, graphile-worker (in a Node child
// process, when node is on PATH) and a raw-SQL floor on one PostgreSQL
// server: burn-down throughput and its per-job database cost, offered load,
// pickup latency and idle cost. It prints one markdown table
// and writes it to results/latest.md.
//
// Run it from bench/ with DATABASE_URL set, e.g.
//
//	../scripts/with-db.sh go run ./cmd/bench -quick
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(cfg *config) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return fmt.Errorf("DATABASE_URL is not set (run through ../scripts/with-db.sh)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	watchdog(cfg.totalTimeout)
	if cfg.cpuProf != "" {
		f, err := os.Create(cfg.cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	env, err := openEnv(ctx, cfg, url)
	if err != nil {
		return err
	}
	defer env.close(ctx)
	env.noise = watchNoise(ctx, url, env.dbName)
	defer env.noise.close()
	m, err := describeMachine(ctx, env)
	if err != nil {
		return err
	}

	var kinds []kind
	for _, k := range allKinds(cfg) {
		if slices.Contains(cfg.only, k.key) {
			kinds = append(kinds, k)
		}
	}
	for i := range kinds {
		k := &kinds[i]
		if k.prepare == nil {
			continue
		}
		if extra, err := k.prepare(ctx); err != nil {
			k.skip = err.Error()
			k.note = fmt.Sprintf("%s: skipped: %s.", k.label, k.skip)
			logf("%s is skipped: %s", k.label, k.skip)
		} else if extra != "" {
			k.note += " " + extra
		}
	}
	res := newResults()
	phases := map[string]func(context.Context, *benchEnv, kind, *results){
		"burndown": runBurndown, "large": runLarge, "offered": runOffered, "latency": runLatency, "idle": runIdle, "flow": runFlow,
		"history": runHistory,
	}
	for _, w := range workloadNames {
		if !slices.Contains(cfg.workloads, w) {
			continue
		}
		first := len(res.rows)
		switch w {
		case "burndown":
			defineBurndownRows(res)
		case "large":
			defineLargeRows(res, cfg.largeJobs)
		case "offered":
			defineOfferedRows(res, cfg.offeredRates)
		case "latency":
			defineLatencyRows(res, cfg.latRates)
		case "idle":
			defineIdleRows(res, env.pgss)
		case "flow":
			defineFlowRows(res)
		case "history":
			defineHistoryRows(res, cfg.historyRows)
		}
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if w == "offered" {
			// The whole ladder of every system fits in offeredCap; a system
			// whose turn comes later shows "timeout".
			wctx, cancel = context.WithTimeout(ctx, cfg.offeredCap)
		}
		for _, k := range kinds {
			if !k.workloads[w] || ctx.Err() != nil {
				continue
			}
			if k.skip != "" {
				for _, rw := range res.rows[first:] {
					res.fail(rw.key, k.key, "skipped")
				}
				continue
			}
			phases[w](wctx, env, k, res)
		}
		cancel()
		if w == "offered" {
			offeredSummary(cfg, kinds, res)
		}
	}
	if slices.Contains(cfg.workloads, "idle") && !env.pgss {
		res.note("pg_stat_statements is not available (it needs shared_preload_libraries), so idle database load is measured with pg_stat_database xact_commit (transactions) and with a client-side statement count.")
	}
	if ctx.Err() != nil {
		res.note("interrupted: the table is incomplete")
	}

	report := render(cfg, m, kinds, res)
	fmt.Print(report)
	if cfg.out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.out), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(cfg.out, []byte(report), 0o644); err != nil {
			return err
		}
		logf("report written to %s", cfg.out)
	}
	return ctx.Err()
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// boundedClose runs f, giving up waiting for it when ctx ends (a system
// that does not stop must not hang the benchmark).
func boundedClose(ctx context.Context, what string, f func()) {
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		logf("warning: %s did not close in time; leaving it behind", what)
	}
}

// watchdog ends the process with a goroutine dump if the whole run takes
// longer than limit: every phase has its own deadline, so this is only for
// bugs.
func watchdog(limit time.Duration) {
	time.AfterFunc(limit, func() {
		logf("watchdog: the run exceeded %s; goroutines follow", limit)
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		os.Exit(3)
	})
}
