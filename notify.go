package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/internal/isolate"
	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// notifier announces jobs that this process's own transactions committed
// (Enqueue, EnqueueMany, periodic jobs, retries, released dependents). A
// NOTIFY inside an inserting transaction holds PostgreSQL's database-wide
// notification lock through that transaction's commit (and its fsync),
// serialising every notifying commit: measured here, 16 clients inserting
// one job per transaction managed 3,700 inserts/s with a NOTIFY in each
// against 11,300/s without. So at most one insert of a process carries its
// own NOTIFY at a time, and only while nothing else is being announced (the
// low-latency path when the queue is quiet); every other insert commits
// without one, and the notifier announces it afterwards from a transaction
// of its own that commits asynchronously (nothing in it needs to be
// durable), holding the lock for microseconds.
//
// Postings are coalesced: one NOTIFY transaction at a time, carrying one
// posting per (type, tags) for everything committed while the previous one
// was in flight, and at most one per interval (WithNotifyInterval); postings
// held back go out in one trailing NOTIFY when the interval ends, so no job
// waits for the backup poll. A payload the server refuses is dropped alone
// (postings are hints: the backup poll finds the job), never with the rest.
type notifier struct {
	interval time.Duration
	store    *store.Store
	log      *slog.Logger
	faults   *outage.Tracker

	mu       sync.Mutex
	pending  map[string]posting.Posting // due time in In as Unix milliseconds while pending
	order    []string
	running  bool // a sender goroutine is active
	carrying bool // an insert carries its own NOTIFY right now
	closed   bool
	flushBy  time.Time     // once closed: when sending what is left gives up
	group    run.Group     // the sender goroutine
	stopCh   chan struct{} // closed by close: the interval is not waited out
}

func newNotifier(interval time.Duration, log *slog.Logger, faults *outage.Tracker, st *store.Store) *notifier {
	return &notifier{interval: interval, store: st, log: log, faults: faults, pending: map[string]posting.Posting{}, stopCh: make(chan struct{})}
}

// mayCarry reports whether an insert may carry its own NOTIFY: only when no
// other notifying transaction of this process is in flight (the sender or
// another insert that carries its own) and nothing waits to be sent, so at most two
// notifying commits of a process ever queue for PostgreSQL's notification
// lock. A true result must be followed by carryDone.
func (n *notifier) mayCarry() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.running || n.carrying || len(n.pending) > 0 || n.interval > 0 {
		return false
	}
	n.carrying = true
	return true
}

// carryDone ends a carried notification (committed or not).
func (n *notifier) carryDone() {
	n.mu.Lock()
	n.carrying = false
	n.mu.Unlock()
}

// post queues postings of committed jobs and makes sure a sender runs.
func (n *notifier) post(ps []posting.Posting) {
	if len(ps) == 0 {
		return
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	for _, p := range ps {
		p.In = now.Add(time.Duration(p.In) * time.Millisecond).UnixMilli()
		k := p.Key()
		if q, ok := n.pending[k]; ok {
			p.In = min(p.In, q.In)
		} else {
			n.order = append(n.order, k)
		}
		n.pending[k] = p
	}
	if !n.running {
		n.running = true
		n.group.Go(n.loop)
	}
}

// closeNotifyWait bounds how long Close spends sending the postings the
// notifier still holds (a server that does not answer must not hold up
// Close): workers of other processes would otherwise wait for their
// backup poll to find the jobs.
const closeNotifyWait = 5 * time.Second

// loop sends pending postings until none are left, one NOTIFY transaction
// at a time and at most one per interval; once the notifier is closing,
// at once, until closeNotifyWait after close.
func (n *notifier) loop(ctx context.Context) {
	for {
		n.mu.Lock()
		if len(n.pending) == 0 || n.closed && time.Now().After(n.flushBy) {
			n.running = false
			n.mu.Unlock()
			return
		}
		closing, flushBy := n.closed, n.flushBy
		now := time.Now().UnixMilli()
		ps := make([]posting.Posting, 0, len(n.order))
		for _, k := range n.order {
			p := n.pending[k]
			p.In = max(p.In-now, 0)
			ps = append(ps, p)
		}
		n.pending, n.order = map[string]posting.Posting{}, nil
		n.mu.Unlock()

		deadline := time.Now().Add(10 * time.Second)
		if closing {
			deadline = flushBy
		}
		sctx, cancel := context.WithDeadline(ctx, deadline)
		n.send(sctx, posting.EncodeAll(ps))
		cancel()
		if n.interval > 0 {
			t := time.NewTimer(n.interval)
			select {
			case <-t.C:
			case <-n.stopCh:
				t.Stop()
			}
		}
	}
}

// send sends payloads in one statement, splitting it when the server
// refuses one payload, which is then dropped with a warning.
func (n *notifier) send(ctx context.Context, payloads []string) {
	w := isolate.Writer[string]{
		Write: func(ctx context.Context, ps []string) error { return n.store.Notify(ctx, ps) },
		Poison: func(_ context.Context, p string, cause error) error {
			n.log.Warn("backlog: dropping a posting the server refused; idle workers fall back to the backup poll", "payload", p, "err", cause)
			return nil
		},
	}
	// Transient failures are tried again while the send's context lasts.
	b := run.NewBackoff(20*time.Millisecond, time.Second)
	for {
		rest, err := w.Run(ctx, payloads)
		if err == nil {
			n.faults.OK("notifications")
			return
		}
		// During an outage the outage's own lines say it (an idle worker
		// finds what was not announced by its backup poll).
		counted := n.faults.Failed("notifications", err)
		wait := b.NextBackOff()
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < wait {
			if !counted {
				n.log.Warn("backlog: sending notifications failed; idle workers fall back to the backup poll", "err", err)
			}
			return
		}
		payloads = rest
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if !counted {
				n.log.Warn("backlog: sending notifications failed; idle workers fall back to the backup poll", "err", err)
			}
			return
		}
	}
}

