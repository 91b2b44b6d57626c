package store

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestProcessRow: a process registers, beats alone and with its lease
// renewal (which still renews exactly as Extend does), and unregisters;
// another instance under the same worker ID leaves a live row alone and
// takes over a dead one, which the cleaner would otherwise delete.
func TestProcessRow(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	table := `"` + schema + `".processes`
	row := func(worker string) (instance string, hb time.Time, works string, running, leased int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT instance, heartbeat_at, works::text, running, leased FROM `+table+` WHERE worker = $1`,
			worker).Scan(&instance, &hb, &works, &running, &leased))
		return
	}
	p := Process{Worker: "w", Instance: "i1", Host: "h", PID: 42, Lease: time.Second, Works: json.RawMessage(`[]`)}

	ok, err := s.Beat(ctx, p)
	require.NoError(t, err)
	require.False(t, ok, "no row to beat yet")
	started, ok, err := s.Register(ctx, p)
	require.NoError(t, err)
	require.True(t, ok)
	_, hb0, _, _, _ := row("w")

	// With a lease renewal: the leases are renewed as Extend renews them,
	// and the row is refreshed.
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args) SELECT gen_random_uuid(), 'a', '{}' FROM generate_series(1, 2)`)
	require.NoError(t, err)
	res, err := s.Claim(ctx, []string{"a"}, []byte(`{}`), 2, 2, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, res.Jobs, 2)
	ids := []uuid.UUID{res.Jobs[0].ID, res.Jobs[1].ID}
	tokens := []uuid.UUID{res.Jobs[0].Token, uuid.New()} // the second lease is not ours
	p.Works, p.Running, p.Leased = json.RawMessage(`[{"types":["a"]}]`), 1, 2
	ext, beat, err := s.ExtendBeat(ctx, ids, tokens, time.Minute, p)
	require.NoError(t, err)
	require.True(t, beat)
	require.Equal(t, []Extended{{ID: ids[0], Renewed: true}}, ext)
	inst, hb1, works, running, leased := row("w")
	require.Equal(t, "i1", inst)
	require.True(t, hb1.After(hb0))
	require.JSONEq(t, `[{"types":["a"]}]`, works)
	require.Equal(t, []int{1, 2}, []int{running, leased})

	// Another live instance under the same ID: refused, row untouched.
	other := p
	other.Instance, other.Works = "i2", json.RawMessage(`[{"types":["b"]}]`)
	_, ok, err = s.Register(ctx, other)
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = s.Beat(ctx, other)
	require.NoError(t, err)
	require.False(t, ok)
	_, beat, err = s.ExtendBeat(ctx, nil, nil, time.Minute, other)
	require.NoError(t, err)
	require.False(t, beat)
	inst, _, works, _, _ = row("w")
	require.Equal(t, "i1", inst)
	require.JSONEq(t, `[{"types":["a"]}]`, works)

	// Listed while alive; dead after three leases without a heartbeat.
	list, err := s.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, list[0].StartedAt.Equal(started))
	require.Equal(t, time.Second, list[0].Lease)
	_, err = pool.Exec(ctx, `UPDATE `+table+` SET heartbeat_at = now() - interval '3.1 seconds'`)
	require.NoError(t, err)
	list, err = s.Processes(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	// A dead row is taken over by another instance, keeping nothing of it.
	_, ok, err = s.Register(ctx, other)
	require.NoError(t, err)
	require.True(t, ok)
	inst, _, works, _, _ = row("w")
	require.Equal(t, "i2", inst)
	require.JSONEq(t, `[{"types":["b"]}]`, works)

	// The first instance's unregister leaves the new owner's row alone.
	require.NoError(t, s.Unregister(ctx, "w", "i1"))
	n, err := s.CleanProcesses(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "alive")
	require.NoError(t, s.Unregister(ctx, "w", "i2"))
	list, err = s.Processes(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	// The cleaner deletes dead rows only.
	for _, w := range []string{"dead", "alive"} {
		q := p
		q.Worker = w
		_, ok, err = s.Register(ctx, q)
		require.NoError(t, err)
		require.True(t, ok)
	}
	_, err = pool.Exec(ctx, `UPDATE `+table+` SET heartbeat_at = now() - interval '1 minute' WHERE worker = 'dead'`)
	require.NoError(t, err)
	n, err = s.CleanProcesses(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	list, err = s.Processes(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "alive", list[0].Worker)
}

// TestProcessBeatNeverWaits: a heartbeat that rides with the lease renewal
// skips a process row another transaction holds instead of waiting for it.
func TestProcessBeatNeverWaits(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	p := Process{Worker: "w", Instance: "i", Lease: time.Second, Works: json.RawMessage(`[]`)}
	_, ok, err := s.Register(ctx, p)
	require.NoError(t, err)
	require.True(t, ok)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `UPDATE "`+schema+`".processes SET running = 7`)
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, beat, err := s.ExtendBeat(wctx, nil, nil, time.Minute, p)
	require.NoError(t, err)
	require.False(t, beat)
	ok, err = s.Beat(wctx, p)
	require.NoError(t, err)
	require.False(t, ok)
}
