package faults_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// TestWaitSurvivesTerminatedConnections: Queue.Wait "blocks until the job
// reaches a terminal state and returns its record, or returns ctx's
// error". Found by TestStress: when the backend of one of Wait's polls was
// terminated, Wait returned that transient error (ErrRetryable) although
// the job was still live and ctx had not ended. It polls again now.
func TestWaitSurvivesTerminatedConnections(t *testing.T) {
	requireFaults(t)
	e := newFEnv(t)
	ctx := context.Background()
	// Poll-only, polling every 50 ms: Wait reads the job from the pool
	// every 50 ms, and no LISTEN connection is involved.
	q := e.queue(e.pool("wait", 4, nil), "wait", backlog.WithPollOnly(), backlog.WithPollInterval(50*time.Millisecond))
	id, err := e.q.Enqueue(ctx, "w.nobody", nil) // no worker: it stays available
	require.NoError(t, err)

	type result struct {
		info *backlog.JobInfo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		info, err := q.Wait(ctx, id)
		done <- result{info, err}
	}()
	eventually(t, 10*time.Second, 10*time.Millisecond, "Wait marked the job", func() bool {
		return e.count(`SELECT count(*) FROM `+e.table("jobs")+` WHERE id = $1 AND notify_done`, id) == 1
	})
	for i := range 10 {
		// Wait's next poll opens a new connection; on a loaded machine it
		// may not be there yet 150 ms after the last termination.
		eventually(t, 10*time.Second, 10*time.Millisecond, "a backend of the waiting queue to terminate", func() bool {
			return e.terminate(e.app("wait")) > 0
		})
		select {
		case r := <-done:
			t.Fatalf("Wait returned while the job was still available and ctx alive (round %d): %v, %v (ErrRetryable: %v)",
				i, r.info, r.err, errors.Is(r.err, backlog.ErrRetryable))
		case <-time.After(150 * time.Millisecond): // a few of Wait's polls
		}
	}
	state, err := e.q.Cancel(ctx, id)
	require.NoError(t, err)
	require.Equal(t, backlog.StateCancelled, state)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Equal(t, backlog.StateCancelled, r.info.State)
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return within 30s of the job's cancellation")
	}
}
