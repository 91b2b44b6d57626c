package backlogui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

func TestReplicaText(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		st         backlog.ReadPoolStatus
		text, want string
		warn       bool
	}{
		{backlog.ReadPoolStatus{Configured: true, Standby: true, CaughtUp: true, LastReplayed: at},
			"replica caught up", "2026-01-02T03:04:05Z", false},
		{backlog.ReadPoolStatus{Configured: true, Standby: true, BytesBehind: 4096, Lag: 2 * time.Second, LastReplayed: at},
			"replica 2s behind", "4096 bytes of WAL behind", true},
		{backlog.ReadPoolStatus{Configured: true, Standby: true, BytesBehind: 4096},
			"replica 4096 bytes of WAL behind", "no transaction replayed", true},
		{backlog.ReadPoolStatus{Configured: true, Standby: true, ReplayPaused: true, BytesBehind: 10, Lag: 3 * time.Minute},
			"replica paused, 3m 0s behind", "pg_wal_replay_pause", true},
		{backlog.ReadPoolStatus{Configured: true, CaughtUp: true}, "reads: a primary", "never behind", false},
	} {
		v := replicaText(&tc.st)
		require.NotNil(t, v)
		require.Equal(t, tc.text, v.Text)
		require.Contains(t, v.Title, tc.want)
		require.Equal(t, tc.warn, v.Warn, tc.text)
	}
	require.Nil(t, replicaText(&backlog.ReadPoolStatus{}))
}
