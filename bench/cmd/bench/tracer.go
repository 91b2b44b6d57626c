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
// the start of their text (for -sqlstats). A system whose workers run in
// another process adds that process's own count through remote.
type stmtCounter struct {
	n      atomic.Int64
	byText bool
	mu     sync.Mutex
	texts  map[string]int64
	remote remoteCounter
}

// remoteCounter is a statement count kept by another process (graphile-worker's
// Node process counts the queries of its pg clients).
type remoteCounter interface {
	// statements returns the statements sent so far.
	statements() (int64, error)
	// statementTexts returns the counts by text since the last reset.
	statementTexts() (map[string]int64, error)
	// resetStatementTexts forgets the counts by text.
	resetStatementTexts() error
}

// Load returns the statements sent so far, the remote process's included
// (a remote that does not answer counts as zero, with a warning).
func (c *stmtCounter) Load() int64 {
	n := c.n.Load()
	if c.remote != nil {
		r, err := c.remote.statements()
		if err != nil {
			logf("warning: statement count of the child process: %v", err)
		}
		n += r
	}
	return n
}

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
	if c.remote != nil && c.byText {
		if err := c.remote.resetStatementTexts(); err != nil {
			logf("warning: statement texts of the child process: %v", err)
		}
	}
}

// top returns the most frequent statement texts with their counts; the
// remote process's are marked "(child)".
func (c *stmtCounter) top(n int) []string {
	c.mu.Lock()
	texts := maps.Clone(c.texts)
	c.mu.Unlock()
	if texts == nil {
		texts = map[string]int64{}
	}
	if c.remote != nil {
		rt, err := c.remote.statementTexts()
		if err != nil {
			logf("warning: statement texts of the child process: %v", err)
		}
		for k, v := range rt {
			texts["(child) "+k] += v
		}
	}
	keys := slices.SortedFunc(maps.Keys(texts), func(a, b string) int { return int(texts[b] - texts[a]) })
	var out []string
	for _, k := range keys[:min(n, len(keys))] {
		out = append(out, fmt.Sprintf("%8d  %s", texts[k], k))
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
