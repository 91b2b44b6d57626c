package backlog

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/internal/store"
)

// posting is the payload of a NOTIFY on the schema's channel. Most announce
// that jobs of a type and tags became available, now or after In; Cancel
// asks the worker holding a job to stop it; Done tells waiters a job has
// finished.
type posting struct {
	Type   string            `json:"type,omitempty"`
	Tags   map[string]string `json:"tags,omitempty"`
	In     int64             `json:"in,omitempty"` // milliseconds until due; 0: due now
	Cancel string            `json:"cancel,omitempty"`
	Done   string            `json:"done,omitempty"`
}

// maxPostingBytes bounds one NOTIFY payload (PostgreSQL refuses payloads of
// 8,000 bytes or more). A posting whose tags would not fit is sent without
// them: it then wakes every domain of its type, a superset of those it
// concerns, which is harmless.
const maxPostingBytes = 7000

// encodePosting returns p's payload, bounded by maxPostingBytes by
// construction: types are at most MaxTypeBytes, and tags are dropped when
// they do not fit.
func encodePosting(p posting) string {
	b, _ := json.Marshal(p) // strings and ints only: cannot fail
	if len(b) > maxPostingBytes {
		p.Tags = nil
		b, _ = json.Marshal(p)
	}
	return string(b)
}

// encodePostings returns one payload per distinct (type, tags), carrying
// the earliest due time among the postings of that pair.
func encodePostings(ps []posting) []string {
	ps = dedupePostings(ps)
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, encodePosting(p))
	}
	return out
}

// dedupePostings keeps one posting per (type, tags), with the earliest due
// time.
func dedupePostings(ps []posting) []posting {
	if len(ps) < 2 {
		return ps
	}
	idx := make(map[string]int, len(ps))
	out := ps[:0:0]
	for _, p := range ps {
		k := postingKey(p.Type, p.Tags)
		if i, ok := idx[k]; ok {
			out[i].In = min(out[i].In, p.In)
			continue
		}
		idx[k] = len(out)
		out = append(out, p)
	}
	return out
}

// postingKey identifies a (type, tags) pair.
func postingKey(typ string, tags map[string]string) string {
	return domainKey([]string{typ}, tags)
}

// postingOf is the posting of one job about to be inserted.
func postingOf(typ string, tags []byte, delay time.Duration, runAt *time.Time) posting {
	p := posting{Type: typ, In: delay.Milliseconds()}
	if runAt != nil {
		p.In = time.Until(*runAt).Milliseconds()
	}
	p.In = max(p.In, 0)
	p.Tags = decodeTags(tags)
	return p
}

// postingsOf are the postings of jobs the store made available.
func postingsOf(avail []store.Avail) []posting {
	out := make([]posting, 0, len(avail))
	for _, a := range avail {
		out = append(out, posting{Type: a.Type, Tags: decodeTags(a.Tags), In: max(a.In.Milliseconds(), 0)})
	}
	return dedupePostings(out)
}

// decodeTags decodes a job's tags for a posting; tags too large for one
// are left out (see maxPostingBytes).
func decodeTags(tags []byte) map[string]string {
	if len(tags) <= 2 || len(tags) > maxPostingBytes { // "{}", or too large to post
		return nil
	}
	var m map[string]string
	if json.Unmarshal(tags, &m) != nil {
		return nil // not ours to judge: a type-only posting still wakes the domain
	}
	return m
}

// announcer is the one way jobs that became available are announced to
// workers: by plain enqueue, EnqueueTx, EnqueueMany, periodic jobs,
// retries, snoozes, releases, the sweep, released dependents and splices.
// The Queue chooses it once, in New: NOTIFY-based, or local-only in
// poll-only mode.
type announcer interface {
	// committed announces jobs whose writes have committed.
	committed(ps []posting)
	// inTx announces jobs written inside tx, a transaction of the caller's:
	// workers hear of them only if and once tx commits.
	inTx(ctx context.Context, tx pgx.Tx, ps []posting) error
	// inline reports whether an insert outside any caller transaction may
	// carry its own NOTIFY (the low-latency path of a quiet process). A
	// true result must be followed by done() once the insert has ended.
	inline() (ok bool, done func())
	service
}

// notifyAnnouncer announces through NOTIFY: inside the caller's
// transaction for EnqueueTx, else through the notifier, which sends
// coalesced postings after the commit.
type notifyAnnouncer struct {
	store *store.Store
	notif *notifier
}

func (a *notifyAnnouncer) committed(ps []posting) { a.notif.post(ps) }

func (a *notifyAnnouncer) inTx(ctx context.Context, tx pgx.Tx, ps []posting) error {
	return a.store.NotifyTx(ctx, tx, encodePostings(ps))
}

func (a *notifyAnnouncer) inline() (bool, func()) {
	if !a.notif.inline() {
		return false, nil
	}
	return true, a.notif.inlineDone
}

func (a *notifyAnnouncer) start() {}
func (a *notifyAnnouncer) stop()  { a.notif.close() }

// localAnnouncer wakes this process's own domains only: in poll-only mode
// no NOTIFY comes back, and other processes find the jobs by their backup
// polls. Jobs written inside a caller's transaction are announced once
// that transaction has committed, which it learns by asking the database
// about the transaction's ID (txid_status) until the answer is final.
type localAnnouncer struct {
	acq   *acquirer
	store *store.Store
	log   *slog.Logger

	mu      sync.Mutex
	pending map[int64][]posting // transaction ID → postings waiting for its commit
	wake    chan struct{}       // buffer of 1
	run     runner
}

func newLocalAnnouncer(acq *acquirer, st *store.Store, log *slog.Logger) *localAnnouncer {
	return &localAnnouncer{acq: acq, store: st, log: log, pending: map[int64][]posting{}, wake: make(chan struct{}, 1)}
}

func (a *localAnnouncer) committed(ps []posting) {
	for _, p := range ps {
		a.acq.post(p)
	}
}

func (a *localAnnouncer) inTx(ctx context.Context, tx pgx.Tx, ps []posting) error {
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
	a.run.start(a.watch)
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

func (a *localAnnouncer) inline() (bool, func()) { return false, nil }

func (a *localAnnouncer) start() {}
func (a *localAnnouncer) stop()  { a.run.stop() }

// watch polls the status of transactions with pending postings, from every
// 2 ms up to every 100 ms while one stays open, until none is pending.
func (a *localAnnouncer) watch(ctx context.Context) {
	b := newBackoff(2*time.Millisecond, 100*time.Millisecond, 0)
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
		if err != nil && ctx.Err() == nil {
			a.log.Warn("backlog: checking transactions for local wake-ups failed", "err", err)
		}
		var ps []posting
		a.mu.Lock()
		for x, committed := range ended {
			if committed {
				ps = append(ps, a.pending[x]...)
			}
			delete(a.pending, x)
		}
		a.mu.Unlock()
		a.committed(dedupePostings(ps))
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
