// Package testdb gives tests a real PostgreSQL: a shared pool on
// $DATABASE_URL (set by scripts/with-db.sh, which make test uses) and a
// fresh schema per test, dropped when the test ends.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is used when DATABASE_URL is unset.
const DefaultURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

var (
	mu     sync.Mutex
	shared *pgxpool.Pool
)

// URL returns the test database's connection string.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Ping reports whether the test database answers (within 5 seconds).
func Ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// Pool returns the package's shared pool, opening it on first use.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		cfg, err := pgxpool.ParseConfig(URL())
		if err != nil {
			t.Fatalf("testdb: parsing DATABASE_URL: %v", err)
		}
		cfg.MaxConns = 16
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("testdb: connecting: %v", err)
		}
		shared = p
	}
	return shared
}

// NewPool opens a pool of its own, closed when the test ends.
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return PoolWith(t, maxConns, nil)
}

// PoolWith opens a pool of its own whose sessions have the given settings
// (as an application's pool may), closed when the test ends, after the
// cleanups registered later (a Queue's Close, which releases its
// connections).
func PoolWith(t testing.TB, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("testdb: parsing DATABASE_URL: %v", err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: connecting: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Close closes the shared pool (call it from TestMain before leak checks).
func Close() {
	mu.Lock()
	defer mu.Unlock()
	if shared != nil {
		shared.Close()
		shared = nil
	}
}

// Schema returns a fresh schema name for t and drops the schema (if it was
// created) when the test ends.
func Schema(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + strings.ToLower(hex.EncodeToString(b[:]))
	pool := Pool(t)
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("testdb: dropping schema %s: %v", name, err)
		}
	})
	return name
}
