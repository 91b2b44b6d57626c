package backlog

import (
	"context"
	"sync"
)

// service is one background part of a Queue: the notifier (announcer),
// listener, heartbeat, completer, acquirer, maintenance and scheduler. start
// is idempotent; stop tolerates a service that never started or already
// stopped, and returns once every goroutine of the service has exited. A
// stopped service does not start again.
//
// The Queue declares its services in one list, in start order (see
// Queue.services); Close stops them in reverse.
type service interface {
	start()
	stop()
}

// runner runs one goroutine for a service: start runs it once, under a
// context that stop cancels; stop then waits for it.
type runner struct {
	mu     sync.Mutex
	state  uint8 // 0 new, 1 running, 2 stopped
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs run in a goroutine unless it runs or ran already. It reports
// whether it started it.
func (r *runner) start(run func(ctx context.Context)) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != 0 {
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done, r.state = cancel, make(chan struct{}), 1
	go func() { // awaited by stop
		defer close(r.done)
		run(ctx)
	}()
	return true
}

// stop cancels the goroutine's context and waits for it to return.
func (r *runner) stop() {
	r.mu.Lock()
	if r.state != 1 {
		r.state = 2
		r.mu.Unlock()
		return
	}
	r.state = 2
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	cancel()
	<-done
}
