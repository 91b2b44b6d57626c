package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// encodePostings returns one payload per distinct (type, tags), carrying
// the earliest due time among the postings of that pair.
func encodePostings(ps []posting) []string {
	if len(ps) == 0 {
		return nil
	}
	type agg struct {
		p   posting
		key string
	}
	byKey := map[string]*agg{}
	var order []string
	for _, p := range ps {
		k := postingKey(p.Type, p.Tags)
		if a := byKey[k]; a != nil {
			a.p.In = min(a.p.In, p.In)
			continue
		}
		byKey[k] = &agg{p: p, key: k}
		order = append(order, k)
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		b, _ := json.Marshal(byKey[k].p) // strings and ints only: cannot fail
		out = append(out, string(b))
	}
	return out
}

// postingKey identifies a (type, tags) pair.
func postingKey(typ string, tags map[string]string) string {
	return domainKey([]string{typ}, tags)
}

// coalescer limits the NOTIFY postings this process sends from Enqueue and
// EnqueueMany to one per (type, tags) per interval. A posting that is due
// inside the interval is held back, and one trailing posting per pair is
// sent (outside any writing transaction) when the interval ends, so no job
// waits for the backup poll.
type coalescer struct {
	interval time.Duration
	send     func(ctx context.Context, ps []posting) error
	log      *slog.Logger

	mu       sync.Mutex
	last     map[string]time.Time // when a posting for the pair was last sent
	trailing map[string]posting   // held back, to send when the interval ends
	timer    *time.Timer
	closed   bool
	wg       sync.WaitGroup
}

func newCoalescer(interval time.Duration, log *slog.Logger, send func(context.Context, []posting) error) *coalescer {
	return &coalescer{interval: interval, send: send, log: log, last: map[string]time.Time{}, trailing: map[string]posting{}}
}

// take splits postings into those to send now, inside the inserting
// transaction, and those held back. Held-back postings must be handed to
// defer once the transaction has committed.
func (c *coalescer) take(ps []posting) (now, held []posting) {
	if c == nil || c.interval <= 0 {
		return ps, nil
	}
	t := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		k := postingKey(p.Type, p.Tags)
		if last, ok := c.last[k]; ok && t.Sub(last) < c.interval {
			held = append(held, p)
			continue
		}
		c.last[k] = t
		now = append(now, p)
	}
	return now, held
}

// hold queues postings whose jobs have committed, to send when the current
// interval ends.
func (c *coalescer) hold(ps []posting) {
	if len(ps) == 0 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, p := range ps {
		// Keep the due time absolute while held.
		p.In = now.Add(time.Duration(p.In) * time.Millisecond).UnixMilli()
		k := postingKey(p.Type, p.Tags)
		if q, ok := c.trailing[k]; ok {
			p.In = min(p.In, q.In)
		}
		c.trailing[k] = p
	}
	if c.timer == nil {
		c.wg.Add(1)
		c.timer = time.AfterFunc(c.interval, c.flush)
	}
}

func (c *coalescer) flush() {
	defer c.wg.Done()
	c.mu.Lock()
	ps := make([]posting, 0, len(c.trailing))
	now := time.Now()
	for k, p := range c.trailing {
		p.In = max(p.In-now.UnixMilli(), 0)
		ps = append(ps, p)
		c.last[k] = now
		delete(c.trailing, k)
	}
	c.timer = nil
	c.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].Type < ps[j].Type })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.send(ctx, ps); err != nil {
		c.log.Warn("backlog: sending trailing notifications failed; idle workers fall back to the backup poll", "err", err)
	}
}

// close sends nothing more and waits for a flush in progress.
func (c *coalescer) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.closed = true
	if c.timer != nil && c.timer.Stop() {
		c.wg.Done()
		c.timer = nil
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// listener owns the LISTEN connection. It wakes every domain after each
// (re)connect, hands each posting to the acquirer, and reconnects with
// backoff when the connection fails. While it is down, domains fall back to
// their backup polls and run_at timers.
type listener struct {
	connect  func(context.Context) (*pgx.Conn, error)
	channel  string
	acq      *acquirer
	onCancel func(id uuid.UUID) // a Cancel posting for a job
	onDone   func(id uuid.UUID) // a Done posting for a job
	log      *slog.Logger
	idle     time.Duration // ping the connection after this long without a posting

}

func (l *listener) run(ctx context.Context) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, 0
	for ctx.Err() == nil {
		err := l.session(ctx, b)
		if ctx.Err() != nil {
			return
		}
		wait := b.NextBackOff()
		l.log.Warn("backlog: listener connection lost; reconnecting", "in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session connects, listens and relays postings until the connection fails.
func (l *listener) session(ctx context.Context, b backoff.BackOff) error {
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	b.Reset()
	l.acq.wakeAll()
	for {
		wctx, cancel := context.WithTimeout(ctx, l.idle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed() {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err = conn.Ping(pctx)
				cancel()
				if err == nil {
					continue
				}
			}
			return err
		}
		l.dispatch(n.Payload)
	}
}

func (l *listener) dispatch(payload string) {
	var p posting
	err := json.Unmarshal([]byte(payload), &p)
	switch {
	case err != nil:
	case p.Cancel != "":
		var id uuid.UUID
		if id, err = uuid.Parse(p.Cancel); err == nil {
			l.onCancel(id)
			return
		}
	case p.Done != "":
		var id uuid.UUID
		if id, err = uuid.Parse(p.Done); err == nil {
			l.onDone(id)
			return
		}
	case p.Type != "":
		l.acq.post(p)
		return
	}
	l.log.Warn("backlog: ignoring malformed posting", "payload", payload, "err", err)
}