// close takes no more postings, sends those it holds (without waiting out
// the interval, within closeNotifyWait) and waits for the sender.
func (n *notifier) close() {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		n.flushBy = time.Now().Add(closeNotifyWait)
		close(n.stopCh)
	}
	n.mu.Unlock()
	n.group.Stop(closeNotifyWait)
}

// postbox is where a Queue delivers the postings meant for its own
// workers (the acquirer): post wakes the domains a posting matches,
// wakeAll every domain (after a reconnect, when postings may have been
// missed). The announcers and the listener deliver through it.
type postbox interface {
	post(p posting.Posting)
	wakeAll()
}

// listener owns the LISTEN connection. It wakes every domain after each
// (re)connect, hands each posting to the acquirer, and reconnects with
// backoff when the connection fails. While it is down, domains fall back to
// their backup polls and run_at timers.
type listener struct {
	group    run.Group
	connect  func(context.Context) (*pgx.Conn, error)
	channel  string
	acq      postbox
	onCancel func(id uuid.UUID) // a Cancel posting for a job
	onDone   func(id uuid.UUID) // a Done posting for a job
	self     string             // this Queue's src: its own postings are ignored
	log      *slog.Logger
	faults   *outage.Tracker
	idle     time.Duration // ping the connection after this long without a posting
}

func newListener(connect func(context.Context) (*pgx.Conn, error), pool *pgxpool.Pool, channel, self string, acq postbox,
	onCancel, onDone func(uuid.UUID), log *slog.Logger, faults *outage.Tracker) *listener {
	if connect == nil {
		connect = func(ctx context.Context) (*pgx.Conn, error) {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return c.Hijack(), nil
		}
	}
	return &listener{connect: connect, channel: channel, self: self, acq: acq, onCancel: onCancel, onDone: onDone, log: log, faults: faults, idle: 30 * time.Second}
}

// start starts the listener's loop; a nil listener (poll-only mode) has
// none.
func (l *listener) start() {
	if l != nil {
		l.group.Start(l.loop)
	}
}
func (l *listener) stop() { l.group.Stop(0) }

// listenRetryMax bounds the listener's reconnect backoff (jittered by
// ±50 %). The reconnect wakes every domain, which cuts short the claims'
// own error backoff (up to 5 s): after a failover the queue comes back
// within about a second of a primary taking connections. With a 5 s bound,
// workers stayed idle up to 7.5 s after the new primary took writes
// (TestHAFailover: first claim 3.6 s after the first acknowledged
// enqueue). One connection attempt a second per process while the
// database is away costs nothing worth saving.
const listenRetryMax = time.Second

func (l *listener) loop(ctx context.Context) {
	b := run.NewBackoff(100*time.Millisecond, listenRetryMax)
	for ctx.Err() == nil {
		var up time.Time
		err := l.session(ctx, &up)
		if ctx.Err() != nil {
			return
		}
		// The backoff starts over only after a session that lasted: a
		// server that takes the connection and LISTEN and then drops it
		// (flapping, or a proxy in front of a dead primary) would
		// otherwise get a reconnect, and a wake of every domain (each a
		// claim), ten times a second.
		if !up.IsZero() && time.Since(up) >= listenStable {
			b.Reset()
		}
		wait := b.NextBackOff()
		if !l.faults.Failed("listener", err) {
			l.log.Warn("backlog: listener connection lost; reconnecting", "in", wait, "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// listenStable is how long a LISTEN session must last for the reconnect
// backoff to start over when it ends.
const listenStable = listenRetryMax

// session connects, listens and relays postings until the connection
// fails; up is set when LISTEN succeeded.
func (l *listener) session(ctx context.Context, up *time.Time) error {
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	*up = time.Now()
	l.faults.OK("listener")
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
	var p posting.Posting
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
	case p.Src != "" && p.Src == l.self:
		return // this Queue woke its own workers when it committed the jobs
	case p.Type != "" || p.Sched || len(p.Hold) > 0:
		l.acq.post(p)
		return
	}
	l.log.Warn("backlog: ignoring malformed posting", "payload", payload, "err", err)
}
