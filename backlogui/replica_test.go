package backlogui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
	"github.com/backlogq/backlog/internal/pgcluster"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestReplicaShown: the header says where the pages read: nothing
// without a read pool, "reads: a primary" for a read pool on a primary,
// and "replica unreachable" (on the error page the failed read gives) for
// one that does not answer. A real standby's lag and pause are shown in
// faults/replica_test.go.
func TestReplicaShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	serve := func(opts ...backlog.Option) (int, string) {
		q, err := backlog.New(ctx, testdb.Pool(t), append([]backlog.Option{backlog.WithSchema(schema), backlog.WithLogger(quiet())}, opts...)...)
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close()) }()
		require.NoError(t, q.Migrate(ctx))
		srv := httptest.NewServer(backlogui.NewHandler(q, backlogui.WithLogger(quiet()), backlogui.WithReadOnly(true)))
		defer srv.Close()
		u := &ui{t: t, srv: srv, client: newClient()}
		return u.get("/")
	}
	status, body := serve()
	require.Equal(t, http.StatusOK, status)
	require.NotContains(t, body, `id="replica"`)

	status, body = serve(backlog.WithReadPool(testdb.Pool(t)))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `id="replica" title="The pages read a separate pool whose server is not a standby`)
	require.Contains(t, body, ">reads: a primary</span>")

	down, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(down.Close)
	status, body = serve(backlog.WithReadPool(down))
	require.NotEqual(t, http.StatusOK, status)
	require.Contains(t, body, ">replica unreachable</span>")
	require.Contains(t, body, "127.0.0.1")
}

// TestActionsReadThePrimary: the reads that decide or confirm a write
// read the primary even when the pages read a standby. A private primary
// and a real streaming hot standby made of it, with replay paused: a job
// enqueued and a limit changed afterwards are not on the standby (the
// jobs list and Limits, which read it, do not show them), yet the bulk
// confirmation counts the job and the bulk action then cancels it, and
// the limit editor's form and review show the limit the primary has.
func TestActionsReadThePrimary(t *testing.T) {
	t.Parallel()
	primary := pgcluster.Start(t, os.Getenv("BACKLOG_CI") == "1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, primary.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	setup, err := backlog.New(ctx, pool, backlog.WithLogger(quiet()))
	require.NoError(t, err)
	require.NoError(t, setup.Migrate(ctx))
	require.NoError(t, setup.SetLimit(ctx, "bulk", backlog.Limit{Concurrency: 2}))
	require.NoError(t, setup.Close())
	// The standby copies the primary as it is now (migrated, concurrency
	// 2), then replays nothing more.
	standby, err := primary.Standby()
	require.NoError(t, err)
	require.NoError(t, standby.PauseReplay(ctx))
	readPool, err := pgxpool.New(ctx, standby.URL())
	require.NoError(t, err)
	t.Cleanup(readPool.Close)
	q, err := backlog.New(ctx, pool, backlog.WithReadPool(readPool), backlog.WithLogger(quiet()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })

	require.NoError(t, q.SetLimit(ctx, "bulk", backlog.Limit{Concurrency: 7}))
	id, err := q.Enqueue(ctx, "bulk", nil)
	require.NoError(t, err)
	page, err := q.List(ctx, backlog.Filter{Types: []string{"bulk"}}, backlog.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Jobs, "the standby has the job: replay is not paused")
	ls, err := q.Limits(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, ls[0].Limit.Concurrency, "the standby has the new limit: replay is not paused")

	srv := httptest.NewServer(backlogui.NewHandler(q, backlogui.WithLogger(quiet())))
	t.Cleanup(srv.Close)
	u := &ui{t: t, q: q, srv: srv, client: newClient()}
	require.Contains(t, u.page("/jobs/confirm?action=cancel&type=bulk"), `<strong id="confirm-count">1</strong>`,
		"the bulk confirmation counted the standby's jobs")
	status, _, body := u.act("/jobs/bulk", url.Values{"action": {"cancel"}, "filter": {"type=bulk"}})
	require.Equal(t, http.StatusSeeOther, status, body)
	info, err := q.Job(backlog.ReadPrimary(ctx), id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, info.State)

	form := u.page("/types/limits?type=bulk")
	require.Contains(t, form, `<strong id="limit-now">concurrency 7</strong>`, "the form shows the standby's limit")
	require.Contains(t, form, `name="concurrency" inputmode="numeric" value="7"`)
	status, _, body = u.act("/types/limits", url.Values{"type": {"bulk"}, "action": {"set"}, "step": {"review"},
		"concurrency": {"3"}, "per": {"1s"}})
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `<strong id="limit-now">concurrency 7</strong>`, "the review shows the standby's limit")
	require.Contains(t, body, `<strong id="limit-new">concurrency 3</strong>`)
}
