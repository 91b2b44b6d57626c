package run

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Start runs its main function once; Stop cancels it and waits for it.
func TestStartOnceStopWaits(t *testing.T) {
	var g Group
	var runs atomic.Int32
	var ended atomic.Bool
	main := func(ctx context.Context) {
		runs.Add(1)
		<-ctx.Done()
		ended.Store(true)
	}
	require.True(t, g.Start(main))
	require.False(t, g.Start(main))
	g.Stop(0)
	require.True(t, ended.Load(), "Stop returned before the goroutine did")
	require.Equal(t, int32(1), runs.Load())
	require.False(t, g.Start(main), "a stopped group started again")
	require.False(t, g.Go(main), "Go after Stop returned")
	require.Nil(t, g.AfterFunc(time.Millisecond, func() {}))
	g.Stop(0) // idempotent
}

// Within the grace period a goroutine ends on its own, its context not
// cancelled; one that does not is cancelled once it is over.
func TestStopGrace(t *testing.T) {
	var g Group
	release := make(chan struct{})
	var cancelledEarly atomic.Bool
	g.Go(func(ctx context.Context) {
		<-release
		cancelledEarly.Store(ctx.Err() != nil)
	})
	var cancelledLate atomic.Bool
	g.Go(func(ctx context.Context) {
		<-ctx.Done()
		cancelledLate.Store(true)
	})
	stopped := make(chan struct{})
	go func() {
		g.Stop(time.Hour)
		close(stopped)
	}()
	// The first goroutine returns on its own: Stop still waits for the
	// second, which only the context's end releases, an hour on.
	close(release)
	select {
	case <-stopped:
		t.Fatal("Stop returned before the grace period ended or every goroutine returned")
	case <-time.After(50 * time.Millisecond):
	}
	require.False(t, cancelledLate.Load())
	g.mu.Lock()
	cancel := g.cancel
	g.mu.Unlock()
	cancel() // as the end of the grace period would
	<-stopped
	require.False(t, cancelledEarly.Load(), "cancelled within the grace period")
	require.True(t, cancelledLate.Load())
}

// Stop stops callbacks not yet due: they never run, and Stop does not wait
// for them; a Timer stopped by hand does not run either.
func TestAfterFunc(t *testing.T) {
	var g Group
	ran := make(chan struct{})
	g.AfterFunc(time.Millisecond, func() { close(ran) })
	<-ran
	var late atomic.Bool
	tm := g.AfterFunc(time.Hour, func() { late.Store(true) })
	require.NotNil(t, tm)
	byHand := g.AfterFunc(time.Hour, func() { late.Store(true) })
	require.True(t, byHand.Stop())
	require.False(t, byHand.Stop())
	g.Stop(0)
	require.False(t, tm.Stop(), "Stop left a callback pending")
	require.False(t, late.Load())
}
