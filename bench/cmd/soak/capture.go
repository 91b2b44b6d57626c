package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// oldTxMessage is the start of the maintenance loop's warning about an old
// transaction (maintenance.go warnOldTransaction).
const oldTxMessage = "backlog: an old transaction holds back the cleanup"

// logEntry is one warning or error the queue logged.
type logEntry struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs map[string]string
}

// logCapture counts the queue's log records and keeps its warnings and
// errors; every record it sees also goes on to next (stderr).
type logCapture struct {
	mu      sync.Mutex
	entries []logEntry
	infos   map[string]int
	oldTx   int // old-transaction warnings so far
	warns   int // other warnings and errors so far
}

func newLogCapture() *logCapture { return &logCapture{infos: map[string]int{}} }

// counts returns the old-transaction warnings and the other warnings and
// errors so far.
func (c *logCapture) counts() (oldTx, other int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.oldTx, c.warns
}

func (c *logCapture) snapshot() ([]logEntry, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	infos := map[string]int{}
	for k, v := range c.infos {
		infos[k] = v
	}
	return append([]logEntry(nil), c.entries...), infos
}

// handler returns the slog.Handler to give the queue.
func (c *logCapture) handler(next slog.Handler) slog.Handler {
	return &captureHandler{c: c, next: next}
}

type captureHandler struct {
	c     *logCapture
	next  slog.Handler
	attrs []slog.Attr
}

func (h *captureHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *captureHandler) Handle(ctx context.Context, r slog.Record) error {
	c := h.c
	c.mu.Lock()
	if r.Level < slog.LevelWarn {
		c.infos[r.Message]++
	} else {
		e := logEntry{at: r.Time, level: r.Level, msg: r.Message, attrs: map[string]string{}}
		for _, a := range h.attrs {
			e.attrs[a.Key] = a.Value.String()
		}
		r.Attrs(func(a slog.Attr) bool {
			e.attrs[a.Key] = a.Value.String()
			return true
		})
		if e.at.IsZero() {
			e.at = time.Now()
		}
		c.entries = append(c.entries, e)
		if strings.HasPrefix(r.Message, oldTxMessage) {
			c.oldTx++
		} else {
			c.warns++
		}
	}
	c.mu.Unlock()
	return h.next.Handle(ctx, r)
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	n.next = h.next.WithAttrs(as)
	return &n
}

func (h *captureHandler) WithGroup(name string) slog.Handler {
	n := *h
	n.next = h.next.WithGroup(name)
	return &n
}

// describe names an entry's session for the report.
func (e logEntry) describe() string {
	return fmt.Sprintf("pid %s, age %s, state %q, application %q", e.attrs["pid"], e.attrs["age"], e.attrs["state"], e.attrs["application"])
}
