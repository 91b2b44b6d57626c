package backlog

import "time"

// WithClock replaces the Queue's wall clock (tests skew it).
func WithClock(f func() time.Time) Option { return queueOption(func(c *config) { c.clock = f }) }
