package backlog

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/store"
)

// Listing limits: a caller sizing its pages needs them.
const (
	// DefaultListLimit is the page size of List when Filter.Limit is 0.
	DefaultListLimit = 50
	// MaxListLimit is the largest page List returns.
	MaxListLimit = 500
)

// maxListIDs bounds Filter.IDs (a finished job is found by ID through a
// BRIN index, one lookup each).
const maxListIDs = MaxListLimit

// Filter selects jobs for List and the bulk operations (RetryWhere,
// CancelWhere, DeleteWhere). Every field narrows the selection; the zero
// Filter selects every job.
type Filter struct {
	// States: jobs in any of these states.
	States []State
	// Types: jobs of any of these types.
	Types []string
	// Tags: jobs whose tags include all of these, with the same values.
	Tags Tags
	// OrderingKey and UniqueKey: jobs with this key.
	OrderingKey string
	UniqueKey   string
	// ConcurrencyKey: jobs with this concurrency key. Not indexed: it
	// narrows what the other filters select (a page may come back short,
	// with a cursor to go on).
	ConcurrencyKey string
	// ErrorContains: jobs whose last error contains this text (case
	// insensitive).
	ErrorContains string
	// CreatedAfter and CreatedBefore: jobs created in [after, before).
	CreatedAfter, CreatedBefore time.Time
	// FinishedAfter and FinishedBefore: jobs that finished in [after,
	// before).
	FinishedAfter, FinishedBefore time.Time
	// IDs: only these jobs (at most 500, as many as MaxListLimit).
	IDs []uuid.UUID
}

// ListOptions says which page of a listing List returns.
type ListOptions struct {
	// Oldest lists oldest first (by creation); the default is newest first.
	Oldest bool
	// Limit is the page size, at most MaxListLimit. Defaults to
	// DefaultListLimit.
	Limit int
	// Cursor continues a listing: the Next of the previous page (with the
	// same filter and order). Empty starts from the beginning.
	Cursor string
}

// ListPage is one page of a listing.
type ListPage struct {
	Jobs []*JobInfo
	// Next continues the listing (ListOptions.Cursor); empty when every
	// job was seen. A page may hold fewer jobs than asked (even none) and
	// still have a Next: each page reads a bounded number of rows, so a
	// rare match in a large table takes several pages.
	Next string
}

// List returns a page of the jobs f selects, live and finished, newest
// (or, with opts.Oldest, oldest) first by creation, using keyset
// pagination. However selective the filter, one page reads at most a few
// bounded statements' worth of rows (2,000 per statement), so
// listing stays cheap on any table size.
func (q *Queue) List(ctx context.Context, f Filter, opts ListOptions) (*ListPage, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	return q.listFrom(ctx, q.readsFor(ctx), f, opts)
}

// listFrom lists through st: the read pool's for List, the primary's for
// the …Where actions, which must act on the jobs as they are.
func (q *Queue) listFrom(ctx context.Context, st *store.Store, f Filter, opts ListOptions) (*ListPage, error) {
	lq, err := f.query()
	if err != nil {
		return nil, err
	}
	switch {
	case opts.Limit < 0 || opts.Limit > MaxListLimit:
		return nil, invalid("limit", "must be between 0 and %d, got %d", MaxListLimit, opts.Limit)
	case opts.Limit == 0:
		opts.Limit = DefaultListLimit
	}
	lq.Limit, lq.Scan, lq.Oldest = opts.Limit, store.DefaultScan, opts.Oldest
	if opts.Cursor != "" {
		after, err := decodeCursor(opts.Cursor, opts.Oldest)
		if err != nil {
			return nil, err
		}
		lq.After = &after
	}
	res, err := st.List(ctx, lq)
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("listing jobs: %w", err))
	}
	page := &ListPage{Jobs: make([]*JobInfo, 0, len(res.Rows))}
	for _, r := range res.Rows {
		info, err := infoOf(r)
		if err != nil {
			return nil, err
		}
		page.Jobs = append(page.Jobs, info)
	}
	if res.Next != nil {
		page.Next = encodeCursor(*res.Next, opts.Oldest)
	}
	return page, nil
}

// query validates f and turns it into the store's query.
func (f *Filter) query() (store.ListQuery, error) {
	var lq store.ListQuery
	for _, s := range f.States {
		switch s {
		case StateBlocked, StateScheduled, StateAvailable, StateRunning, StateCompleted, StateFailed, StateCancelled:
		default:
			return lq, invalid("states", "unknown state %q", s)
		}
		lq.States = append(lq.States, string(s))
	}
	for _, t := range f.Types {
		if err := validateType(t); err != nil {
			return lq, invalid("types", "%s", err.(*InputError).Reason)
		}
	}
	lq.Types = f.Types
	if len(f.Tags) > 0 {
		if err := validateTags("tags", map[string]string(f.Tags)); err != nil {
			return lq, err
		}
		lq.Tags, _ = json.Marshal(map[string]string(f.Tags)) // strings only: cannot fail
	}
	if err := validateKey("ordering key", f.OrderingKey); err != nil {
		return lq, err
	}
	if err := validateKey("concurrency key", f.ConcurrencyKey); err != nil {
		return lq, err
	}
	if err := validateKey("unique key", f.UniqueKey); err != nil {
		return lq, err
	}
	if err := validateText("error contains", f.ErrorContains, maxKeyBytes, true); err != nil {
		return lq, err
	}
	lq.OrderingKey, lq.UniqueKey, lq.ErrorContains = f.OrderingKey, f.UniqueKey, f.ErrorContains
	lq.ConcurrencyKey = f.ConcurrencyKey
	if !f.CreatedAfter.IsZero() && !f.CreatedBefore.IsZero() && !f.CreatedAfter.Before(f.CreatedBefore) {
		return lq, invalid("created", "after (%s) must be before before (%s)", f.CreatedAfter, f.CreatedBefore)
	}
	if !f.FinishedAfter.IsZero() && !f.FinishedBefore.IsZero() && !f.FinishedAfter.Before(f.FinishedBefore) {
		return lq, invalid("finished", "after (%s) must be before before (%s)", f.FinishedAfter, f.FinishedBefore)
	}
	lq.CreatedFrom, lq.CreatedTo, lq.FinishedFrom, lq.FinishedTo = f.CreatedAfter, f.CreatedBefore, f.FinishedAfter, f.FinishedBefore
	if len(f.IDs) > maxListIDs {
		return lq, invalid("ids", "at most %d, got %d", maxListIDs, len(f.IDs))
	}
	lq.IDs = f.IDs
	return lq, nil
}

// A cursor is where a listing stands (store.ListCursor) and the order it
// was listed in: a flags byte, the ID, the finish time in Unix
// microseconds.
func encodeCursor(c store.ListCursor, oldest bool) string {
	b := make([]byte, 25)
	if oldest {
		b[0] |= 1
	}
	if c.Finished {
		b[0] |= 2
	}
	copy(b[1:17], c.ID[:])
	binary.BigEndian.PutUint64(b[17:], uint64(c.FinishedAt.UnixMicro()))
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string, oldest bool) (store.ListCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 25 || b[0] > 3 {
		return store.ListCursor{}, invalid("cursor", "not a cursor of List")
	}
	if (b[0]&1 == 1) != oldest {
		return store.ListCursor{}, invalid("cursor", "was made for the other order")
	}
	c := store.ListCursor{Finished: b[0]&2 == 2, ID: uuid.UUID(b[1:17])}
	c.FinishedAt = time.UnixMicro(int64(binary.BigEndian.Uint64(b[17:])))
	return c, nil
}
