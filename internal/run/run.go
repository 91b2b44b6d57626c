// Package run owns the goroutines of a Queue's background services: each
// service has one Group, which starts every goroutine of the service
// (its main loop, the goroutines it starts on demand, its timer
// callbacks), gives them one context, and on Stop waits for every one of
// them. No goroutine of a service is started any other way.
package run

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Group owns a set of goroutines. The zero value is ready to use. Once
// Stop begins, Start and AfterFunc start nothing more; Go still starts
// goroutines until Stop returns (a goroutine of the group draining its
// work may need another: the count it holds keeps Stop waiting), and
// nothing after.
type Group struct {
	mu       sync.Mutex
	ctx      context.Context
	cancel   context.CancelFunc
	started  bool // Start ran its main function
	stopping bool // Stop began
	stopped  bool // Stop returned
	wg       sync.WaitGroup
	timers   map[*Timer]struct{} // callbacks not yet run nor stopped
}

func (g *Group) initLocked() {
	if g.ctx == nil {
		g.ctx, g.cancel = context.WithCancel(context.Background())
	}
}

// Context is the context of the group's goroutines: cancelled by Stop
// (after its grace period).
func (g *Group) Context() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.initLocked()
	return g.ctx
}

// Start runs main in a goroutine of the group, unless Start ran before or
// the group is stopped. It reports whether it started it.
func (g *Group) Start(main func(ctx context.Context)) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started || g.stopping {
		return false
	}
	g.started = true
	g.goLocked(main)
	return true
}

// Go runs f in a goroutine of the group, unless Stop has returned. It
// reports whether it started f. Once Stop has begun, only a goroutine of
// the group may call Go.
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.goLocked(f)
	return true
}

func (g *Group) goLocked(f func(ctx context.Context)) {
	g.initLocked()
	ctx := g.ctx
	g.wg.Add(1)
	go func() { // awaited by Stop
		defer g.wg.Done()
		f(ctx)
	}()
}

// A Timer is a callback of the group, due later (AfterFunc).
type Timer struct {
	g *Group
	t *time.Timer
}

// AfterFunc runs f in a goroutine of the group after d, unless the group
// is stopped by then or the timer is stopped first. It returns nil once
// Stop has begun.
func (g *Group) AfterFunc(d time.Duration, f func()) *Timer {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return nil
	}
	g.wg.Add(1)
	t := &Timer{g: g}
	if g.timers == nil {
		g.timers = map[*Timer]struct{}{}
	}
	g.timers[t] = struct{}{}
	t.t = time.AfterFunc(d, func() {
		defer g.wg.Done()
		g.mu.Lock()
		delete(g.timers, t)
		g.mu.Unlock()
		f()
	})
	return t
}

// Stop prevents a callback that has not run from running. It reports
// whether it did. Stop on a nil Timer does nothing.
func (t *Timer) Stop() bool {
	if t == nil {
		return false
	}
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	return t.g.stopTimerLocked(t)
}

func (g *Group) stopTimerLocked(t *Timer) bool {
	if !t.t.Stop() {
		return false
	}
	delete(g.timers, t)
	g.wg.Done()
	return true
}

// Stop starts nothing more and stops the callbacks not yet due (they never
// run), gives the group's goroutines up to grace to return on their own,
// then cancels their context, and returns once every one has returned.
// Stop is idempotent.
func (g *Group) Stop(grace time.Duration) {
	g.mu.Lock()
	g.stopping = true
	for t := range g.timers {
		g.stopTimerLocked(t)
	}
	g.initLocked()
	cancel := g.cancel
	g.mu.Unlock()
	if grace > 0 {
		done := make(chan struct{})
		go func() { // exits once the group's goroutines have; awaited below
			g.wg.Wait()
			close(done)
		}()
		t := time.NewTimer(grace)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
		cancel()
		<-done
	} else {
		cancel()
		g.wg.Wait()
	}
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
}

// Wake sends on ch, a wake-up channel with a buffer of 1, without
// blocking: a wake-up still pending covers this one.
func Wake(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Jitter returns d give or take up to 20 %, at random: processes that
// started together spread their periodic work apart.
func Jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// NewBackoff returns a jittered exponential backoff from initial to max,
// never giving up: the pacing of a background loop's retries.
func NewBackoff(initial, max time.Duration) *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = initial, max, 0
	b.Reset() // NewExponentialBackOff reset with the default initial interval
	return b
}
