package faults_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// startPgBouncer runs scripts/pgbouncer.sh (installing pgbouncer if
// needed) and returns its URL; PgBouncer stops at cleanup. When pgbouncer
// cannot be installed it skips the test, except in CI (BACKLOG_CI=1, set
// by .ci/run), where a scenario that did not run is a failure.
func startPgBouncer(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "scripts", "pgbouncer.sh"))
	require.NoError(t, err)
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testdb.URL())
	cmd.Stderr = prefixWriter{t: t, prefix: ""}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	urlc := make(chan string, 1)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			urlc <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	var url string
	select {
	case url = <-urlc:
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			if os.Getenv(ciEnv) == "1" {
				t.Fatalf("%s=1 (CI) and pgbouncer is not installed and could not be installed (scripts/pgbouncer.sh exit 3): %v", ciEnv, err)
			}
			t.Skipf("pgbouncer is not installed and could not be installed (scripts/pgbouncer.sh exit 3): %v", err)
		}
		t.Fatalf("scripts/pgbouncer.sh failed: %v", err)
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatal("scripts/pgbouncer.sh printed no URL within 5 minutes")
	}
	t.Cleanup(func() {
		_ = stdin.Close() // the script stops pgbouncer and exits
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("scripts/pgbouncer.sh: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("scripts/pgbouncer.sh did not stop within 30s")
		}
	})
	return url
}

// bouncerPool opens a pool through PgBouncer with the given default query
// exec mode.
func (e *fenv) bouncerPool(url, who string, mode pgx.QueryExecMode) *pgxpool.Pool {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(e.t, err)
	cfg.MaxConns = 8
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.RuntimeParams["application_name"] = e.app(who)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(p.Close)
	return p
}

// TestPgBouncerTransactionPooling runs 2,000 jobs exactly once through
// PgBouncer in transaction pooling mode: LISTEN on a direct connection
// (WithListenConn) with the pool in QueryExecModeExec and in
// QueryExecModeCacheDescribe (the two modes docs/operations.md recommends behind
// PgBouncer), and poll-only mode.
//
// pgx's default, QueryExecModeCacheStatement, is not tried: it prepares
// named statements, which PgBouncer 1.18 in transaction pooling cannot keep
// (Migrate fails with 42P05 "prepared statement stmtcache_… already exists"
// as soon as a second connection runs it), and docs/operations.md says to set the
// mode.
func TestPgBouncerTransactionPooling(t *testing.T) {
	requireFaults(t)
	url := startPgBouncer(t)
	t.Logf("PgBouncer at %s", url)

	cases := []struct {
		name     string
		mode     pgx.QueryExecMode
		pollOnly bool
	}{
		{"exec-mode+direct-listen", pgx.QueryExecModeExec, false},
		{"cache-describe-mode+direct-listen", pgx.QueryExecModeCacheDescribe, false},
		{"poll-only+cache-describe-mode", pgx.QueryExecModeCacheDescribe, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const jobs = 2000
			e := newFEnv(t)
			ctx := context.Background()
			pool := e.bouncerPool(url, "pgb", c.mode)
			opts := []backlog.Option{backlog.WithLease(3 * time.Second), backlog.WithSweepInterval(500 * time.Millisecond)}
			if c.pollOnly {
				opts = append(opts, backlog.WithPollOnly(), backlog.WithPollInterval(100*time.Millisecond), backlog.WithPollJitter(20*time.Millisecond))
			} else {
				opts = append(opts, backlog.WithPollInterval(time.Hour), backlog.WithListenConn(func(ctx context.Context) (*pgx.Conn, error) {
					cfg, err := pgx.ParseConfig(testdb.URL())
					if err != nil {
						return nil, err
					}
					cfg.RuntimeParams["application_name"] = e.app("pgb-listen")
					return pgx.ConnectConfig(ctx, cfg)
				}))
			}
			q := e.queue(pool, "pgb", opts...)
			require.NoError(t, q.Migrate(ctx), "Migrate through PgBouncer")
			// docs/operations.md (PgBouncer): "Behind PgBouncer set
			// config.ConnConfig.DefaultQueryExecMode =
			// pgx.QueryExecModeCacheDescribe (or QueryExecModeExec)".
			_, err := q.Enqueue(ctx, "s5.probe", nil)
			require.NoError(t, err, "Enqueue with the pool's DefaultQueryExecMode = %v, as docs/operations.md recommends behind PgBouncer", c.mode)
			_, err = q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "s5.probe"}, {Type: "s5.probe"}})
			require.NoError(t, err, "EnqueueMany with the pool's DefaultQueryExecMode = %v", c.mode)
			_, err = pool.Exec(ctx, `DELETE FROM `+e.table("jobs")+` WHERE type = 's5.probe'`)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `DELETE FROM `+e.table("job_history")+` WHERE type = 's5.probe'`)
			require.NoError(t, err)

			mux := backlog.NewMux()
			mux.HandleFunc("s5.work", func(ctx context.Context, job *backlog.Job) error {
				_, err := e.record(ctx, pool, job, "pgb") // through PgBouncer too
				if err == nil {
					err = job.SetResult(map[string]int{"attempt": job.Attempt})
				}
				return err
			})
			start := time.Now()
			work(t, q, mux, backlog.Concurrency(8))
			// Half in batches, half one by one from 4 goroutines, while
			// the workers run; all through PgBouncer.
			var wg sync.WaitGroup
			wg.Go(func() {
				for b := range jobs / 2 / 100 {
					specs := make([]backlog.JobSpec, 100)
					for k := range specs {
						specs[k] = backlog.JobSpec{Type: "s5.work", Args: map[string]int{"b": b, "k": k}}
					}
					if _, err := q.EnqueueMany(ctx, specs); err != nil {
						t.Errorf("EnqueueMany through PgBouncer: %v", err)
						return
					}
				}
			})
			for g := range 4 {
				wg.Go(func() {
					for i := range jobs / 2 / 4 {
						if _, err := q.Enqueue(ctx, "s5.work", map[string]int{"g": g, "i": i}); err != nil {
							t.Errorf("Enqueue through PgBouncer: %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			e.waitSettled(2 * time.Minute)
			elapsed := time.Since(start)
			// Status reads through PgBouncer as well.
			var one string
			require.NoError(t, pool.QueryRow(ctx, `SELECT id::text FROM `+e.table("all_jobs")+` LIMIT 1`).Scan(&one))
			info, err := q.Job(ctx, backlog.NewID())
			require.ErrorIs(t, err, backlog.ErrNotFound, "%v", info)

			l := e.ledger()
			require.Len(t, l.jobs, jobs)
			l.requireCompletedOnceNoAttemptTwice(t, "s5.work")
			l.requireOneExecutionEach(t, "s5.work")
			for _, j := range l.jobs {
				require.Empty(t, j.Errors, "job %s", j.ID)
			}
			t.Logf("%d jobs through PgBouncer (%s) in %s", jobs, c.name, elapsed.Round(time.Millisecond))
			report(t, summaryRow{
				Scenario:   "5. PgBouncer 1.18 transaction pooling: " + c.name,
				Jobs:       jobs,
				Faults:     "none (compatibility): every statement through PgBouncer, Migrate included",
				Lost:       jobs - l.states["completed"],
				Duplicates: "0",
				Pickup:     fmt.Sprintf("n/a (%d jobs in %s)", jobs, elapsed.Round(time.Millisecond)),
			})
		})
	}
}
