// Package worktest holds helpers shared by the black-box tests of backlog
// and of its fault suite.
package worktest

import (
	"context"
	"sync"
	"testing"

	"github.com/backlogq/backlog"
)

// Run runs q.Work in the background. The returned stop cancels it and
// returns Work's error; it is safe to call more than once and also runs at
// cleanup (registered now, so before cleanups registered earlier, such as
// closing the queue).
func Run(t testing.TB, q *backlog.Queue, h backlog.Handler, opts ...backlog.WorkOption) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, h, opts...) }()
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
