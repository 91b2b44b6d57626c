// Package pqtest runs the caller's-transaction suite (backlogtest/internal/sqltx)
// with a *sql.Tx of lib/pq. It is a module of its own so that the
// library's go.mod never lists lib/pq; make test runs it.
package pqtest

import (
	"database/sql"
	"os"
	"strings"
	"testing"

	_ "github.com/lib/pq" // the "postgres" database/sql driver
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/backlogq/backlog/backlogtest/internal/sqltx"
	"github.com/backlogq/backlog/internal/testdb"
)

func TestMain(m *testing.M) {
	if err := testdb.Ping(); err != nil {
		// As in the root module: a skip, except under CI.
		os.Stderr.WriteString("pqtest: no PostgreSQL at $DATABASE_URL (" + err.Error() + "); skipping. `make test` finds or starts one.\n")
		if os.Getenv("BACKLOG_CI") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func TestEnqueueTxLibPQ(t *testing.T) {
	url := testdb.URL()
	if !strings.Contains(url, "sslmode=") {
		// lib/pq requires TLS unless told otherwise; the test servers have none.
		url += map[bool]string{true: "&", false: "?"}[strings.Contains(url, "?")] + "sslmode=disable"
	}
	db, err := sql.Open("postgres", url)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	sqltx.Run(t, sqltx.SQL(db))
}
