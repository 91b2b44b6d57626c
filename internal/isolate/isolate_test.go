package isolate

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

var (
	rowErr  = &pgconn.PgError{Code: "22023", Message: "bad row"}
	busyErr = &pgconn.PgError{Code: "55P03", Message: "lock not available"}
	connErr = &pgconn.PgError{Code: "08006", Message: "connection failure"}
)

// fake writes ints; poison rows fail whenever present in a batch.
type fake struct {
	bad, busy map[int]bool
	written   []int
	poisoned  []int
	busied    []int
	calls     int
	failAt    int   // the failAt-th Write call fails with failErr
	failErr   error // …
	poisonErr error
}

func (f *fake) writer() Writer[int] {
	return Writer[int]{
		Write: func(ctx context.Context, items []int) error {
			f.calls++
			if f.calls == f.failAt {
				return f.failErr
			}
			for _, it := range items {
				if f.bad[it] {
					return rowErr
				}
				if f.busy[it] {
					return busyErr
				}
			}
			f.written = append(f.written, items...)
			return nil
		},
		Poison: func(ctx context.Context, item int, cause error) error {
			if f.poisonErr != nil {
				return f.poisonErr
			}
			f.poisoned = append(f.poisoned, item)
			return nil
		},
		Busy: func(item int) { f.busied = append(f.busied, item) },
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestOnePoisonAmongMany(t *testing.T) {
	f := &fake{bad: map[int]bool{37: true}, busy: map[int]bool{90: true}}
	rest, err := f.writer().Run(context.Background(), seq(100))
	require.NoError(t, err)
	require.Empty(t, rest)
	require.Equal(t, []int{37}, f.poisoned)
	require.Equal(t, []int{90}, f.busied)
	got := slices.Sorted(slices.Values(f.written))
	require.Len(t, got, 98)
	require.NotContains(t, got, 37)
	require.NotContains(t, got, 90)
	// Bisection, not row by row: about 2·log2(n) extra statements per bad row.
	require.Less(t, f.calls, 40)
}

func TestTransientStopsWithTheRest(t *testing.T) {
	f := &fake{bad: map[int]bool{3: true}, failAt: 3, failErr: connErr}
	rest, err := f.writer().Run(context.Background(), seq(8))
	require.ErrorIs(t, err, connErr)
	// Call 1 fails on row 3, call 2 writes nothing ([0..3] has row 3), call
	// 3 ([0 1]) hits the connection error: every row is still to write.
	require.ElementsMatch(t, seq(8), rest)
	require.Empty(t, f.written)

	// Retried, the rest goes through and the bad row is poisoned.
	f.failAt = 0
	rest, err = f.writer().Run(context.Background(), rest)
	require.NoError(t, err)
	require.Empty(t, rest)
	require.Equal(t, []int{3}, f.poisoned)
	require.Len(t, f.written, 7)
}

func TestPoisonThatFailsIsSystemic(t *testing.T) {
	f := &fake{bad: map[int]bool{0: true, 1: true}, poisonErr: errors.New("relation does not exist")}
	rest, err := f.writer().Run(context.Background(), seq(2))
	require.Error(t, err)
	require.ErrorIs(t, err, rowErr)
	require.Equal(t, []int{0, 1}, rest, "nothing is dropped when even the minimal write fails")
}

func TestBusyWithoutHandlerIsRetried(t *testing.T) {
	f := &fake{busy: map[int]bool{1: true}}
	w := f.writer()
	w.Busy = nil
	rest, err := w.Run(context.Background(), seq(4))
	require.ErrorIs(t, err, busyErr)
	// Like a transient error, it stops the run: the rest is retried later.
	require.Equal(t, []int{1, 2, 3}, rest)
	require.Equal(t, []int{0}, f.written)
}
