package backlog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/run"
	"github.com/backlogq/backlog/internal/store"
)

// announcer is the one way jobs that became available are announced to
// workers: by plain enqueue, EnqueueTx, EnqueueMany, periodic jobs,
// retries, snoozes, releases, the sweep, released dependents and splices.
// The Queue chooses it once, in New: NOTIFY-based, or local-only in
// poll-only mode.
type announcer interface {
	// committed announces jobs whose writes have committed.
	committed(ps []posting.Posting)
	// inTx announces jobs written inside tx, a transaction of the caller's:
	// workers hear of them only if and once tx commits.
	inTx(ctx context.Context, tx store.DB, ps []posting.Posting) error
	// carry reports whether an insert outside any caller transaction may
	// carry its own NOTIFY (the low-latency path of a quiet process), and
	// the payloads it sends for ps. A true result must be followed by
	// done() once the insert has ended, and by local(ps) once it committed.
	carry(ps []posting.Posting) (ok bool, payloads []string, done func())
	// local wakes this process's own workers for jobs whose writes have
	// committed (others heard of them already).
	local(ps []posting.Posting)
	service
}

// notifyAnnouncer announces through NOTIFY: inside the caller's
// transaction for EnqueueTx, else through the notifier, which sends
// coalesced postings after the commit. Jobs this process committed wake
// its own workers at once, without waiting for their NOTIFY to come back;
// those postings carry the Queue's src, and its listener ignores them.
type notifyAnnouncer struct {
	store *store.Store
	notif *notifier
	acq   postbox
	src   string
}

func (a *notifyAnnouncer) committed(ps []posting.Posting) {
	a.local(ps)
	a.notif.post(a.signed(ps))
}

func (a *notifyAnnouncer) local(ps []posting.Posting) {
	for _, p := range ps {
		a.acq.post(p)
	}
}

// signed returns ps marked as sent by this Queue.
func (a *notifyAnnouncer) signed(ps []posting.Posting) []posting.Posting {
	out := make([]posting.Posting, len(ps))
	for i, p := range ps {
		p.Src = a.src
		out[i] = p
	}
	return out
}

func (a *notifyAnnouncer) inTx(ctx context.Context, tx store.DB, ps []posting.Posting) error {
	return a.store.NotifyTx(ctx, tx, posting.EncodeAll(ps))
}

func (a *notifyAnnouncer) carry(ps []posting.Posting) (bool, []string, func()) {
	if !a.notif.mayCarry() {
		return false, nil, nil
	}
	return true, posting.EncodeAll(a.signed(ps)), a.notif.carryDone
}

func (a *notifyAnnouncer) stop() { a.notif.close() }

// localAnnouncer wakes this process's own domains only: in poll-only mode
// no NOTIFY comes back, and other processes find the jobs by their backup
// polls. Jobs written inside a caller's transaction are announced once
// that transaction has committed, which it learns by asking the database
// about the transaction's ID (txid_status) until the answer is final.
type localAnnouncer struct {
	acq    postbox
	store  *store.Store
	log    *slog.Logger
	faults *outage.Tracker

	mu      sync.Mutex
	pending map[int64][]posting.Posting // transaction ID → postings waiting for its commit
	wake    chan struct{}               // buffer of 1
	group   run.Group
}

func newLocalAnnouncer(acq postbox, st *store.Store, log *slog.Logger, faults *outage.Tracker) *localAnnouncer {
	return &localAnnouncer{acq: acq, store: st, log: log, faults: faults, pending: map[int64][]posting.Posting{}, wake: make(chan struct{}, 1)}
}

func (a *localAnnouncer) committed(ps []posting.Posting) { a.local(ps) }

func (a *localAnnouncer) local(ps []posting.Posting) {
	for _, p := range ps {
		a.acq.post(p)
	}
}

func (a *localAnnouncer) inTx(ctx context.Context, tx store.DB, ps []posting.Posting) error {
	if len(ps) == 0 {
		return nil
	}
	xid, err := a.store.TxID(ctx, tx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.pending[xid] = append(a.pending[xid], ps...)
	a.mu.Unlock()
	a.group.Start(a.watch)
	run.Wake(a.wake)
	return nil
}

func (a *localAnnouncer) carry([]posting.Posting) (bool, []string, func()) { return false, nil, nil }

func (a *localAnnouncer) stop() { a.group.Stop(0) }

// watch polls the status of transactions with pending postings, from every
// 2 ms up to every 100 ms while one stays open, until none is pending.
func (a *localAnnouncer) watch(ctx context.Context) {
	b := run.NewBackoff(2*time.Millisecond, 100*time.Millisecond)
	for {
		a.mu.Lock()
		xids := make([]int64, 0, len(a.pending))
		for x := range a.pending {
			xids = append(xids, x)
		}
		a.mu.Unlock()
		if len(xids) == 0 {
			b.Reset()
			select {
			case <-ctx.Done():
				return
			case <-a.wake:
				continue
			}
		}
		ended, err := a.store.TxEnded(ctx, xids)
		if err != nil && ctx.Err() == nil && !a.faults.Failed("local wake-ups", err) {
			a.log.Warn("backlog: checking transactions for local wake-ups failed", "err", err)
		} else if err == nil {
			a.faults.OK("local wake-ups")
		}
		var ps []posting.Posting
		a.mu.Lock()
		for x, committed := range ended {
			if committed {
				ps = append(ps, a.pending[x]...)
			}
			delete(a.pending, x)
		}
		a.mu.Unlock()
		a.committed(posting.Dedupe(ps))
		if len(ended) > 0 {
			b.Reset()
		}
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.wake:
			t.Stop()
		case <-t.C:
		}
	}
}
