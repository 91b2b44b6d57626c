package backlogui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
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
