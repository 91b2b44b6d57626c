// Package pgerr classifies errors from PostgreSQL and the connection to it.
//
// Three classes matter to backlog's batched writes:
//   - Transient: the statement may succeed if sent again unchanged (the
//     connection dropped, the server is restarting, a deadlock or
//     serialization failure, a timeout). Nothing about the rows is wrong.
//   - Busy: a row lock could not be taken in time (lock_timeout, NOWAIT).
//     One of the rows is held by another transaction.
//   - anything else: possibly tied to one row's data (a value PostgreSQL
//     rejects, a trigger that raises, a constraint). Batches split to find
//     the row.
package pgerr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Code returns err's SQLSTATE, or "" when err is not a PostgreSQL error.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Transient reports whether err is a failure of the connection or of the
// server as a whole, or a conflict between transactions, after which the
// same statement may succeed.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if code := Code(err); code != "" {
		switch {
		case strings.HasPrefix(code, "08"): // connection exception
			return true
		case strings.HasPrefix(code, "53"): // insufficient resources (too many connections, out of memory, disk full)
			return true
		case strings.HasPrefix(code, "58"): // system error (I/O)
			return true
		case code == "57P01", code == "57P02", code == "57P03": // admin/crash shutdown, cannot connect now
			return true
		case code == "57014": // query cancelled: a statement timeout or our own deadline
			return true
		case code == "40001", code == "40P01": // serialization failure, deadlock
			return true
		}
		return false
	}
	if pgconn.Timeout(err) || pgconn.SafeToRetry(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var netErr net.Error
	var connErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || strings.Contains(err.Error(), "conn closed")
}

// Busy reports whether err says a lock could not be taken in time
// (lock_not_available: lock_timeout or NOWAIT).
func Busy(err error) bool { return Code(err) == "55P03" }

// UndefinedTable reports whether err says a relation or function does not
// exist (the schema is not migrated).
func UndefinedTable(err error) bool {
	code := Code(err)
	return code == "42P01" || code == "42883" || code == "3F000"
}

// DuplicateKey reports whether err is a unique violation of the named
// constraint (index).
func DuplicateKey(err error, constraint string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == constraint
}

// StatementTimeout reports whether err says statement_timeout cancelled
// the statement (57014 is also a cancel request's, pg_cancel_backend's;
// the message tells them apart where the server speaks English, and a
// localized one counts as a cancel request).
func StatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014" && strings.Contains(pgErr.Message, "statement timeout")
}
