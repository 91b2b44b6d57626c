package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// machine describes where the numbers come from.
type machine struct {
	cpus     int
	goVer    string
	river    string
	backlog  string
	load     string
	version  string
	settings [][2]string
	env      *benchEnv
	started  time.Time
}

var settingNames = []string{"shared_buffers", "synchronous_commit", "fsync", "max_connections", "wal_level",
	"full_page_writes", "max_wal_size", "checkpoint_timeout", "autovacuum"}

func describeMachine(ctx context.Context, env *benchEnv) (*machine, error) {
	m := &machine{cpus: runtime.NumCPU(), goVer: runtime.Version(), env: env, started: time.Now(),
		river: moduleVersion("github.com/riverqueue/river"), backlog: backlogRevision()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	conn, err := env.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&m.version); err != nil {
		return nil, err
	}
	for _, name := range settingNames {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			v = "?"
		}
		m.settings = append(m.settings, [2]string{name, v})
	}
	return m, nil
}

func (m *machine) write(b *strings.Builder) {
	fmt.Fprintf(b, "- Run at %s; Go %s, %d CPUs (runtime.NumCPU); load average at start %s\n",
		m.started.Format(time.RFC3339), m.goVer, m.cpus, m.load)
	fmt.Fprintf(b, "- Server: %s\n", m.version)
	var s []string
	for _, kv := range m.settings {
		s = append(s, kv[0]+"="+kv[1])
	}
	fmt.Fprintf(b, "- Settings: %s\n", strings.Join(s, ", "))
	where := "the server's processes are visible in /proc (server CPU measured)"
	if !m.env.local {
		where = "the server's processes are not visible here (server CPU not measured)"
	}
	db := fmt.Sprintf("database %q", m.env.dbName)
	if m.env.ownDB {
		db = fmt.Sprintf("a dedicated database %q created for this run and dropped after it", m.env.dbName)
	}
	fmt.Fprintf(b, "- Database: %s; %s\n", db, where)
	fmt.Fprintf(b, "- Versions: backlog %s; River %s (github.com/riverqueue/river, riverpgxv5, rivermigrate)\n", m.backlog, m.river)
	fmt.Fprintf(b, "- Pools: each system gets its own pgxpool with MaxConns %d (a LISTEN connection taken out of it may add one)\n", m.env.cfg.poolConns)
	for _, n := range m.env.notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
}

// moduleVersion returns the version of a dependency built into this binary.
func moduleVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "?"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Version + " => " + d.Replace.Path
			}
			return d.Version
		}
	}
	return "?"
}

// backlogRevision names the library's working tree (bench/ sits inside it).
func backlogRevision() string {
	out, err := exec.Command("git", "-C", "..", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "(working tree ../, git revision unknown)"
	}
	return "working tree ../ at " + strings.TrimSpace(string(out))
}
