package main

import (
	"context"
	"syscall"
	"time"

	"github.com/backlogq/backlog/bench/internal/pgcpu"
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
	u.pgCPU = pgcpu.Sample(pgcpu.WithPostmaster(pids))
	return u, nil
}

// serverCPU is the server CPU spent between a and b: processes that exited
// in between are lost (pools stay open through a phase, so these are few);
// processes that started in between count from zero.
func serverCPU(a, b usage) (time.Duration, bool) {
	if a.pgCPU == nil || b.pgCPU == nil {
		return 0, false
	}
	return pgcpu.Between(a.pgCPU, b.pgCPU), true
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
