package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/backlogq/backlog/internal/store"
)

// floorSys is the raw-SQL floor: backlog's schema, rows and statements, with
// no library around them. It takes part in the burn-down only.
type floorSys struct {
	*backlogSys // Open, Migrate, BulkInsert, Close, Tables: the same as backlog's

	stop context.CancelFunc
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
}

func newFloor(env *benchEnv, schema string) *floorSys {
	return &floorSys{backlogSys: newBacklog(env, schema, false)}
}

func (s *floorSys) Insert(context.Context, int64) error {
	return errors.New("the raw-SQL floor has no single-row insert")
}

// Start runs cfg.floorConns loops, each claiming up to cfg.floorBatch jobs
// with backlog's claim statement and completing them all with one finish
// statement.
func (s *floorSys) Start(_ context.Context, _ workSpec) error {
	st := store.New(s.pool, s.schema)
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	types, tags := []string{benchType}, json.RawMessage(`{}`)
	batch := s.env.cfg.floorBatch
	for range s.env.cfg.floorConns {
		s.wg.Go(func() {
			fs := make([]store.Finish, 0, batch)
			for ctx.Err() == nil {
				claimed, err := st.Claim(ctx, types, tags, batch, batch, backlogLease, "floor", nil)
				if err != nil {
					s.fail(ctx, fmt.Errorf("floor claim: %w", err))
					continue
				}
				jobs := claimed.Jobs
				if len(jobs) == 0 {
					pause(ctx, time.Millisecond)
					continue
				}
				fs = fs[:0]
				for _, j := range jobs {
					fs = append(fs, store.Finish{ID: j.ID, Token: j.Token, State: "completed"})
				}
				// The call backlog's completer makes; like it, write rows a
				// concurrent claim held for a moment (busy) again.
				for len(fs) > 0 && ctx.Err() == nil {
					res, err := st.Finish(ctx, fs)
					if err != nil {
						s.fail(ctx, fmt.Errorf("floor finish: %w", err))
						break
					}
					busy := fs[:0]
					for _, f := range fs {
						switch res.Status[f.ID] {
						case store.Written:
						case store.Busy:
							busy = append(busy, f)
						default:
							s.fail(ctx, fmt.Errorf("floor finish: lease of job %s lost", f.ID))
						}
					}
					fs = busy
				}
			}
		})
	}
	return nil
}

func (s *floorSys) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	pause(ctx, 10*time.Millisecond)
}

func (s *floorSys) Stop(ctx context.Context) error {
	if s.stop == nil {
		return nil
	}
	s.stop()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("floor loops did not stop: %w", ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// pause sleeps for d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
