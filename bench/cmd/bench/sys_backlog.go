package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/backlogq/backlog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	benchType   = "bench" // the job type / kind of every benchmark job
	insertChunk = 5000    // jobs per bulk-insert call (River's benchmark uses the same)
)

// benchArgs are the args of every benchmark job.
type benchArgs struct {
	Seq int64 `json:"seq"`
}

// backlogSys is backlog at its defaults, or with WithDiscardCompleted
// (discard).
type backlogSys struct {
	env     *benchEnv
	schema  string
	discard bool
	counter stmtCounter
	pool    *pgxpool.Pool
	q       *backlog.Queue

	stopWork context.CancelFunc
	works    sync.WaitGroup
	workErr  chan error
}

func newBacklog(env *benchEnv, schema string, discard bool) *backlogSys {
	return &backlogSys{env: env, schema: schema, discard: discard}
}

func (s *backlogSys) Open(ctx context.Context) error {
	pool, err := s.env.newPool(ctx, &s.counter)
	if err != nil {
		return err
	}
	opts := []backlog.Option{backlog.WithSchema(s.schema)}
	if s.discard {
		opts = append(opts, backlog.WithDiscardCompleted())
	}
	q, err := backlog.New(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return err
	}
	s.pool, s.q = pool, q
	return nil
}

func (s *backlogSys) Migrate(ctx context.Context) error { return s.q.Migrate(ctx) }

func (s *backlogSys) BulkInsert(ctx context.Context, from int64, n int) error {
	specs := make([]backlog.JobSpec, 0, insertChunk)
	for done := 0; done < n; done += len(specs) {
		specs = specs[:0]
		for i := done; i < n && len(specs) < insertChunk; i++ {
			specs = append(specs, backlog.JobSpec{Type: benchType, Args: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, from+int64(i)))})
		}
		if _, err := s.q.EnqueueMany(ctx, specs); err != nil {
			return err
		}
	}
	return nil
}

func (s *backlogSys) Insert(ctx context.Context, seq int64) error {
	_, err := s.q.Enqueue(ctx, benchType, json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq)))
	return err
}

func (s *backlogSys) Start(_ context.Context, spec workSpec) error {
	var h backlog.Handler = backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil })
	if hook := spec.hook; hook != nil {
		h = backlog.HandlerFunc(func(_ context.Context, j *backlog.Job) error {
			var a benchArgs
			if err := json.Unmarshal(j.Args, &a); err != nil {
				return backlog.Permanent(err)
			}
			hook(a.Seq, time.Now())
			return nil
		})
	}
	// Work runs under its own context: Stop cancels it.
	ctx, cancel := context.WithCancel(context.Background())
	s.stopWork = cancel
	s.workErr = make(chan error, max(spec.domains, 1))
	run := func(opts ...backlog.WorkOption) {
		s.works.Go(func() {
			if err := s.q.Work(ctx, h, opts...); err != nil {
				s.workErr <- err
			}
		})
	}
	if spec.domains <= 1 {
		opts := []backlog.WorkOption{backlog.Types(benchType)}
		if spec.perDomain > 0 {
			opts = append(opts, backlog.Concurrency(spec.perDomain))
		}
		run(opts...)
		return nil
	}
	for i := range spec.domains {
		run(backlog.Types(fmt.Sprintf("idle.%02d", i)), backlog.Concurrency(spec.perDomain))
	}
	return nil
}

func (s *backlogSys) Stop(ctx context.Context) error {
	if s.stopWork == nil {
		return nil
	}
	s.stopWork()
	done := make(chan struct{})
	go func() { s.works.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("backlog Work did not return: %w", ctx.Err())
	}
	close(s.workErr)
	var errs []error
	for err := range s.workErr {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s *backlogSys) Close(ctx context.Context) {
	if s.q == nil {
		return
	}
	q, pool := s.q, s.pool
	boundedClose(ctx, "backlog", func() { _ = q.Close(); pool.Close() })
}

func (s *backlogSys) Pool() *pgxpool.Pool   { return s.pool }
func (s *backlogSys) Counter() *stmtCounter { return &s.counter }

func (s *backlogSys) Tables() jobTables {
	// Live jobs are in jobs, finished ones in job_history.
	t := stateTables(pgx.Identifier{s.schema, "jobs"}.Sanitize())
	t.completed = `SELECT count(*) FROM ` + pgx.Identifier{s.schema, "job_history"}.Sanitize() + ` WHERE state = 'completed'`
	if s.discard {
		// Deleted jobs are in the per-minute counters only (as discarded; a job written
		// in place is counted there once the retirer moves it; the hourly
		// rollup does not run within a benchmark).
		t.completed = `SELECT (SELECT coalesce(sum(n), 0) FROM ` + pgx.Identifier{s.schema, "job_counts"}.Sanitize() + ` WHERE state IN ('completed', 'discarded'))
			+ (SELECT count(*) FROM ` + pgx.Identifier{s.schema, "jobs"}.Sanitize() + ` WHERE state = 'completed')`
	}
	return t
}
