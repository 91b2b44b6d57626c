package faults_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/internal/pgcluster"
	"github.com/backlogq/backlog/internal/worktest"
)

// countQueries counts the statements a pool runs (a pgx tracer).
type countQueries struct{ n atomic.Int64 }

func (c *countQueries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countQueries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestReadPoolReadsTheStandby: a private primary and a real streaming hot
// standby made of it (pg_basebackup -R). A Queue with WithReadPool on the
// standby: with replay paused on the standby, a job enqueued on the
// primary is missing from Job, List, Stats and Latency (they read the
// standby), is claimed, run and awaited all the same (Enqueue, Work, Wait
// and CancelWhere never ask the standby: its pool runs no statement
// meanwhile), the same reads with a ReadPrimary context see it (and run
// nothing on the standby), and ReadPoolStatus says replay is paused and
// how far behind; once replay resumes, the reads show the job completed
// and the standby caught up.
func TestReadPoolReadsTheStandby(t *testing.T) {
	requireFaults(t)
	primary := pgcluster.Start(t, os.Getenv(ciEnv) == "1", nil)
	standby, err := primary.Standby()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pool, err := pgxpool.New(ctx, primary.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rcfg, err := pgxpool.ParseConfig(standby.URL())
	require.NoError(t, err)
	reads := &countQueries{}
	rcfg.ConnConfig.Tracer = reads
	readPool, err := pgxpool.NewWithConfig(ctx, rcfg)
	require.NoError(t, err)
	t.Cleanup(readPool.Close)

	q, err := backlog.New(ctx, pool, backlog.WithReadPool(readPool), backlog.WithPollInterval(200*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.NoError(t, q.Migrate(ctx))
	// The read pool really is a standby, and catches up with the migration.
	eventually(t, 30*time.Second, 20*time.Millisecond, "the standby to replay the migration", func() bool {
		st, err := q.ReadPoolStatus(ctx)
		require.NoError(t, err)
		require.True(t, st.Configured)
		require.True(t, st.Standby, "the read pool's server is not in recovery")
		return st.CaughtUp
	})
	_, err = q.Stats(ctx)
	require.NoError(t, err)

	// Pause replay: from now on the standby shows the queue as it is now.
	_, err = readPool.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	eventually(t, 30*time.Second, 20*time.Millisecond, "replay to pause", func() bool {
		var state string
		require.NoError(t, readPool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state))
		return state == "paused"
	})

	before := reads.n.Load()
	id, err := q.Enqueue(ctx, "r", map[string]int{"n": 1})
	require.NoError(t, err)
	ran := make(chan uuid.UUID, 1)
	worktest.Run(t, func(ctx context.Context) error {
		return q.Work(ctx, backlog.HandlerFunc(func(ctx context.Context, j *backlog.Job) error {
			ran <- j.ID
			return nil
		}), backlog.Types("r"), backlog.Concurrency(2))
	})
	info, err := q.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State, "Wait reads the primary")
	require.Equal(t, id, <-ran)
	// The …Where actions select the jobs they act on from the primary.
	_, err = q.Enqueue(ctx, "c", nil)
	require.NoError(t, err)
	n, err := q.CancelWhere(ctx, backlog.Filter{Types: []string{"c"}})
	require.NoError(t, err)
	require.Equal(t, 1, n, "CancelWhere listed the jobs on the standby")
	require.Equal(t, before, reads.n.Load(), "Enqueue, Work, Wait and CancelWhere ran statements on the read pool")

	// The reads come from the paused standby: the job is not there.
	_, err = q.Job(ctx, id)
	require.ErrorIs(t, err, backlog.ErrNotFound, "Job read the primary")
	page, err := q.List(ctx, backlog.Filter{}, backlog.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Jobs, "List read the primary")
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.ByState[backlog.StateCompleted], "Stats read the primary")
	require.Zero(t, st.ByState[backlog.StateCancelled], "Stats read the primary")
	procs, err := q.Processes(ctx)
	require.NoError(t, err)
	require.Empty(t, procs, "Processes read the primary (the Work process registered after the pause)")
	_, err = q.Throughput(ctx, time.Now().Add(-time.Hour), time.Minute)
	require.NoError(t, err)
	_, err = q.Schedules(ctx)
	require.NoError(t, err)
	lat, err := q.Latency(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Empty(t, lat, "Latency read the primary")
	require.Greater(t, reads.n.Load(), before, "the reads ran no statement on the read pool")
	// With ReadPrimary the same reads ask the primary: the job is there.
	primaryCtx := backlog.ReadPrimary(ctx)
	r0 := reads.n.Load()
	info, err = q.Job(primaryCtx, id)
	require.NoError(t, err, "Job with ReadPrimary read the standby")
	require.Equal(t, backlog.StateCompleted, info.State)
	page, err = q.List(primaryCtx, backlog.Filter{Types: []string{"r"}}, backlog.ListOptions{})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1, "List with ReadPrimary read the standby")
	require.Equal(t, id, page.Jobs[0].ID)
	st, err = q.Stats(primaryCtx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.ByState[backlog.StateCompleted], "Stats with ReadPrimary read the standby")
	lat, err = q.Latency(primaryCtx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	i := slices.IndexFunc(lat, func(l backlog.Latency) bool { return l.Type == "r" })
	require.NotEqual(t, -1, i, "Latency with ReadPrimary read the standby")
	require.Equal(t, int64(1), lat[i].Ran)
	require.Equal(t, r0, reads.n.Load(), "the reads with ReadPrimary ran statements on the read pool")
	// A Queue without a read pool sees the job at once.
	direct, err := backlog.New(ctx, pool)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, direct.Close()) })
	info, err = direct.Job(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State)

	rs, err := q.ReadPoolStatus(ctx)
	require.NoError(t, err)
	require.True(t, rs.Standby)
	require.True(t, rs.ReplayPaused)
	require.False(t, rs.CaughtUp)
	require.Positive(t, rs.BytesBehind)
	require.Positive(t, rs.Lag, "the last replayed commit (the migration) is older than now")
	t.Logf("paused: %d bytes behind, lag %s", rs.BytesBehind, rs.Lag)
	// The dashboard says so in its header.
	srv := httptest.NewServer(backlogui.NewHandler(q, backlogui.WithReadOnly(true)))
	defer srv.Close()
	dash := func() string {
		resp, err := http.Get(srv.URL + "/")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		return string(b)
	}
	require.Contains(t, dash(), ">replica paused, ")

	// Resume: the standby replays the job's whole life.
	_, err = readPool.Exec(ctx, `SELECT pg_wal_replay_resume()`)
	require.NoError(t, err)
	eventually(t, 30*time.Second, 20*time.Millisecond, "the job to reach the standby", func() bool {
		info, err := q.Job(ctx, id)
		if errors.Is(err, backlog.ErrNotFound) {
			return false
		}
		require.NoError(t, err)
		return info.State == backlog.StateCompleted
	})
	page, err = q.List(ctx, backlog.Filter{}, backlog.ListOptions{})
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(page.Jobs, func(j *backlog.JobInfo) bool { return j.ID == id }))
	procs, err = q.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, procs, 1)
	eventually(t, 30*time.Second, 20*time.Millisecond, "the standby to catch up", func() bool {
		rs, err := q.ReadPoolStatus(ctx)
		require.NoError(t, err)
		require.False(t, rs.ReplayPaused)
		if rs.CaughtUp {
			require.Zero(t, rs.Lag)
			require.Zero(t, rs.BytesBehind)
		}
		return rs.CaughtUp
	})
	require.Contains(t, dash(), ">replica caught up</span>")

	// An unreachable standby: the reads fail (no fallback to the
	// primary), writes go on.
	require.NoError(t, standby.Stop())
	_, err = q.ReadPoolStatus(ctx)
	require.Error(t, err)
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEqual(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(b), ">replica unreachable</span>")
	_, err = q.Job(ctx, id)
	require.Error(t, err)
	require.NotErrorIs(t, err, backlog.ErrNotFound)
	id2, err := q.Enqueue(ctx, "r", nil)
	require.NoError(t, err)
	info, err = q.Wait(ctx, id2)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State)
}
