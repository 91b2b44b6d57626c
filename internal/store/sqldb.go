package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SQLQuerier is what a statement needs of a database/sql transaction
// (*sql.Tx, *sqlx.Tx, bun.Tx, …).
type SQLQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL runs the store's statements on a database/sql transaction, with any
// PostgreSQL driver (pgx's stdlib, lib/pq, …): the statement texts are the
// pgx path's; only the arguments are bound differently. A leading
// pgx.QueryExecMode is dropped, and the slices the statements bind are sent
// as array literals in PostgreSQL's text format (a string, which every
// driver sends as text and the server parses with the statement's cast,
// e.g. $1::uuid[]). Errors that carry a SQLSTATE but are not pgx's
// (lib/pq's *pq.Error) also match *pgconn.PgError with errors.As, so
// pgerr's classification works for them; sql.ErrNoRows becomes
// pgx.ErrNoRows.
func SQL(q SQLQuerier) DB { return sqlDB{q} }

type sqlDB struct{ q SQLQuerier }

func (d sqlDB) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	args, err := sqlArgs(args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	_, err = d.q.ExecContext(ctx, query, args...)
	return pgconn.CommandTag{}, sqlErr(err)
}

func (d sqlDB) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	args, err := sqlArgs(args)
	if err != nil {
		return nil, err
	}
	rows, err := d.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, sqlErr(err)
	}
	return &sqlRows{rows: rows}, nil
}

func (d sqlDB) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	args, err := sqlArgs(args)
	if err != nil {
		return errRow{err}
	}
	return sqlRow{d.q.QueryRowContext(ctx, query, args...)}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type sqlRow struct{ row *sql.Row }

func (r sqlRow) Scan(dest ...any) error { return sqlErr(r.row.Scan(dest...)) }

// sqlRows is *sql.Rows as the pgx.Rows that pgx.ForEachRow and
// pgx.CollectRows read (Next, Scan, Err, Close).
type sqlRows struct {
	rows *sql.Rows
	err  error
}

func (r *sqlRows) Close()                                       { _ = r.rows.Close() }
func (r *sqlRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *sqlRows) RawValues() [][]byte                          { return nil }
func (r *sqlRows) Conn() *pgx.Conn                              { return nil }
func (r *sqlRows) TypeMap() *pgtype.Map                         { return nil }
func (r *sqlRows) Next() bool                                   { return r.err == nil && r.rows.Next() }

func (r *sqlRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return sqlErr(r.rows.Err())
}

func (r *sqlRows) Scan(dest ...any) error {
	if err := r.rows.Scan(dest...); err != nil {
		r.err = sqlErr(err)
		_ = r.rows.Close()
		return r.err
	}
	return nil
}

func (r *sqlRows) Values() ([]any, error) {
	cols, err := r.rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return vals, r.Scan(ptrs...)
}

// sqlArgs converts a pgx statement's arguments for database/sql.
func sqlArgs(args []any) ([]any, error) {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:]
		}
	}
	out := make([]any, len(args))
	for i, a := range args {
		v, err := sqlArg(a)
		if err != nil {
			return nil, fmt.Errorf("binding parameter $%d: %w", i+1, err)
		}
		out[i] = v
	}
	return out, nil
}

// sqlArg converts one argument: scalars pass (database/sql and its
// drivers handle them, uuid.UUID through driver.Valuer), the slice types
// the store binds become text array literals. [][]byte and
// []json.RawMessage are jsonb arrays: their elements are sent as text.
func sqlArg(a any) (any, error) {
	switch v := a.(type) {
	case nil, string, bool, int, int16, int32, int64, uuid.UUID, time.Time:
		return v, nil
	case []string:
		return arrayLiteral(v, func(s string) (string, bool) { return s, true }), nil
	case []*string:
		return arrayLiteral(v, func(s *string) (string, bool) {
			if s == nil {
				return "", false
			}
			return *s, true
		}), nil
	case []uuid.UUID:
		return arrayLiteral(v, func(id uuid.UUID) (string, bool) { return id.String(), true }), nil
	case [][16]byte:
		return arrayLiteral(v, func(id [16]byte) (string, bool) { return uuid.UUID(id).String(), true }), nil
	case [][]byte:
		return arrayLiteral(v, jsonElem), nil
	case []json.RawMessage:
		return arrayLiteral(v, func(b json.RawMessage) (string, bool) { return jsonElem(b) }), nil
	case []int16:
		return arrayLiteral(v, func(n int16) (string, bool) { return strconv.FormatInt(int64(n), 10), true }), nil
	case []int32:
		return arrayLiteral(v, func(n int32) (string, bool) { return strconv.FormatInt(int64(n), 10), true }), nil
	case []int64:
		return arrayLiteral(v, func(n int64) (string, bool) { return strconv.FormatInt(n, 10), true }), nil
	case []*time.Time:
		return arrayLiteral(v, func(t *time.Time) (string, bool) {
			if t == nil {
				return "", false
			}
			return timeElem(*t), true
		}), nil
	}
	return nil, fmt.Errorf("store: %T cannot be bound through database/sql", a)
}

func jsonElem(b []byte) (string, bool) {
	if b == nil {
		return "", false
	}
	return string(b), true
}

// timeElem writes t as timestamptz input, to the microsecond (truncated,
// as pgx's binary encoding does).
func timeElem(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05.999999Z07:00")
}

// arrayLiteral writes xs as a one-dimensional array literal: every element
// double-quoted with backslash and quote escaped, or NULL where elem
// reports none.
func arrayLiteral[T any](xs []T, elem func(T) (string, bool)) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(',')
		}
		s, ok := elem(x)
		if !ok {
			b.WriteString("NULL")
			continue
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// sqlState is a database/sql driver's error with a SQLSTATE (lib/pq's
// *pq.Error); fields reads its other fields by their protocol codes (pq's
// Get).
type sqlState interface {
	error
	SQLState() string
}

type fieldGetter interface{ Get(k byte) string }

// sqlErr maps a database/sql error to what the store's callers test for.
func sqlErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return err // pgx's stdlib driver
	}
	var st sqlState
	if !errors.As(err, &st) || st.SQLState() == "" {
		return err
	}
	pgErr = &pgconn.PgError{Code: st.SQLState(), Message: st.Error()}
	if g, ok := st.(fieldGetter); ok {
		pgErr.Severity, pgErr.Message, pgErr.Detail, pgErr.Hint = g.Get('S'), g.Get('M'), g.Get('D'), g.Get('H')
		pgErr.SchemaName, pgErr.TableName, pgErr.ColumnName = g.Get('s'), g.Get('t'), g.Get('c')
		pgErr.ConstraintName = g.Get('n')
	}
	return &driverError{err: err, pg: pgErr}
}

// driverError is a driver's error that also matches *pgconn.PgError.
type driverError struct {
	err error
	pg  *pgconn.PgError
}

func (e *driverError) Error() string   { return e.err.Error() }
func (e *driverError) Unwrap() []error { return []error{e.err, e.pg} }
