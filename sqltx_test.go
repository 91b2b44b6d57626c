package backlog_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/stdlib" // also the "pgx" database/sql driver
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// stdlibDB opens a database/sql pool on pgx's stdlib driver.
func stdlibDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testdb.URL())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// TestEnqueueTxRefusesOtherValues: anything but a pgx.Tx or a database/sql
// transaction is refused with an *InputError naming "tx", and nothing is
// written.
func TestEnqueueTxRefusesOtherValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	db := stdlibDB(t)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	var nilSQL *sql.Tx
	for name, tx := range map[string]backlog.Tx{
		"nil": nil, "nil *sql.Tx": nilSQL, "*sql.DB": db, "*sql.Conn": conn, "pool": e.pool, "string": "tx",
	} {
		_, err := e.q.EnqueueTx(ctx, tx, "refused", nil)
		requireInputField(t, err, "tx", name)
		_, err = e.q.EnqueueManyTx(ctx, tx, []backlog.JobSpec{{Type: "refused"}})
		requireInputField(t, err, "tx", name)
		if tx != nil {
			_, err = e.q.InsertMany(ctx, tx, []backlog.JobSpec{{Type: "refused"}})
			requireInputField(t, err, "tx", name)
		}
	}
	require.Zero(t, e.count(`true`))
}

func requireInputField(t *testing.T, err error, field, msg string) {
	t.Helper()
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie, msg)
	require.Equal(t, field, ie.Field, "%s: %v", msg, err)
}

// A database/sql transaction (here of pgx's stdlib driver, on the Queue's
// own pool) takes the job like a pgx.Tx: it exists only if the transaction
// commits, and bad input leaves the transaction usable.
func ExampleQueue_EnqueueTx_databaseSQL() {
	q, pool, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback() }()
	_, err = q.EnqueueTx(ctx, tx, "invoice.render", nil, backlog.Priority(500))
	fmt.Println("bad input:", errors.Is(err, backlog.ErrInvalid))
	id, err := q.EnqueueTx(ctx, tx, "invoice.render", map[string]int{"invoice": 42})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	info, err := q.Job(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println("after commit:", info.State)
	// Output:
	// bad input: true
	// after commit: available
}
