package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// Environment of a worker process (the command re-executes itself).
const (
	childEnv  = "BACKLOG_SCALE_CHILD"  // "1" in a worker process
	schemaEnv = "BACKLOG_SCALE_SCHEMA" // the run's schema
	appName   = "backlog-scale"        // application_name of the workers' connections
)

// counter counts the statements a pool sends (a pgx tracer).
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// childMain is one worker process: its own pool with pgxpool's defaults
// (only application_name set, so the parent can count its connections),
// a Queue with backlog's defaults, and one Work call with its defaults
// on the run's job types, running no-op handlers. It answers each line
// on stdin with its statement count so far, and stops at EOF.
func childMain() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale worker:", err)
		return 1
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	stmts := &counter{}
	cfg.ConnConfig.Tracer = stmts
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale worker:", err)
		return 1
	}
	defer pool.Close()
	q, err := backlog.New(ctx, pool, backlog.WithSchema(os.Getenv(schemaEnv)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale worker:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }),
			backlog.Types(burnType, loadType))
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Printf("%d\n", stmts.n.Load())
	}
	cancel()
	err = <-done
	_ = q.Close()
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "scale worker: Work:", err)
		return 1
	}
	return 0
}
