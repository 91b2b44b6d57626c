package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// env is the database the phases run in (copied in small from cmd/bench's
// benchEnv: a dedicated database, dropped at the end).
type env struct {
	cfg      *config
	adminURL string
	dbName   string
	ownDB    bool
	base     *pgxpool.Config
	notes    []string
}

func openEnv(ctx context.Context, cfg *config, url string) (*env, error) {
	e := &env{cfg: cfg, adminURL: url}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	e.dbName = admin.Config().Database
	if cfg.newDB {
		name := fmt.Sprintf("backlog_soak_%d", os.Getpid())
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			e.notes = append(e.notes, fmt.Sprintf("could not create a dedicated database (%v): using %q, so other sessions in it can be the oldest transaction", err, e.dbName))
		} else {
			e.dbName, e.ownDB = name, true
		}
	}
	base, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	base.ConnConfig.Database = e.dbName
	base.MaxConns = cfg.pool
	e.base = base
	return e, nil
}

// connect opens a connection to the soak database named app in
// pg_stat_activity (and so in the queue's warnings and Stats).
func (e *env) connect(ctx context.Context, app string) (*pgx.Conn, error) {
	cc := e.base.ConnConfig.Copy()
	cc.RuntimeParams["application_name"] = app
	return pgx.ConnectConfig(ctx, cc)
}

// newPool returns a pool on the soak database.
func (e *env) newPool(ctx context.Context, app string, maxConns int32) (*pgxpool.Pool, error) {
	pc := e.base.Copy()
	pc.MaxConns = maxConns
	pc.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, pc)
}

// dropSchema drops a schema, giving up rather than waiting long for locks.
func (e *env) dropSchema(ctx context.Context, schema string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	conn, err := e.connect(ctx, "backlog-soak-admin")
	if err == nil {
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "SET lock_timeout = '20s'; DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	if err != nil {
		logf("warning: dropping schema %s: %v", schema, err)
	}
}

// close drops the dedicated database.
func (e *env) close(ctx context.Context) {
	if !e.ownDB {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
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

// settings reads server settings by name ("?" when unreadable).
func settings(ctx context.Context, conn *pgx.Conn, names ...string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&v); err != nil {
			v = "?"
		}
		out[n] = v
	}
	return out
}
