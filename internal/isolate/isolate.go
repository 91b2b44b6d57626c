// Package isolate writes batches so that one bad row cannot hold back, or
// take down, the rest of its batch.
//
// Batching is why backlog is fast; it must never be why a job is lost. A
// batch statement that fails for a reason tied to one row (a value
// PostgreSQL rejects, a trigger that raises, a row lock held by someone
// else) would otherwise fail every row with it, and be retried and fail
// together again. Writer.Run splits such a batch in halves until the
// offending row is alone, writes every other row, and hands the offender to
// Poison (finish it as failed with the reason) or Busy (retry it on its
// own, where waiting for a lock delays nobody else). Transient errors (the
// connection, the server, a deadlock) stop the run with the rows still to
// write, for the caller to retry unchanged.
package isolate

import (
	"context"
	"fmt"

	"github.com/backlogq/backlog/internal/pgerr"
)

// Writer writes batches of T with failure isolation.
type Writer[T any] struct {
	// Write writes items all-or-nothing (one statement or transaction).
	// Items it has written must not be written again by a later call: a
	// Write that records results per item should skip items already
	// recorded.
	Write func(ctx context.Context, items []T) error
	// Poison finishes one item whose write failed alone, with cause as the
	// reason, in a minimal write that carries none of the item's own
	// data. Nil: the item is dropped (the caller reports it in Write's or
	// its own way).
	Poison func(ctx context.Context, item T, cause error) error
	// Busy takes one item whose write alone could not take a row lock in
	// time (pgerr.Busy), to retry it on its own. Nil: busy counts as
	// transient.
	Busy func(item T)
}

// Run writes items. It returns nil when every item was written, poisoned
// or handed to Busy. Otherwise it returns the items not yet written and
// the error that stopped it: a transient error, ctx's end, or a failure
// of Poison itself (the database rejects even the minimal write: nothing
// about the row is to blame), for the caller to retry after a pause.
func (w Writer[T]) Run(ctx context.Context, items []T) (rest []T, err error) {
	if len(items) == 0 {
		return nil, nil
	}
	err = w.Write(ctx, items)
	switch {
	case err == nil:
		return nil, nil
	case ctx.Err() != nil || pgerr.Transient(err):
		return items, err
	case pgerr.Busy(err) && len(items) == 1:
		if w.Busy == nil {
			return items, err
		}
		w.Busy(items[0])
		return nil, nil
	case len(items) == 1:
		if w.Poison == nil {
			return nil, nil
		}
		if perr := w.Poison(ctx, items[0], err); perr != nil {
			return items, fmt.Errorf("%w; recording that failure also failed: %w", err, perr)
		}
		return nil, nil
	}
	mid := len(items) / 2
	if rest, err := w.Run(ctx, items[:mid]); err != nil {
		return append(rest, items[mid:]...), err
	}
	return w.Run(ctx, items[mid:])
}
