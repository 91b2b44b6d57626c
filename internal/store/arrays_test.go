package store

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

// internedText reads every value right, NULL as "", and allocates for
// neither a job state nor a repeat of the previous row's value.
func TestInternedText(t *testing.T) {
	var x internedText
	for _, s := range []string{"completed", "available", "00000001", "00000001", "", "x"} {
		b := []byte(s)
		require.NoError(t, x.ScanBytes(b))
		require.Equal(t, s, x.v)
		if s != "" {
			b[0] = '#' // the buffer is pgx's, reused for the next row
			require.Equal(t, s, x.v, "kept a reference to the row's buffer")
		}
	}
	require.NoError(t, x.ScanBytes(nil))
	require.Equal(t, "", x.v)
	state, timeline := []byte("completed"), []byte("00000001")
	require.Zero(t, testing.AllocsPerRun(100, func() {
		_ = x.ScanBytes(state)
		_ = x.ScanBytes(state)
	}))
	_ = x.ScanBytes(timeline)
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = x.ScanBytes(timeline) }))
}

// uuidArray and textArray encode as pgx encodes plain slices, NULL for
// nil, with a few allocations a batch rather than some for each element.
func TestArrayParameters(t *testing.T) {
	m := pgtype.NewMap()
	ids := make([][16]byte, 1000)
	states := make([]string, 1000)
	for i := range ids {
		ids[i] = uuid.New()
		states[i] = jobStates[i%len(jobStates)]
	}
	for _, c := range []struct {
		oid         uint32
		plain, ours any
	}{
		{pgtype.UUIDArrayOID, ids, uuidArray(ids)},
		{pgtype.TextArrayOID, states, textArray(states)},
		{pgtype.UUIDArrayOID, [][16]byte(nil), uuidArray(nil)},
		{pgtype.TextArrayOID, []string{}, textArray{}},
	} {
		for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
			want, err := m.Encode(c.oid, format, c.plain, nil)
			require.NoError(t, err)
			got, err := m.Encode(c.oid, format, c.ours, nil)
			require.NoError(t, err)
			require.Equal(t, want, got, "%T, format %d", c.ours, format)
		}
	}
	buf := make([]byte, 0, 64<<10)
	for _, a := range []any{uuidArray(ids), textArray(states)} {
		allocs := testing.AllocsPerRun(20, func() {
			_, err := m.Encode(oidOf(a), pgtype.BinaryFormatCode, a, buf[:0])
			require.NoError(t, err)
		})
		require.Less(t, allocs, 10.0, "%T of 1,000 elements", a)
	}
}

func oidOf(a any) uint32 {
	if _, ok := a.(uuidArray); ok {
		return pgtype.UUIDArrayOID
	}
	return pgtype.TextArrayOID
}
