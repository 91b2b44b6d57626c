package backlog

// A service is a part of the Queue that owns goroutines (each through one
// run.Group: its loop, the goroutines it starts on demand, its timers).
// stop returns once every one of them has exited; it tolerates a service
// that never started, and a stopped service starts nothing more.
type service interface{ stop() }

// stopFunc is the service of a part whose stop is a function.
type stopFunc func()

func (f stopFunc) stop() { f() }
