package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// usage is a point-in-time reading of what a phase costs.
type usage struct {
	at      time.Time
	wal     int64                 // server WAL position, bytes
	pgCPU   map[int]time.Duration // CPU of server processes (see monitor.serverPids)
	self    time.Duration         // CPU of this process (getrusage)
	child   time.Duration         // CPU of the system's child process, if it has one
	queries int64                 // statements sent by the system's pool (and its child)
}

// client is the CPU spent on the client side: this process and the system's
// child process.
func (u usage) client() time.Duration { return u.self + u.child }

// childProcess is a system whose workers run in a child process
// (graphile-worker): that process's CPU is client CPU too.
type childProcess interface {
	childCPU() time.Duration
}

// takeUsage reads WAL, server CPU, own CPU and the system's statement count.
// Server CPU is left empty when the server's processes are not visible here.
func takeUsage(ctx context.Context, env *benchEnv, m *monitor, sys system) (usage, error) {
	u := usage{at: time.Now(), self: selfCPU(), queries: sys.Counter().Load()}
	if c, ok := sys.(childProcess); ok {
		u.child = c.childCPU()
	}
	var err error
	if u.wal, err = m.walBytes(ctx); err != nil {
		return u, err
	}
	if !env.local {
		return u, nil
	}
	pids, err := m.serverPids(ctx)
	if err != nil {
		return u, err
	}
	u.pgCPU = make(map[int]time.Duration, len(pids)+1)
	if len(pids) > 0 {
		if pp := parentPid(pids[0]); pp > 1 {
			pids = append(pids, pp) // the postmaster (it forks every new connection)
		}
	}
	for _, pid := range pids {
		if d, ok := procCPU(pid); ok {
			u.pgCPU[pid] = d
		}
	}
	return u, nil
}

// serverCPU is the server CPU spent between a and b: processes that exited
// in between are lost (pools stay open through a phase, so these are few);
// processes that started in between count from zero.
func serverCPU(a, b usage) (time.Duration, bool) {
	if a.pgCPU == nil || b.pgCPU == nil {
		return 0, false
	}
	var d time.Duration
	for pid, t := range b.pgCPU {
		d += t - a.pgCPU[pid]
	}
	return d, true
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns a single-threaded process's CPU time (a PostgreSQL
// process): /proc/<pid>/schedstat (nanoseconds) when the kernel has it, else
// utime+stime from /proc/<pid>/stat (ticks of 10 ms). schedstat covers the
// main thread only: use statCPU for a multi-threaded process.
func procCPU(pid int) (time.Duration, bool) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns), true
			}
		}
	}
	return statCPU(pid)
}

// statCPU returns a process's CPU time, all its threads (exited ones too),
// from utime+stime in /proc/<pid>/stat: ticks of 10 ms.
func statCPU(pid int) (time.Duration, bool) {
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

// parentPid returns a process's parent, or 0.
func parentPid(pid int) int {
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
