// Package pgcpu reads the CPU time of PostgreSQL's server processes from
// /proc, for benchmarks whose server runs on the same machine: the
// benchmark commands (cmd/bench, cmd/scale) share it.
package pgcpu

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Visible reports whether pid is a PostgreSQL process this machine's /proc
// shows (the server is local).
func Visible(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "postgres")
}

// ServerPids returns the server processes working for conn's database
// (its backends and autovacuum workers) and the shared background
// processes, without conn's own backend, plus the postmaster (which forks
// every new connection).
func ServerPids(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND (datname = current_database() OR datname IS NULL)`)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	return WithPostmaster(pids), nil
}

// WithPostmaster adds the postmaster (the parent of pids[0]) to pids.
func WithPostmaster(pids []int) []int {
	if len(pids) > 0 {
		if pp := ParentPid(pids[0]); pp > 1 {
			pids = append(pids, pp)
		}
	}
	return pids
}

// Sample reads the CPU time of each of pids that is visible.
func Sample(pids []int) map[int]time.Duration {
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if d, ok := ProcCPU(pid); ok {
			out[pid] = d
		}
	}
	return out
}

// Between is the CPU spent between samples a and b: processes that exited
// in between are lost (keep pools open through a phase, so these are few);
// processes that started in between count from zero.
func Between(a, b map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range b {
		d += t - a[pid]
	}
	return d
}

// ProcCPU returns a single-threaded process's CPU time (a PostgreSQL
// process): /proc/<pid>/schedstat (nanoseconds) when the kernel has it, else
// utime+stime from /proc/<pid>/stat (ticks of 10 ms). schedstat covers the
// main thread only: use StatCPU for a multi-threaded process.
func ProcCPU(pid int) (time.Duration, bool) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns), true
			}
		}
	}
	return StatCPU(pid)
}

// StatCPU returns a process's CPU time, all its threads (exited ones too),
// from utime+stime in /proc/<pid>/stat: ticks of 10 ms.
func StatCPU(pid int) (time.Duration, bool) {
	f := statFields(pid)
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, true // USER_HZ is 100 on Linux
}

// ParentPid returns a process's parent, or 0.
func ParentPid(pid int) int {
	f := statFields(pid)
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

// statFields returns the fields of /proc/<pid>/stat after the command name:
// f[0] is the state (field 3 of proc(5)).
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}
