// Package worktest holds helpers shared by the black-box tests of backlog
// and of its fault suite.
package worktest

import (
	"context"
	"sync"
	"testing"
)

// Run runs work (a Queue's Work call) in the background. The returned stop
// cancels it and returns its error; it is safe to call more than once and
// also runs at cleanup (registered now, so before cleanups registered
// earlier, such as closing the queue).
func Run(t testing.TB, work func(ctx context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- work(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
