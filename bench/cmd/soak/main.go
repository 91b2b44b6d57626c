// Command soak runs backlog at a fixed enqueue rate for a long time and
// checks that it stays flat: throughput, the size of the jobs table and its
// indexes, and (phase "hold") what a REPEATABLE READ transaction held open
// in the middle does to it, and whether the queue warns about it (its log
// and Stats). It prints a markdown report and writes it to
// results/soak.md, with the 10-s samples of each phase as CSV next to it.
//
// Run it from bench/ with DATABASE_URL set, e.g.
//
//	../scripts/with-db.sh go run ./cmd/soak -quick
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// runInfo describes the run for the report.
type runInfo struct {
	started          time.Time
	loadStart        string
	loadEnd          string
	goVer            string
	cpus             int
	backlog          string
	version          string
	settings         [][2]string
	dbName           string
	ownDB            bool
	notes            []string
	vacuumMode       string // emulate, server, server-already-on, none
	vacuumText       string
	av               *avSettings
	serverAV         *serverAV
	interruptedPhase string
}

var settingNames = []string{"autovacuum", "shared_buffers", "synchronous_commit", "fsync", "full_page_writes",
	"max_wal_size", "checkpoint_timeout", "max_connections", "idle_in_transaction_session_timeout"}

func run(cfg *config) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return fmt.Errorf("DATABASE_URL is not set (run through ../scripts/with-db.sh)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	info := &runInfo{started: time.Now(), loadStart: loadavg(), goVer: runtime.Version(), cpus: runtime.NumCPU(), backlog: backlogRevision()}

	e, err := openEnv(ctx, cfg, url)
	if err != nil {
		return err
	}
	defer e.close(ctx)
	info.dbName, info.ownDB, info.notes = e.dbName, e.ownDB, e.notes

	conn, err := e.connect(ctx, "backlog-soak-admin")
	if err != nil {
		return err
	}
	_ = conn.QueryRow(ctx, "SELECT version()").Scan(&info.version)
	set := settings(ctx, conn, settingNames...)
	for _, n := range settingNames {
		info.settings = append(info.settings, [2]string{n, set[n]})
	}
	av, err := readAVSettings(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("reading the autovacuum settings: %w", err)
	}
	info.av = av

	// Vacuum: see vacuum.go.
	var emulate *avSettings
	mode := cfg.vacuum
	if mode == "auto" {
		mode = "emulate"
		if av.autovacuumOn {
			mode = "server"
		}
	}
	switch mode {
	case "emulate":
		emulate = av
		info.vacuumMode = "emulate"
		if av.autovacuumOn {
			info.notes = append(info.notes, "the server's autovacuum is on as well: both it and the emulation vacuumed")
		}
		if !av.trackCountsOn {
			info.notes = append(info.notes, "track_counts is off: the row statistics the emulation reads stay zero, so it never vacuums")
		}
	case "server":
		sav, err := enableServerAV(ctx, url)
		if err != nil {
			return fmt.Errorf("-autovacuum server: %w", err)
		}
		info.serverAV = sav
		if sav == nil {
			info.vacuumMode = "server-already-on"
		} else {
			info.vacuumMode = "server"
			defer sav.restore(ctx)
		}
	case "none":
		info.vacuumMode = "none"
	}
	info.vacuumText = describeVacuum(info, cfg)
	logf("vacuum: %s", info.vacuumText)
	limit := time.Duration(len(cfg.phases)) * (cfg.duration + cfg.drain + 10*time.Minute)
	watchdog(limit, info.serverAV)

	var results []*phaseResult
	for _, name := range cfg.phases {
		if ctx.Err() != nil {
			break
		}
		res, err := runPhase(ctx, e, cfg, name, emulate)
		if err != nil {
			logf("%s: %v", name, err)
			info.notes = append(info.notes, fmt.Sprintf("phase %s failed: %v", name, err))
			continue
		}
		results = append(results, res)
		if res.interrupted {
			info.interruptedPhase = name
		}
	}
	info.serverAV.restore(ctx) // before the report, which says how it went
	info.vacuumText = describeVacuum(info, cfg)
	info.loadEnd = loadavg()

	report := render(cfg, info, results)
	fmt.Print(report)
	if cfg.out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.out), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(cfg.out, []byte(report), 0o644); err != nil {
			return err
		}
		logf("report written to %s", cfg.out)
		for _, r := range results {
			p := strings.TrimSuffix(cfg.out, filepath.Ext(cfg.out)) + "-" + r.name + ".csv"
			if err := os.WriteFile(p, []byte(samplesCSV(r)), 0o644); err != nil {
				return err
			}
			logf("samples written to %s", p)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: the report is incomplete")
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s soak: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// watchdog ends the process with a goroutine dump if the run takes longer
// than limit (every wait has its own bound, so this is only for bugs),
// restoring autovacuum first.
func watchdog(limit time.Duration, sav *serverAV) {
	time.AfterFunc(limit, func() {
		logf("watchdog: the run exceeded %s; goroutines follow", limit)
		sav.restore(context.Background())
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		os.Exit(3)
	})
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// backlogRevision names the library's working tree (bench/ sits inside it).
func backlogRevision() string {
	out, err := exec.Command("git", "-C", "..", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "(working tree ../, git revision unknown)"
	}
	return "working tree ../ at " + strings.TrimSpace(string(out))
}
