package backlog

import (
	"context"
	"database/sql"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/store"
)

// Tx is a transaction of yours that EnqueueTx, EnqueueManyTx and
// InsertMany write in, and that backlogtest's …Tx assertions read through.
// This is the one list of what it may be; it is one of:
//
//   - a pgx.Tx (pgx.Conn.Begin, pgxpool.Pool.Begin, pgx.BeginFunc, …);
//   - a database/sql transaction on PostgreSQL: a *sql.Tx of any driver
//     (pgx's stdlib, lib/pq, …), or any value with the methods of SQLTx,
//     such as *sqlx.Tx, or a GORM transaction's tx.Statement.ConnPool (its
//     *sql.Tx, or PrepareStmt's wrapper of it). Not a bun.Tx itself: its
//     methods format the query with their own ? placeholders and pass
//     the driver no arguments; pass the *sql.Tx it embeds (bunTx.Tx).
//
// Any other value, a nil one included, is refused with an *InputError
// naming "tx", before anything is written.
//
// Tx is checked when called rather than by the compiler because pgx.Tx and
// *sql.Tx have no method in common (pgx's Exec returns a
// pgconn.CommandTag, database/sql's ExecContext a sql.Result), so no
// narrower type admits both: an interface of either's methods would break
// the other's callers, and a Queue generic in its transaction type (as
// River's Client[TTx] is) would tie each Queue to one driver and change
// every caller's types. Callers passing a pgx.Tx compile unchanged.
//
// Both kinds run the same statements, with the same validation, locks and
// notifications; the differences are in the guide docs/database-sql.md.
type Tx any

// SQLTx is the database/sql transaction that a Tx may be: the methods of
// *sql.Tx that EnqueueTx runs its statements with, and Commit and
// Rollback, which backlog never calls but which tell a transaction from a
// *sql.DB or *sql.Conn (whose statements would each commit on their own,
// without the enqueue's locks; those are refused).
type SQLTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	Commit() error
	Rollback() error
}

// txDB returns what the store runs tx's statements on: a pgx.Tx itself, a
// database/sql transaction through store.SQL; nil for a nil tx.
func txDB(tx Tx) (store.DB, error) {
	switch t := tx.(type) {
	case nil:
		return nil, nil
	case pgx.Tx:
		if nilPointer(t) {
			return nil, invalid("tx", "must not be nil")
		}
		return t, nil
	case SQLTx:
		if nilPointer(t) {
			return nil, invalid("tx", "must not be nil")
		}
		return store.SQL(t), nil
	case store.SQLQuerier:
		return nil, invalid("tx", "%T is not a transaction: pass the *sql.Tx that BeginTx returns", tx)
	}
	return nil, invalid("tx", "%T is neither a pgx.Tx nor a database/sql transaction (*sql.Tx, or a type with the methods of SQLTx)", tx)
}

// nilPointer reports whether v is a nil pointer in a non-nil interface.
func nilPointer(v any) bool {
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}
