package main

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// noise watches the shared server for other work: every half second it
// counts the sessions of other databases that are running a statement. It
// connects to DATABASE_URL's own database, so its queries stay out of the
// benchmark database's counts.
type noise struct {
	mu      sync.Mutex
	samples []noiseSample
	stop    context.CancelFunc
	done    chan struct{}
}

type noiseSample struct {
	at     time.Time
	active int
}

func watchNoise(ctx context.Context, url, benchDB string) *noise {
	ctx, cancel := context.WithCancel(ctx)
	n := &noise{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(n.done)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			logf("warning: cannot watch the server for other sessions: %v", err)
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			var c int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND state = 'active'
				AND pid <> pg_backend_pid() AND datname IS DISTINCT FROM $1`, benchDB).Scan(&c)
			if err == nil {
				n.mu.Lock()
				n.samples = append(n.samples, noiseSample{at: time.Now(), active: c})
				n.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return n
}

// busiest returns the most foreign sessions seen running at once between
// from and to.
func (n *noise) busiest(from, to time.Time) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := 0
	for _, s := range n.samples {
		if !s.at.Before(from) && !s.at.After(to) {
			m = max(m, s.active)
		}
	}
	return m
}

func (n *noise) close() {
	n.stop()
	<-n.done
}

// flagNoise marks a system's cells of a phase when other databases were
// busy meanwhile, and says so under the table.
func flagNoise(env *benchEnv, res *results, what string, k kind, from time.Time, keys ...string) {
	busy := env.noise.busiest(from, time.Now())
	if busy == 0 {
		return
	}
	for _, key := range keys {
		res.flag(key, k.key)
	}
	res.note("* %s, %s: up to %d session(s) of other databases were running statements at the same time (shared server): expect more noise, and server-wide figures (WAL, background CPU) include their share", what, k.label, busy)
}
