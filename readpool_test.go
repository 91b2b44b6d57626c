package backlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

func TestWithReadPoolNilIsRefused(t *testing.T) {
	t.Parallel()
	_, err := backlog.New(context.Background(), testdb.Pool(t), backlog.WithReadPool(nil))
	var ie *backlog.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "read pool", ie.Field)
	require.ErrorIs(t, err, backlog.ErrInvalid)
}

// TestReadPoolRouting: with a read pool (here one that connects to the
// primary, which is allowed: its reads are never stale), the operator's
// reads run on it and only there (but with a ReadPrimary context: then
// on the primary only), and the writes, Wait and the …Where actions never
// touch it. The standby case is faults/replica_test.go.
func TestReadPoolRouting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	cfg.MaxConns = 2
	reads := &stmtTracer{}
	cfg.ConnConfig.Tracer = reads
	readPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(readPool.Close)
	q := e.queue(e.pool, backlog.WithReadPool(readPool))

	// Writes and Wait: nothing on the read pool.
	r0 := reads.mark()
	id, err := q.Enqueue(ctx, "rp", nil)
	require.NoError(t, err)
	work(t, q, backlog.HandlerFunc(func(context.Context, *backlog.Job) error { return nil }), backlog.Types("rp"))
	info, err := q.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCompleted, info.State)
	_, err = q.Enqueue(ctx, "rq", nil)
	require.NoError(t, err)
	n, err := q.RetryWhere(ctx, backlog.Filter{Types: []string{"rq"}, States: []backlog.State{backlog.StateCompleted}})
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = q.CancelWhere(ctx, backlog.Filter{Types: []string{"rq"}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, q.Pause(ctx, "rp"))
	require.NoError(t, q.SetLimit(ctx, "rp", backlog.Limit{Concurrency: 3}))
	require.Empty(t, reads.since(r0, ""), "writes, Work or Wait ran on the read pool")

	// The reads, by a Queue of their own on a primary pool of its own
	// that runs no Work (so that any statement on that pool is a read
	// gone to the primary): each runs on the read pool, none on the
	// primary's.
	pcfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 2
	primary := &stmtTracer{}
	pcfg.ConnConfig.Tracer = primary
	rpool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(rpool.Close)
	qr := e.queue(rpool, backlog.WithReadPool(readPool))
	operatorReads := []struct {
		name string
		read func(context.Context) error
	}{
		{"Job", func(ctx context.Context) error { _, err := qr.Job(ctx, id); return err }},
		{"List", func(ctx context.Context) error {
			_, err := qr.List(ctx, backlog.Filter{}, backlog.ListOptions{})
			return err
		}},
		{"Graph", func(ctx context.Context) error { _, err := qr.Graph(ctx, id); return err }},
		{"Throughput", func(ctx context.Context) error {
			_, err := qr.Throughput(ctx, time.Now().Add(-time.Hour), time.Minute)
			return err
		}},
		{"Latency", func(ctx context.Context) error { _, err := qr.Latency(ctx, time.Now().Add(-time.Hour)); return err }},
		{"Processes", func(ctx context.Context) error { _, err := qr.Processes(ctx); return err }},
		{"Schedules", func(ctx context.Context) error { _, err := qr.Schedules(ctx); return err }},
		{"Limits", func(ctx context.Context) error { _, err := qr.Limits(ctx); return err }},
		{"Paused", func(ctx context.Context) error { _, err := qr.Paused(ctx); return err }},
		{"Stats", func(ctx context.Context) error { _, err := qr.Stats(ctx); return err }},
	}
	for _, r := range operatorReads {
		if r.name == "Stats" {
			continue // below: it asks the primary one thing
		}
		p, m := primary.mark(), reads.mark()
		require.NoError(t, r.read(ctx), r.name)
		require.NotEmpty(t, reads.since(m, ""), "%s ran nothing on the read pool", r.name)
		require.Empty(t, primary.since(p, ""), "%s read the primary", r.name)
	}
	// Stats: the counts from the read pool, the oldest open transaction
	// from the primary (one statement, on no table of the queue).
	p, m := primary.mark(), reads.mark()
	st, err := qr.Stats(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, reads.since(m, e.schema))
	require.Len(t, primary.since(p, ""), 1)
	require.Empty(t, primary.since(p, e.schema))
	require.Equal(t, int64(1), st.ByState[backlog.StateCompleted])
	require.Equal(t, []string{"rp"}, st.Paused)
	// With ReadPrimary, every one of them reads the primary and nothing
	// on the read pool.
	for _, r := range operatorReads {
		p, m := primary.mark(), reads.mark()
		require.NoError(t, r.read(backlog.ReadPrimary(ctx)), r.name)
		require.NotEmpty(t, primary.since(p, ""), "%s with ReadPrimary ran nothing on the primary", r.name)
		require.Empty(t, reads.since(m, ""), "%s with ReadPrimary read the read pool", r.name)
	}
	info, err = qr.Job(ctx, id)
	require.NoError(t, err, "a read pool on the primary sees every write at once")
	require.Equal(t, backlog.StateCompleted, info.State)

	rs, err := qr.ReadPoolStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, backlog.ReadPoolStatus{Configured: true, CaughtUp: true}, *rs)
	// Without a read pool: nothing configured, no query.
	plain := e.queue(rpool)
	p = primary.mark()
	rs, err = plain.ReadPoolStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, backlog.ReadPoolStatus{}, *rs)
	require.Empty(t, primary.since(p, ""))
	require.NoError(t, qr.Close())
	_, err = qr.ReadPoolStatus(ctx)
	require.ErrorIs(t, err, backlog.ErrClosed)
}
