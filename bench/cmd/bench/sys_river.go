package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const (
	riverDefaultWorkers = 100
	riverTunedWorkers   = 2000
	riverTunedCooldown  = 2 * time.Millisecond
	riverTunedPoll      = 20 * time.Millisecond
)

// Kind makes benchArgs River job args.
func (benchArgs) Kind() string { return benchType }

// idleArgs is the job kind registered for the idle phase, whose queues never
// get a job.
type idleArgs struct{}

func (idleArgs) Kind() string { return "idle" }

// riverSys is River, either at its defaults or with its benchmark's settings.
type riverSys struct {
	env     *benchEnv
	schema  string
	tuned   bool
	counter stmtCounter
	pool    *pgxpool.Pool
	insert  *river.Client[pgx.Tx] // insert-only client, used when no worker client runs
	work    atomic.Pointer[river.Client[pgx.Tx]]
	hook    atomic.Pointer[jobHook]
}

func newRiver(env *benchEnv, schema string, tuned bool) *riverSys {
	return &riverSys{env: env, schema: schema, tuned: tuned}
}

// logger keeps River's warnings on stderr, away from the table on stdout.
func riverLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (s *riverSys) workers() *river.Workers {
	w := river.NewWorkers()
	river.AddWorker(w, river.WorkFunc(func(_ context.Context, j *river.Job[benchArgs]) error {
		if h := s.hook.Load(); h != nil {
			(*h)(j.Args.Seq, time.Now())
		}
		return nil
	}))
	river.AddWorker(w, river.WorkFunc(func(context.Context, *river.Job[idleArgs]) error { return nil }))
	return w
}

func (s *riverSys) Open(ctx context.Context) error {
	pool, err := s.env.newPool(ctx, &s.counter)
	if err != nil {
		return err
	}
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema: s.schema, Workers: s.workers(), Logger: riverLogger(),
	})
	if err != nil {
		pool.Close()
		return err
	}
	s.pool, s.insert = pool, c
	return nil
}

// Migrate creates the schema and runs River's migrations into it with
// rivermigrate's Schema option.
func (s *riverSys) Migrate(ctx context.Context) error {
	if err := s.env.exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(s.pool), &rivermigrate.Config{Schema: s.schema, Logger: riverLogger()})
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func (s *riverSys) client() *river.Client[pgx.Tx] {
	if c := s.work.Load(); c != nil {
		return c
	}
	return s.insert
}

func (s *riverSys) BulkInsert(ctx context.Context, from int64, n int) error {
	params := make([]river.InsertManyParams, 0, insertChunk)
	for done := 0; done < n; done += len(params) {
		params = params[:0]
		for i := done; i < n && len(params) < insertChunk; i++ {
			params = append(params, river.InsertManyParams{Args: benchArgs{Seq: from + int64(i)}})
		}
		if _, err := s.client().InsertManyFast(ctx, params); err != nil {
			return err
		}
	}
	return nil
}

func (s *riverSys) Insert(ctx context.Context, seq int64) error {
	_, err := s.client().Insert(ctx, benchArgs{Seq: seq}, nil)
	return err
}

func (s *riverSys) Start(ctx context.Context, spec workSpec) error {
	s.hook.Store(nil)
	if spec.hook != nil {
		s.hook.Store(&spec.hook)
	}
	n := riverDefaultWorkers
	if s.tuned {
		n = riverTunedWorkers
	}
	if spec.perDomain > 0 {
		n = spec.perDomain
	}
	queues := map[string]river.QueueConfig{}
	if spec.domains <= 1 {
		queues[river.QueueDefault] = river.QueueConfig{MaxWorkers: n}
	} else {
		for i := range spec.domains {
			queues[fmt.Sprintf("idle_%02d", i)] = river.QueueConfig{MaxWorkers: n}
		}
	}
	cfg := &river.Config{Schema: s.schema, Workers: s.workers(), Queues: queues, Logger: riverLogger()}
	if s.tuned {
		cfg.FetchCooldown, cfg.FetchPollInterval = riverTunedCooldown, riverTunedPoll
	}
	c, err := river.NewClient(riverpgxv5.New(s.pool), cfg)
	if err != nil {
		return err
	}
	// Start's context only bounds startup here; Stop ends the client.
	if err := c.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	s.work.Store(c)
	return nil
}

func (s *riverSys) Stop(ctx context.Context) error {
	c := s.work.Swap(nil)
	if c == nil {
		return nil
	}
	if err := c.Stop(ctx); err != nil {
		hard, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.StopAndCancel(hard)
		return fmt.Errorf("stopping the River client: %w", err)
	}
	return nil
}

func (s *riverSys) Close(ctx context.Context) {
	if s.pool == nil {
		return
	}
	pool := s.pool
	boundedClose(ctx, "River", pool.Close)
}

func (s *riverSys) Pool() *pgxpool.Pool   { return s.pool }
func (s *riverSys) Counter() *stmtCounter { return &s.counter }

func (s *riverSys) Tables() jobTables {
	return stateTables(pgx.Identifier{s.schema, "river_job"}.Sanitize())
}
