package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/pgerr"
)

func TestSQLArgs(t *testing.T) {
	s := `a"b\c,{d} é`
	id := uuid.MustParse("0190f0a4-1b2c-7d3e-8f40-5a6b7c8d9e0f")
	at := time.Date(2031, 7, 1, 12, 30, 45, 123456789, time.FixedZone("x", 3600))
	got, err := sqlArgs([]any{Mode, "chan", []string{s, ""}, []*string{nil, &s}, []uuid.UUID{id}, [][16]byte{id},
		[][]byte{[]byte(`{"k": "v\"w"}`), nil}, []json.RawMessage{json.RawMessage(`[1]`)}, []int16{-1, 2}, []int32{3}, []int64{1 << 40},
		[]*time.Time{nil, &at}, []string{}})
	require.NoError(t, err)
	require.Equal(t, []any{"chan",
		`{"a\"b\\c,{d} é",""}`,
		`{NULL,"a\"b\\c,{d} é"}`,
		`{"0190f0a4-1b2c-7d3e-8f40-5a6b7c8d9e0f"}`,
		`{"0190f0a4-1b2c-7d3e-8f40-5a6b7c8d9e0f"}`,
		`{"{\"k\": \"v\\\"w\"}",NULL}`,
		`{"[1]"}`,
		`{"-1","2"}`, `{"3"}`, `{"1099511627776"}`,
		`{NULL,"2031-07-01 11:30:45.123456Z"}`,
		`{}`,
	}, got)

	_, err = sqlArgs([]any{[]float64{1}})
	require.ErrorContains(t, err, "$1")
}

// pqError has the methods of lib/pq's *pq.Error that sqlErr reads.
type pqError struct{ code, constraint string }

func (e *pqError) Error() string    { return "pq: " + e.code }
func (e *pqError) SQLState() string { return e.code }
func (e *pqError) Get(k byte) string {
	switch k {
	case 'n':
		return e.constraint
	case 'M':
		return "duplicate key value"
	}
	return ""
}

func TestSQLErr(t *testing.T) {
	require.NoError(t, sqlErr(nil))
	require.ErrorIs(t, sqlErr(fmt.Errorf("x: %w", sql.ErrNoRows)), pgx.ErrNoRows)

	orig := &pqError{code: "23505", constraint: "jobs_pkey"}
	err := sqlErr(fmt.Errorf("wrapped: %w", orig))
	require.True(t, pgerr.DuplicateKey(err, "jobs_pkey"))
	var pe *pqError
	require.True(t, errors.As(err, &pe), "the driver's own error stays reachable")
	require.Equal(t, "wrapped: pq: 23505", err.Error())

	serial := sqlErr(&pqError{code: "40001"})
	require.True(t, pgerr.Transient(serial))

	pgErr := &pgconn.PgError{Code: "23505"}
	require.Same(t, pgErr, errors.Unwrap(sqlErr(fmt.Errorf("%w", pgErr))))
	plain := errors.New("plain")
	require.Equal(t, plain, sqlErr(plain))
}
