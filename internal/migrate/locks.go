package migrate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/internal/pgerr"
)

// Lock waits. A migration changes tables every process uses (jobs above
// all) and needs ACCESS EXCLUSIVE locks on them. Behind a long transaction
// that holds any lock on such a table, the migration's request waits, and
// every statement on the table queues behind the request: the whole queue
// stalls for as long as the migration waits. Failing at once would fail a
// deploy on any busy queue. So an attempt waits at most LockTimeout for a
// lock, then rolls back (the queue goes on) and is made again after a
// pause (doubling from LockPause up to LockPauseMax), until LockRetryFor
// has passed since the first attempt; then Up or Down returns the lock
// error. Variables so that tests can shorten them.
var (
	LockTimeout  = 2 * time.Second
	LockRetryFor = time.Minute
	LockPause    = 100 * time.Millisecond
	LockPauseMax = 5 * time.Second
)

// begin starts a migration transaction on schema and takes backlog's
// migration lock for it.
//
// The pool's own timeouts are meant for the queue's statements (a pool
// may well set statement_timeout to 100 ms) and must not cut a migration
// short, so the transaction sets its own: no statement timeout (a
// migration may rewrite a large table; the caller's context bounds it),
// no idle-in-transaction or transaction timeout, and no lock timeout
// while it waits for the migration lock (whoever holds it is migrating
// and gives up within LockTimeout when it cannot), all set by the
// statement that begins it. Then lock_timeout is LockTimeout for the
// migration's own locks.
func begin(ctx context.Context, pool *pgxpool.Pool, schema string) (pgx.Tx, error) {
	// The timeouts go in the message that begins the transaction (a simple
	// query of several statements): a pool's idle-in-transaction timeout
	// of 100 ms must not end the session in the moment between BEGIN and
	// the statement that lifts it, as it did on a loaded machine.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: `BEGIN;
SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true),
	set_config('idle_in_transaction_session_timeout', '0', true);
SELECT set_config('transaction_timeout', '0', true) WHERE current_setting('transaction_timeout', true) IS NOT NULL`})
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('backlog.migrate'), hashtext($1))`, schema)
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", LockTimeout.Milliseconds()))
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("migrate: taking the migration lock of schema %s: %w", schema, err)
	}
	return tx, nil
}

// retryLocks runs attempt (one transaction) until it succeeds, fails
// otherwise than on a lock (lock_timeout or a deadlock: the transaction
// rolled back whole, so the attempt can be made again), or LockRetryFor
// has passed.
func retryLocks(ctx context.Context, schema string, attempt func() error) error {
	start := time.Now()
	pause := LockPause
	for tries := 1; ; tries++ {
		err := attempt()
		if err == nil || !(pgerr.Busy(err) || pgerr.Code(err) == "40P01") {
			return err
		}
		if time.Since(start)+pause > LockRetryFor {
			return fmt.Errorf("migrate: schema %s: another transaction held a lock the migration needs at each of %d tries over %s "+
				"(each waited up to %s; a long transaction on the schema's tables? see pg_stat_activity and pg_locks): %w",
				schema, tries, time.Since(start).Round(time.Millisecond), LockTimeout, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migrate: schema %s: waiting to try again after a lock timeout: %w (last: %v)", schema, ctx.Err(), err)
		case <-t.C:
		}
		pause = min(2*pause, LockPauseMax)
	}
}

// cancelVacuum cancels the VACUUM of the schema's jobs table that a
// maintenance loop runs (store.VacuumStatement, whose text this matches),
// if one runs: the migration's ACCESS EXCLUSIVE lock would wait for it,
// and every claim would queue behind that wait. The loop vacuums again
// later (and none starts while the migration holds its locks: it skips a
// locked table). An operator's own VACUUM and autovacuum are left alone
// (autovacuum cancels itself for the lock), as is a vacuum by a role
// whose statements this one may not cancel.
func cancelVacuum(ctx context.Context, tx pgx.Tx, schema string) error {
	_, err := tx.Exec(ctx, `SELECT pg_cancel_backend(a.pid)
		FROM pg_stat_progress_vacuum p JOIN pg_stat_activity a ON a.pid = p.pid
		WHERE p.relid = to_regclass($1) AND a.backend_type = 'client backend' AND pg_has_role(a.usesysid, 'USAGE')
			AND a.query LIKE 'VACUUM (SKIP\_LOCKED, TRUNCATE false) %'`, pgx.Identifier{schema, "jobs"}.Sanitize())
	if err != nil {
		return fmt.Errorf("migrate: cancelling the maintenance vacuum of %s.jobs: %w", schema, err)
	}
	return nil
}
