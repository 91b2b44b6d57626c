package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Vacuuming the jobs table while a backlog drains.
//
// Every claim turns a row's available version dead (the update to
// running) and every finish deletes the row, so a draining backlog leaves
// dead entries at the head of the claim indexes, where every claim's
// index scan starts: a claim steps over all of them (marked dead or not,
// they stay in the index pages until a VACUUM removes them), so the cost
// of a claim grows with the jobs that drained before it. Autovacuum
// removes them too, but it looks at a database once a minute
// (autovacuum_naptime) and only past a fraction of the table
// (autovacuum_vacuum_scale_factor): a backlog of a million jobs drains
// in well under a minute. So the maintenance loop asks, while jobs
// finish, how many dead rows the jobs table holds, and vacuums it past a
// threshold.

// VacuumStatement begins the VACUUM that VacuumJobs runs (the table's
// name follows): a migration that needs the jobs table cancels one it
// finds running (pg_stat_activity.query) rather than queue behind it, and
// every claim with it.
const VacuumStatement = "VACUUM (SKIP_LOCKED, TRUNCATE false) "

// VacuumResult is what one VacuumJobs call did.
type VacuumResult struct {
	Dead     int64 // dead rows the statistics counted in the jobs table
	Vacuumed bool  // a VACUUM ran
	// Left is how many dead rows the VACUUM could not remove (an older
	// snapshot may still see them): they count again until one can.
	Left int64
	// NotOwner: the pool's role may not vacuum the table (it neither owns
	// it nor is a superuser, nor holds PostgreSQL 17's MAINTAIN on it):
	// nothing was done.
	NotOwner bool
}

// VacuumJobs vacuums the jobs table when the statistics count at least
// minDead dead rows and minLive live ones in it and no vacuum (its own or
// autovacuum's) ended within gap. A vacuum records the table's size for
// the planner: one of a table that holds few live rows at that moment
// (a queue keeping up) makes plans for a small table, and if the table
// then grows (a burst), the finish statements that trust them scan it
// whole (seen at 10,000-25,000 jobs/s offered: finishes of a second
// each, the queue stalled). Only a large backlog is vacuumed. The VACUUM skips the table if another one holds it
// (SKIP_LOCKED) and does not truncate it (which would take an exclusive
// lock).
func (s *Store) VacuumJobs(ctx context.Context, minDead, minLive int64, gap time.Duration) (VacuumResult, error) {
	var r VacuumResult
	var live int64
	var recent, owner bool
	err := s.pool.QueryRow(ctx, `SELECT coalesce(t.n_dead_tup, 0), coalesce(t.n_live_tup, 0),
		coalesce(greatest(t.last_vacuum, t.last_autovacuum) > now() - $2::bigint * interval '1 millisecond', false)
			OR EXISTS (SELECT 1 FROM pg_stat_progress_vacuum p WHERE p.relid = c.oid),
		pg_has_role(c.relowner, 'USAGE') OR (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
			OR (current_setting('server_version_num')::int >= 170000 AND has_table_privilege(c.oid, 'MAINTAIN'))
		FROM pg_class c LEFT JOIN pg_stat_user_tables t ON t.relid = c.oid WHERE c.oid = $1::regclass`,
		Mode, pgx.Identifier{s.schema, "jobs"}.Sanitize(), gap.Milliseconds()).Scan(&r.Dead, &live, &recent, &owner)
	if err != nil {
		return r, err
	}
	if !owner {
		r.NotOwner = true
		return r, nil
	}
	if r.Dead < minDead || live < minLive || recent {
		return r, nil
	}
	if err := s.vacuum(ctx); err != nil {
		return r, err
	}
	r.Vacuumed = true
	err = s.pool.QueryRow(ctx, `SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)`,
		Mode, pgx.Identifier{s.schema, "jobs"}.Sanitize()).Scan(&r.Left)
	return r, err
}

// vacuum runs the VACUUM on a connection of its own and, if ctx ends
// first, cancels it on the server: a pool's connection gives up on a
// cancelled context by closing the socket, and the server would go on
// vacuuming (holding the lock a migration or a DROP needs) until it next
// wrote to the client, which a VACUUM does only at its end.
func (s *Store) vacuum(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	ran, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	finished := make(chan struct{})
	cancelled := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelled)
		cctx, cancel := context.WithTimeout(context.Background(), vacuumCancelWait)
		defer cancel()
		_ = conn.Conn().PgConn().CancelRequest(cctx)
		select { // the server answers a cancel at once; else give up the connection
		case <-finished:
		case <-cctx.Done():
			cancelRun()
		}
	})
	// A utility statement: the simple protocol (it cannot be prepared in
	// every pooler's mode, and runs outside a transaction block).
	_, err = conn.Exec(ran, VacuumStatement+pgx.Identifier{s.schema, "jobs"}.Sanitize(), pgx.QueryExecModeSimpleProtocol)
	close(finished)
	if !stop() {
		<-cancelled
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

// vacuumCancelWait bounds how long a cancelled vacuum waits for the
// server to stop it before closing its connection.
const vacuumCancelWait = 5 * time.Second
