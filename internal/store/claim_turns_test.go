package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// TestClaimsOfATypeTakeTurns: a claim of a type waits while another claim
// of that type is in flight (version 24: every claim takes its types'
// claim locks, not only the claims of limited or keyed types), then takes
// none of its jobs; a claim of another type does not wait.
func TestClaimsOfATypeTakeTurns(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args)
		SELECT gen_random_uuid(), t, '{}' FROM generate_series(1, 20), unnest(ARRAY['a', 'b']) AS t`)
	require.NoError(t, err)

	// A claim of a in flight: its transaction stays open.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var first int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM (`+s.sql.claim+`) c WHERE c.id IS NOT NULL`,
		Mode, []string{"a"}, `{}`, 10, 10, 60000, "first", nil, 0).Scan(&first))
	require.Equal(t, 10, first)

	// Another type's claim does not wait for it.
	other, err := s.Claim(ctx, []string{"b"}, []byte(`{}`), 5, 5, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, other.Jobs, 5)

	// The same type's claim does.
	got := make(chan ClaimResult, 1)
	failed := make(chan error, 1)
	go func() {
		res, err := s.Claim(ctx, []string{"a"}, []byte(`{}`), 20, 20, time.Minute, "second", nil)
		if err != nil {
			failed <- err
			return
		}
		got <- res
	}()
	// It waits on the first claim's lock: seen by the server, no clock
	// (a claim of this test's schema: other packages' tests share the
	// server).
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.query LIKE '%' || $1 || '%claim_jobs%')`, schema).Scan(&waiting))
		return waiting
	}, 10*time.Second, 10*time.Millisecond, "the second claim of type a does not wait for the first")
	select {
	case res := <-got:
		t.Fatalf("the second claim returned %d jobs while the first was in flight", len(res.Jobs))
	case err := <-failed:
		t.Fatal(err)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case res := <-got:
		require.Len(t, res.Jobs, 10, "the jobs the first claim left")
		require.False(t, res.Skipped)
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("the second claim did not return once the first committed")
	}
}

// TestConcurrentClaimsLeaveClaimedJobsFree: claims of one type running at
// once from several connections never lock a job another claim took, so
// the worker that holds a job finishes it at once. Before version 24 a
// claim whose snapshot predated another claim's commit met that claim's
// jobs, locked them (FOR UPDATE follows a row to its newest version, then
// rechecks it and skips it, keeping the lock until its own commit), and
// their finishes found them busy: under many worker processes, most
// outcomes went to the slow lane (bench/cmd/scale).
func TestConcurrentClaimsLeaveClaimedJobsFree(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	const jobs = 6000
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args)
		SELECT gen_random_uuid(), 'c', '{}' FROM generate_series(1, $1)`, jobs)
	require.NoError(t, err)

	var claimed, busy atomic.Int64
	var mu sync.Mutex
	seen := make(map[[16]byte]bool, jobs)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for {
					res, err := s.Claim(ctx, []string{"c"}, []byte(`{}`), 25, 25, time.Minute, "w", nil)
					if err != nil {
						return err
					}
					if len(res.Jobs) == 0 {
						if res.Skipped {
							continue
						}
						return nil
					}
					fs := make([]Finish, len(res.Jobs))
					mu.Lock()
					for i, c := range res.Jobs {
						if seen[c.ID] {
							mu.Unlock()
							return fmt.Errorf("job %s claimed twice", c.ID)
						}
						seen[c.ID] = true
						fs[i] = Finish{ID: c.ID, Token: c.Token, State: "completed"}
					}
					mu.Unlock()
					claimed.Add(int64(len(fs)))
					out, err := s.Finish(ctx, fs)
					if err != nil {
						return err
					}
					for _, st := range out.Status {
						if st == Busy {
							busy.Add(1)
						}
					}
				}
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, jobs, claimed.Load())
	require.Zero(t, busy.Load(), "finishes that found their job locked by another claim")
}

// TestClaimsUnderAStricterSessionDefault: with the pool's sessions
// defaulting to REPEATABLE READ or SERIALIZABLE (default_transaction_
// isolation, set for a role or database), claims still run at READ
// COMMITTED. Taking turns on the claim lock, a claim at REPEATABLE READ
// read on a snapshot older than the claim it waited for, met that claim's
// jobs and failed with a serialization error (994 of about 1,400 claims
// here before the fix; 108 on version 23, whose claims did not wait).
func TestClaimsUnderAStricterSessionDefault(t *testing.T) {
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(iso, " ", "-"), func(t *testing.T) {
			ctx := context.Background()
			_, pool, schema := newTestStore(t)
			const jobs = 4000
			_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args)
				SELECT gen_random_uuid(), 'c', '{}' FROM generate_series(1, $1)`, jobs)
			require.NoError(t, err)
			cfg, err := pgxpool.ParseConfig(testdb.URL())
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
			cfg.MaxConns = 10
			strict, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer strict.Close()
			s := New(strict, schema)

			var claimed atomic.Int64
			errs := make(chan error, 8)
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for claimed.Load() < jobs {
						res, err := s.Claim(ctx, []string{"c"}, []byte(`{}`), 25, 25, time.Minute, "w", nil)
						if err != nil {
							errs <- err
							return
						}
						claimed.Add(int64(len(res.Jobs)))
						if len(res.Jobs) == 0 && !res.Skipped {
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.EqualValues(t, jobs, claimed.Load())
			var running int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".jobs WHERE state = 'running' AND attempt = 1`).Scan(&running))
			require.Equal(t, jobs, running, "each job claimed once")
		})
	}
}
