package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/bench/internal/pgcpu"
)

// monitor is the harness's own connection to the benchmark database. It
// counts its statements (each one is a transaction) so that they can be
// taken out of the server's transaction counts, and its backend is left out
// of the server CPU sums.
type monitor struct {
	conn  *pgx.Conn
	pid   int
	stmts int64 // statements run so far
	mark  int64 // stmts just before the last xacts reading
	jobs  jobTables
}

func openMonitor(ctx context.Context, env *benchEnv, jobs jobTables) (*monitor, error) {
	conn, err := env.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("monitor connection: %w", err)
	}
	m := &monitor{conn: conn, jobs: jobs}
	if err := m.row(ctx, "SELECT pg_backend_pid()").Scan(&m.pid); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return m, nil
}

func (m *monitor) close(ctx context.Context) { m.conn.Close(context.WithoutCancel(ctx)) }

func (m *monitor) row(ctx context.Context, sql string, args ...any) pgx.Row {
	m.stmts++
	return m.conn.QueryRow(ctx, sql, args...)
}

// pending reports whether any job is still waiting or running.
func (m *monitor) pending(ctx context.Context) (bool, error) {
	var p bool
	err := m.row(ctx, m.jobs.pending).Scan(&p)
	return p, err
}

// completed returns how many jobs have been completed.
func (m *monitor) completed(ctx context.Context) (int64, error) {
	var n int64
	err := m.row(ctx, m.jobs.completed).Scan(&n)
	return n, err
}

// ready returns how many jobs are waiting to run.
func (m *monitor) ready(ctx context.Context) (int64, error) {
	var n int64
	err := m.row(ctx, m.jobs.ready).Scan(&n)
	return n, err
}

// xacts returns the committed plus rolled-back transactions of the
// benchmark database so far, as far as backends have flushed them. A
// backend flushes its counts at its first idle moment, then at most once a
// second (up to 10 s late when idle), and always when it exits: so the
// monitor's statements from this reading on (sinceMark) show up only once
// the monitor has closed, while the ones before it were already flushed.
func (m *monitor) xacts(ctx context.Context) (int64, error) {
	m.mark = m.stmts
	var n int64
	err := m.row(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// sinceMark is the number of statements run from the last xacts reading
// on, that one included.
func (m *monitor) sinceMark() int64 { return m.stmts - m.mark }

// pgssCalls returns the statements pg_stat_statements has seen in the
// benchmark database so far.
func (m *monitor) pgssCalls(ctx context.Context) (int64, error) {
	var n int64
	err := m.row(ctx, `SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
	return n, err
}

// walBytes returns the server's current WAL position in bytes.
func (m *monitor) walBytes(ctx context.Context) (int64, error) {
	var n int64
	err := m.row(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&n)
	return n, err
}

// serverPids returns the server processes working for the benchmark
// database (its backends and autovacuum workers), the shared background
// processes and the postmaster, without the monitor's own backend.
func (m *monitor) serverPids(ctx context.Context) ([]int, error) {
	m.stmts++
	return pgcpu.ServerPids(ctx, m.conn)
}
