package complete

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The completer's back-pressure: claims wait while it holds its limit of
// outcomes, and go on as soon as one is settled.
func TestCompleterBackPressure(t *testing.T) {
	c := New(nil, Config{Lease: time.Minute}, slog.New(slog.DiscardHandler), nil)
	c.held = maxHeldOutcomes
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Admit(ctx), context.DeadlineExceeded)
	done := make(chan error, 1)
	go func() { done <- c.Admit(context.Background()) }()
	c.settle(&Request{}, true)
	require.NoError(t, <-done)
	require.NoError(t, c.Admit(context.Background()))
}
