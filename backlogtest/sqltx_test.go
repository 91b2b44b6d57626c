package backlogtest_test

import (
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/backlogtest/internal/sqltx"
	"github.com/backlogq/backlog/internal/testdb"
)

// The caller's-transaction suite (internal/sqltx) with a pgx.Tx and
// with a *sql.Tx of pgx's stdlib driver; backlogtest/internal/pqtest runs it with
// lib/pq.

func TestEnqueueTxPgx(t *testing.T) {
	t.Parallel()
	sqltx.Run(t, sqltx.Pgx(testdb.Pool(t)))
}

func TestEnqueueTxStdlib(t *testing.T) {
	t.Parallel()
	sqltx.Run(t, sqltx.SQL(stdlibDB(t)))
}

// stdlibDB opens a database/sql pool on pgx's stdlib driver.
func stdlibDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testdb.URL())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}
