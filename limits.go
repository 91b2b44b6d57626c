package backlog

import (
	"context"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
)

// Limit is the flow control of one job type (SetLimit), enforced by the
// claim statement across every process working the schema. Zero fields are
// no limit; Concurrency, KeyConcurrency, Rate and Burst are at most 2^30.
//
// Concurrency bounds the jobs of the type running at once; KeyConcurrency
// bounds them per concurrency key (ConcurrencyKey; jobs without a key are
// bound by Concurrency only). Rate bounds how many jobs start per Per,
// for the whole type or, with RatePerKey, for each key: a generic cell
// rate algorithm (a token bucket) starting at most one job every Per/Rate,
// with bursts of up to Burst starts when the type was idle. A Work call's
// own Concurrency still bounds what that call runs.
//
// A job holding a slot keeps it until its outcome is written, or, if its
// process dies, until its lease expires and the sweep makes it available
// again. A Concurrency slot is free for its own process's claims earlier,
// once the job's handler has returned (docs/flow-control.md), so the
// limit bounds the handlers running at once while a row may stay running
// a few milliseconds longer. When slots are short, claims take jobs only for workers waiting
// at that moment (no prefetch), so slots are not held by jobs waiting in
// one process's buffer.
type Limit struct {
	// Concurrency: at most this many jobs of the type running at once,
	// across all processes. 0 (the default): no limit.
	Concurrency int
	// KeyConcurrency: at most this many jobs of each concurrency key
	// running at once. 0 (the default): no limit.
	KeyConcurrency int
	// Rate: at most this many job starts per Per. 0 (the default): no
	// limit.
	Rate int
	// Per is the rate's period, whole milliseconds from 1 ms to 366
	// days; required with Rate.
	Per time.Duration
	// Burst: how many starts the rate allows at once after a quiet spell,
	// at most Rate. Defaults to the starts of 100 ms at the rate, at least
	// 1 (10 a second: 1, so starts are spread evenly).
	Burst int
	// RatePerKey applies Rate to each concurrency key instead of the whole
	// type. Defaults to false.
	RatePerKey bool
}

// TypeLimit is a job type's limits, as stored.
type TypeLimit struct {
	Type string
	Limit
	UpdatedAt time.Time
}

// Limits of what a limit may be (Limit's doc states them).
const (
	maxLimit    = 1 << 30 // Concurrency, KeyConcurrency, Rate, Burst
	maxRatePer  = 366 * 24 * time.Hour
	minRatePer  = time.Millisecond
	defaultSpan = 100 * time.Millisecond // Burst's default: the starts of this span
)

// SetLimit sets the limits of a job type, replacing those it had, for
// every process at once: processes waiting for slots are woken, and the
// next claim of the type applies it. It is idempotent, so processes can
// declare their limits at start-up. Jobs already running keep running
// when a limit is lowered below their number; no new one starts until
// they are under it.
func (q *Queue) SetLimit(ctx context.Context, typ string, l Limit) error {
	if q.isClosed() {
		return ErrClosed
	}
	if err := validateType(typ); err != nil {
		return err
	}
	l, err := validateLimit(l)
	if err != nil {
		return err
	}
	tightened, err := q.store.SetLimit(ctx, store.LimitRow{Type: typ, Concurrency: l.Concurrency, KeyConcurrency: l.KeyConcurrency,
		Rate: l.Rate, Per: l.Per, Burst: l.Burst, RatePerKey: l.RatePerKey})
	if err != nil {
		return q.readErr(ctx, fmt.Errorf("setting the limit of %q: %w", typ, err))
	}
	ps := []posting.Posting{{Type: typ}} // a raised limit: waiting jobs may start
	if tightened {
		// Jobs claimed ahead under the old limits go back (in this
		// process before SetLimit returns), and are claimed again under
		// the new ones.
		ps = append([]posting.Posting{{Hold: []string{typ}}}, ps...)
	}
	q.announce.committed(ps)
	return nil
}

// RemoveLimit removes the limits of a job type: its waiting jobs are
// claimed at once, by every process. Removing the limits of a type that
// has none does nothing.
func (q *Queue) RemoveLimit(ctx context.Context, typ string) error {
	if q.isClosed() {
		return ErrClosed
	}
	if err := validateType(typ); err != nil {
		return err
	}
	removed, err := q.store.RemoveLimit(ctx, typ)
	if err != nil {
		return q.readErr(ctx, fmt.Errorf("removing the limit of %q: %w", typ, err))
	}
	if removed {
		q.announce.committed([]posting.Posting{{Type: typ}})
	}
	return nil
}

// Limits lists the limited job types, by type.
func (q *Queue) Limits(ctx context.Context) ([]TypeLimit, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	rows, err := q.readsFor(ctx).Limits(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading limits: %w", err))
	}
	out := make([]TypeLimit, len(rows))
	for i, r := range rows {
		out[i] = TypeLimit{Type: r.Type, UpdatedAt: r.UpdatedAt, Limit: Limit{Concurrency: r.Concurrency,
			KeyConcurrency: r.KeyConcurrency, Rate: r.Rate, Per: r.Per, Burst: r.Burst, RatePerKey: r.RatePerKey}}
	}
	return out, nil
}

// Validate reports whether SetLimit accepts l, and for any type: nil, or
// an *InputError (matching ErrInvalid) naming the field, as SetLimit
// returns it. It writes nothing.
func (l Limit) Validate() error {
	_, err := validateLimit(l)
	return err
}

// validateLimit checks l and fills in Burst's default.
func validateLimit(l Limit) (Limit, error) {
	for _, f := range []struct {
		name string
		v    int
	}{{"concurrency", l.Concurrency}, {"key concurrency", l.KeyConcurrency}, {"rate", l.Rate}, {"burst", l.Burst}} {
		if f.v < 0 || f.v > maxLimit {
			return l, invalid(f.name, "must be in [1, %d], or 0 for none; got %d", maxLimit, f.v)
		}
	}
	switch {
	case l.Concurrency == 0 && l.KeyConcurrency == 0 && l.Rate == 0:
		return l, invalid("limit", "sets no limit (Concurrency, KeyConcurrency and Rate are 0); use RemoveLimit to remove one")
	case l.Rate == 0 && (l.Per != 0 || l.Burst != 0 || l.RatePerKey):
		return l, invalid("rate", "Per, Burst and RatePerKey need a Rate")
	case l.Rate > 0 && (l.Per < minRatePer || l.Per > maxRatePer):
		return l, invalid("per", "the rate's period must be in [%s, %s], got %s", minRatePer, maxRatePer, l.Per)
	case l.Rate > 0 && l.Per%time.Millisecond != 0:
		return l, invalid("per", "the rate's period must be whole milliseconds, got %s", l.Per)
	case l.Burst > l.Rate:
		return l, invalid("burst", "%d is more than the rate (%d)", l.Burst, l.Rate)
	case l.KeyConcurrency > 0 && l.Concurrency > 0 && l.KeyConcurrency > l.Concurrency:
		return l, invalid("key concurrency", "%d is more than the type's concurrency (%d)", l.KeyConcurrency, l.Concurrency)
	}
	if l.Rate > 0 && l.Burst == 0 {
		l.Burst = min(l.Rate, max(1, int(int64(l.Rate)*int64(defaultSpan)/int64(l.Per))))
	}
	return l, nil
}
