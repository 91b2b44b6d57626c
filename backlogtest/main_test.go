package backlogtest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/backlogq/backlog/backlogtest"
	"github.com/backlogq/backlog/internal/testdb"
)

// pool is the examples' pool (tests use testdb.Pool).
var pool *pgxpool.Pool

func TestMain(m *testing.M) {
	if err := testdb.Ping(); err != nil {
		msg := "backlogtest tests: no PostgreSQL at $DATABASE_URL (" + err.Error() + "); skipping every test and example. `make test` finds or starts one.\n"
		os.Stderr.WriteString(msg)
		if os.Getenv("BACKLOG_CI") != "" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	if err != nil {
		panic(err)
	}
	cfg.MaxConns = 16
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	code := m.Run()
	t.cleanup()
	pool.Close()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// t stands for the *testing.T of the examples: examples get none, and
// reading `t` there is what an application's test would write. A failure
// panics; cleanups run at the end of TestMain.
var t = &exampleTB{}

type exampleTB struct {
	mu       sync.Mutex
	cleanups []func()
}

func (*exampleTB) Helper()                           {}
func (*exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (*exampleTB) FailNow()                          { panic("FailNow") }
func (e *exampleTB) Cleanup(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

func (e *exampleTB) cleanup() {
	e.mu.Lock()
	fs := e.cleanups
	e.cleanups = nil
	e.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// fakeTB records a failure; FailNow stops the function under test (a
// panic that fails recovers).
type fakeTB struct {
	msgs     []string
	cleanups []func()
}

type failNow struct{}

func (*fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (*fakeTB) FailNow()            { panic(failNow{}) }
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// fails runs fn with a fakeTB and returns the failure message; it fails tt
// when fn did not fail.
func fails(tt *testing.T, fn func(tb backlogtest.TB)) string {
	tt.Helper()
	f := &fakeTB{}
	stopped := func() (stopped bool) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(failNow); !ok {
					panic(r)
				}
				stopped = true
			}
		}()
		fn(f)
		return false
	}()
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	if !stopped || len(f.msgs) == 0 {
		tt.Fatalf("want a failure (FailNow after Errorf), got stopped=%v msgs=%q", stopped, f.msgs)
	}
	return strings.Join(f.msgs, "\n")
}
