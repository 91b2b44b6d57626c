package backlog

import (
	"context"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/posting"
)

// PausedType is a paused job type.
type PausedType struct {
	Type     string
	PausedAt time.Time
}

// Pause stops every process from claiming jobs of the given types, from
// now on: claims skip them in the database, and processes give back the
// jobs of those types they had claimed ahead (Prefetch) without spending
// their attempts: the calling process before Pause returns, others when
// its NOTIFY reaches them, and within a second in any case (poll-only
// mode, a lost notification). Running jobs finish normally, and enqueueing goes on. Pausing is
// durable (a row per type) and idempotent; any type may be paused, known
// or not (Paused lists them).
func (q *Queue) Pause(ctx context.Context, types ...string) error {
	if err := q.checkTypes(types); err != nil {
		return err
	}
	if _, err := q.store.Pause(ctx, types); err != nil {
		return q.readErr(ctx, fmt.Errorf("pausing %v: %w", types, err))
	}
	q.announce.committed([]posting.Posting{{Hold: types}})
	return nil
}

// Resume lets the given types be claimed again, at once: idle workers of
// every process are woken. Resuming a type that is not paused does
// nothing.
func (q *Queue) Resume(ctx context.Context, types ...string) error {
	if err := q.checkTypes(types); err != nil {
		return err
	}
	resumed, err := q.store.Resume(ctx, types)
	if err != nil {
		return q.readErr(ctx, fmt.Errorf("resuming %v: %w", types, err))
	}
	ps := make([]posting.Posting, len(resumed))
	for i, t := range resumed {
		ps[i] = posting.Posting{Type: t}
	}
	q.announce.committed(ps)
	return nil
}

// Paused lists the paused types, by type.
func (q *Queue) Paused(ctx context.Context) ([]PausedType, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	ps, err := q.readsFor(ctx).PausedTypes(ctx)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading paused types: %w", err))
	}
	out := make([]PausedType, len(ps))
	for i, p := range ps {
		out[i] = PausedType{Type: p.Type, PausedAt: p.PausedAt}
	}
	return out, nil
}

func (q *Queue) checkTypes(types []string) error {
	if q.isClosed() {
		return ErrClosed
	}
	if len(types) == 0 {
		return invalid("types", "none given")
	}
	for _, t := range types {
		if err := validateType(t); err != nil {
			return err
		}
	}
	return nil
}
