package store

import (
	"context"
	"fmt"
	"time"
)

// Savepoint runs fn inside a savepoint of db, a transaction of the
// caller's: if fn fails, everything fn did (rows, locks, NOTIFYs) is rolled
// back and the transaction stays usable, where a failed statement would
// otherwise leave it aborted. Savepoints nest, so fn may run inside one of
// the caller's. It costs two statements (SAVEPOINT and RELEASE).
func (s *Store) Savepoint(ctx context.Context, db DB, fn func() error) error {
	if _, err := db.Exec(ctx, `SAVEPOINT backlog_enqueue`); err != nil {
		return fmt.Errorf("opening a savepoint: %w", err)
	}
	if err := fn(); err != nil {
		// Also when ctx ended (fn's error may be its end): the caller's
		// transaction outlives this call. A failed rollback (the
		// connection is gone) leaves nothing to save: fn's error says what
		// went wrong.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, rbErr := db.Exec(rbCtx, `ROLLBACK TO SAVEPOINT backlog_enqueue`); rbErr == nil {
			_, _ = db.Exec(rbCtx, `RELEASE SAVEPOINT backlog_enqueue`)
		}
		return err
	}
	if _, err := db.Exec(ctx, `RELEASE SAVEPOINT backlog_enqueue`); err != nil {
		return fmt.Errorf("releasing a savepoint: %w", err)
	}
	return nil
}
