package backlog_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// The crash test runs a real worker as a child process (this test binary,
// re-executed with childEnv set) and SIGKILLs it mid-job.
const (
	childEnv       = "BACKLOG_TEST_CHILD"
	childSchemaEnv = "BACKLOG_TEST_CHILD_SCHEMA"
)

// childMain works "crash.block" jobs: it prints "started <id>" and blocks
// until killed.
func childMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	q, err := backlog.New(ctx, pool, backlog.WithSchema(os.Getenv(childSchemaEnv)), backlog.WithLease(time.Second),
		backlog.WithWorkerID("child"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	mux := backlog.NewMux()
	mux.HandleFunc("crash.block", func(ctx context.Context, job *backlog.Job) error {
		fmt.Printf("started %s\n", job.ID)
		select {} // until SIGKILL
	})
	err = q.Work(ctx, mux, backlog.Concurrency(1))
	fmt.Fprintln(os.Stderr, "child: Work returned:", err)
	return 1
}

func TestCrashedWorkerJobRunsAgain(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	e := newEnv(t)
	ctx := context.Background()
	id, err := e.q.Enqueue(ctx, "crash.block", nil, backlog.MaxAttempts(3))
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childSchemaEnv+"="+e.schema, "DATABASE_URL="+testdb.URL())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
	}()
	select {
	case l := <-line:
		require.Equal(t, "started "+id.String(), l)
	case <-time.After(30 * time.Second):
		t.Fatal("child never started the job")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	info, err := e.q.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateRunning, info.State)
	require.Equal(t, "child", info.Worker)

	// Another worker takes the job over once the child's lease expired.
	runs := make(chan int, 2)
	q2 := e.queue(e.pool, backlog.WithSweepInterval(100*time.Millisecond))
	mux := backlog.NewMux()
	mux.HandleFunc("crash.block", func(ctx context.Context, job *backlog.Job) error {
		runs <- job.Attempt
		return nil
	})
	work(t, q2, mux)
	info = e.waitState(id, 30*time.Second, backlog.StateCompleted)
	require.Equal(t, 2, <-runs)
	require.Len(t, runs, 0, "the job ran once after the crash")
	require.Equal(t, 2, info.Attempt)
	require.Len(t, info.Errors, 1)
	require.Contains(t, info.Errors[0].Error, "lease expired")
	require.Equal(t, 1, info.Errors[0].Attempt)
}
