package backlogtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// SchemaPrefix starts the name of every schema NewQueue creates.
const SchemaPrefix = "backlogtest_"

// NewQueue returns a Queue over pool in a fresh schema (SchemaPrefix and 12
// random hex digits), migrated. When the test ends (t.Cleanup) it closes
// the Queue and drops the schema with everything in it; it never closes
// pool. Tests that each take their own Queue this way may run in parallel
// against one database. opts are passed to backlog.New after the schema
// option, except a WithSchema among them, which NewQueue overrides (so
// that it never drops a schema it did not create). The Queue logs
// warnings and errors to stderr, not the Info lines of every migration;
// a WithLogger among opts replaces that logger. Once the Queue has worked
// jobs (Work, DrainUntilIdle, Queue.Work) it holds one connection of pool
// for its listener until the test ends (none with backlog.WithPollOnly):
// size pool for the tests that run at once. Every Work call the
// test starts on the Queue must have returned by the time the test's
// cleanups run (Close waits for them).
func NewQueue(t TB, pool *pgxpool.Pool, opts ...backlog.Option) *backlog.Queue {
	t.Helper()
	if pool == nil {
		fatalf(t, "NewQueue: pool must not be nil")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := SchemaPrefix + hex.EncodeToString(b[:])
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	all := append([]backlog.Option{backlog.WithLogger(logger)}, opts...)
	all = append(all, backlog.WithSchema(schema))
	ctx := context.Background()
	q, err := backlog.New(ctx, pool, all...)
	if err != nil {
		fatalf(t, "NewQueue: %v", err)
	}
	t.Cleanup(func() {
		_ = q.Close()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("backlogtest: dropping schema %s: %v", schema, err)
		}
	})
	if err := q.Migrate(ctx); err != nil {
		fatalf(t, "NewQueue: migrating schema %s: %v", schema, err)
	}
	return q
}
