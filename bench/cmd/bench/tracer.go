package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// stmtCounter counts the statements a pool sends (queries, each query of a
// batch, COPYs). It is the client-side view of "queries": exact, and blind
// to other sessions on the server. With byText set it also counts them by
// the start of their text (for -sqlstats).
type stmtCounter struct {
	n      atomic.Int64
	byText bool
	mu     sync.Mutex
	texts  map[string]int64
}

func (c *stmtCounter) Load() int64 { return c.n.Load() }

func (c *stmtCounter) count(sql string) {
	c.n.Add(1)
	if !c.byText {
		return
	}
	key := strings.Join(strings.Fields(sql), " ")
	if len(key) > 70 {
		key = key[:70] + "…"
	}
	c.mu.Lock()
	if c.texts == nil {
		c.texts = map[string]int64{}
	}
	c.texts[key]++
	c.mu.Unlock()
}

// resetTexts forgets the counts by text (not the total).
func (c *stmtCounter) resetTexts() {
	c.mu.Lock()
	c.texts = nil
	c.mu.Unlock()
}

// top returns the most frequent statement texts with their counts.
func (c *stmtCounter) top(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(c.texts), func(a, b string) int { return int(c.texts[b] - c.texts[a]) })
	var out []string
	for _, k := range keys[:min(n, len(keys))] {
		out = append(out, fmt.Sprintf("%8d  %s", c.texts[k], k))
	}
	return out
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *stmtCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *stmtCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	c.count("COPY " + d.TableName.Sanitize())
	return ctx
}

func (c *stmtCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
