package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/bench/internal/pgcpu"
)

// benchEnv is the database the phases run in and what is known about it.
type benchEnv struct {
	cfg      *config
	adminURL string // DATABASE_URL as given
	dbName   string // database the phases run in
	ownDB    bool   // created by us: dropped at the end
	poolBase *pgxpool.Config
	pgss     bool // pg_stat_statements is usable in dbName
	local    bool // the server's processes are visible in /proc
	notes    []string
	schemas  atomic.Int64
	noise    *noise
}

// openEnv creates a dedicated database for the run when it can, so that
// pg_stat_database counts only the benchmark's transactions on a shared
// server; otherwise it uses DATABASE_URL's database as is.
func openEnv(ctx context.Context, cfg *config, url string) (*benchEnv, error) {
	env := &benchEnv{cfg: cfg, adminURL: url}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	env.dbName = admin.Config().Database
	if cfg.newDB {
		name := fmt.Sprintf("backlog_bench_%d", os.Getpid())
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			env.notes = append(env.notes, fmt.Sprintf("could not create a dedicated database (%v): using %q, so transaction counts include any other session in it", err, env.dbName))
		} else {
			env.dbName, env.ownDB = name, true
		}
	}
	base, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	base.ConnConfig.Database = env.dbName
	base.MaxConns = cfg.poolConns
	env.poolBase = base

	conn, err := env.connect(ctx)
	if err != nil {
		env.close(ctx)
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	env.pgss = probePGSS(ctx, conn, env.ownDB)
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err == nil {
		env.local = pgcpu.Visible(pid)
	}
	return env, nil
}

// probePGSS reports whether pg_stat_statements can be read in the
// connection's database, creating the extension when allowed.
func probePGSS(ctx context.Context, conn *pgx.Conn, mayCreate bool) bool {
	var had bool
	_ = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')").Scan(&had)
	if !had && mayCreate {
		if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return false
		}
	}
	var n int64
	err := conn.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM pg_stat_statements LIMIT 1) s").Scan(&n)
	return err == nil
}

// connect opens a plain connection to the benchmark database.
func (e *benchEnv) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, e.poolBase.ConnConfig.Copy())
}

// newPool returns a pool for one system with the shared size and a statement
// counter.
func (e *benchEnv) newPool(ctx context.Context, counter *stmtCounter) (*pgxpool.Pool, error) {
	pc := e.poolBase.Copy()
	counter.byText = e.cfg.sqlStats
	pc.ConnConfig.Tracer = counter
	return pgxpool.NewWithConfig(ctx, pc)
}

// newSchema returns a fresh schema name for a system.
func (e *benchEnv) newSchema(key string) string {
	return fmt.Sprintf("bench_%s_%d_%d", strings.ReplaceAll(key, "-", "_"), os.Getpid(), e.schemas.Add(1))
}

// exec runs one statement on a short-lived connection (it exits at once, so
// its statistics are flushed and do not land in a later measurement).
func (e *benchEnv) exec(ctx context.Context, sql string) error {
	conn, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// queryRow runs one query of one row on a short-lived connection (as exec)
// and scans it into dest.
func (e *benchEnv) queryRow(ctx context.Context, sql string, dest ...any) error {
	conn, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// sqlStats logs the statements a system sent since the counter's texts were
// last reset (with -sqlstats).
func (e *benchEnv) sqlStats(what string, sys system) {
	if !e.cfg.sqlStats {
		return
	}
	logf("%s: statements sent, by text:", what)
	for _, l := range sys.Counter().top(10) {
		fmt.Fprintln(os.Stderr, l)
	}
}

// dropSchema drops a schema, giving up rather than waiting for locks held by
// a system that did not stop.
func (e *benchEnv) dropSchema(ctx context.Context, schema string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := e.exec(ctx, "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	if err != nil {
		logf("warning: dropping schema %s: %v", schema, err)
	}
}

// close drops the dedicated database.
func (e *benchEnv) close(ctx context.Context) {
	if !e.ownDB {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, e.adminURL)
	if err != nil {
		logf("warning: could not drop database %s: %v", e.dbName, err)
		return
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{e.dbName}.Sanitize()+" WITH (FORCE)"); err != nil {
		logf("warning: could not drop database %s: %v", e.dbName, err)
	}
}
