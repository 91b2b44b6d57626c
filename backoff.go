package backlog

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff is the retry schedule of a failed attempt, in the terms of
// cenkalti/backoff/v4's ExponentialBackOff: the n-th retry waits about
// Initial * Multiplier^(n-1), capped at Max, randomised by ±Randomization.
// The wait is measured on the database clock (run_at = now() + wait).
type Backoff struct {
	Initial       time.Duration // defaults to 1 second when zero
	Max           time.Duration // defaults to 1 hour when zero
	Multiplier    float64       // defaults to 2 when zero
	Randomization float64       // 0 to 1; defaults to 0.5 when zero; use a tiny value for no jitter
}

// DefaultBackoff is the retry backoff unless configured otherwise: 1 s,
// doubling, capped at 1 h, ±50 % jitter.
var DefaultBackoff = Backoff{Initial: time.Second, Max: time.Hour, Multiplier: 2, Randomization: 0.5}

func (b Backoff) validate() error {
	if b.Initial < 0 || b.Max < 0 || b.Multiplier < 0 || b.Randomization < 0 || b.Randomization > 1 {
		return invalid("backoff", "fields must not be negative and Randomization must be in [0, 1]: %+v", b)
	}
	return nil
}

// Delay returns the wait before the retry that follows failed attempt n
// (n >= 1).
func (b Backoff) Delay(attempt int) time.Duration {
	e := &backoff.ExponentialBackOff{
		InitialInterval:     b.Initial,
		RandomizationFactor: b.Randomization,
		Multiplier:          b.Multiplier,
		MaxInterval:         b.Max,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	if e.InitialInterval == 0 {
		e.InitialInterval = DefaultBackoff.Initial
	}
	if e.MaxInterval == 0 {
		e.MaxInterval = DefaultBackoff.Max
	}
	if e.Multiplier == 0 {
		e.Multiplier = DefaultBackoff.Multiplier
	}
	if e.RandomizationFactor == 0 {
		e.RandomizationFactor = DefaultBackoff.Randomization
	}
	e.Reset()
	// The interval stops growing at Max, so a bounded loop is exact.
	var d time.Duration
	for i := 0; i < min(max(attempt, 1), 64); i++ {
		d = e.NextBackOff()
	}
	return d
}
