package backlog

import "time"

// WithClock replaces the Queue's wall clock (tests skew it).
func WithClock(f func() time.Time) Option { return func(c *config) { c.clock = f } }
