package backlog

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
)

// Tests of the extra claim (maybeExtraLocked) with a scripted store: every
// claim blocks until the test replies, so the test plays the database and
// decides what each claim's snapshot saw.
type scriptCall struct {
	k, now    int
	saturated bool // the claim was told the limit binds
	standby   int  // standby jobs it may take
	reply     chan claimResult
}

type scriptStore struct {
	calls    chan scriptCall
	mu       sync.Mutex
	released []*claimed
	fail     error // the next claim replied to fails with it
}

func (s *scriptStore) claim(ctx context.Context, d *domainSpec, k, now int, saturated bool, standby int) (claimResult, error) {
	c := scriptCall{k: k, now: now, saturated: saturated, standby: standby, reply: make(chan claimResult, 1)}
	s.calls <- c
	select {
	case r := <-c.reply:
		s.mu.Lock()
		err := s.fail
		s.fail = nil
		s.mu.Unlock()
		if err != nil {
			return claimResult{}, err
		}
		return r, nil
	case <-ctx.Done():
		return claimResult{}, ctx.Err()
	}
}

func (s *scriptStore) release(jobs []*claimed) {
	s.mu.Lock()
	s.released = append(s.released, jobs...)
	s.mu.Unlock()
}

// releasedJobs returns the jobs given back so far.
func (s *scriptStore) releasedJobs() []*claimed {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*claimed(nil), s.released...)
}

func (s *scriptStore) holdBack([]string) {}

func (s *scriptStore) flowChanges(context.Context, int64) (int64, []string, error) {
	return 0, nil, nil
}

func nextCall(t *testing.T, s *scriptStore) scriptCall {
	t.Helper()
	synctest.Wait()
	select {
	case c := <-s.calls:
		return c
	default:
		t.Fatal("no claim started")
		return scriptCall{}
	}
}

func noCall(t *testing.T, s *scriptStore) {
	t.Helper()
	synctest.Wait()
	select {
	case c := <-s.calls:
		t.Fatalf("unexpected claim k=%d", c.k)
	default:
	}
}

func newScript(t *testing.T) (*scriptStore, *acquirer) {
	s := &scriptStore{calls: make(chan scriptCall, 10)}
	a := newAcquirer(s, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, testPoll, 0, nil)
	t.Cleanup(a.close)
	return s, a
}

func j(typ string) *claimed { return &claimed{Claimed: store.Claimed{ID: uuid.New(), Type: typ}} }

// A posting that lands while both the loop's claim and the extra claim are
// in flight is not lost when the loop ends first.
func TestAcquirerExtraPostingWhileBothInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)               // k=1
		c0.reply <- claimResult{}          // nothing due: short, parked
		a.post(posting.Posting{Type: "a"}) // job A committed
		l1 := nextCall(t, s)               // the loop's claim, k=1
		require.Equal(t, 1, l1.k)
		w2 := startAcquiree(t, a, d)
		synctest.Wait()
		a.post(posting.Posting{Type: "a"}) // job B committed
		e := nextCall(t, s)                // the extra claim, k=2 (w1, w2)
		_ = e.k
		w3 := startAcquiree(t, a, d)
		synctest.Wait()
		a.post(posting.Posting{Type: "a"})                // job C committed, after e's snapshot: pending
		l1.reply <- claimResult{Jobs: []*claimed{j("a")}} // A: full
		synctest.Wait()
		w1.success()
		e.reply <- claimResult{Jobs: []*claimed{j("a")}} // B only (C is newer than e's snapshot)
		synctest.Wait()
		w2.success()
		// C is due and was posted while w3 waits: a claim runs at once.
		c := nextCall(t, s)
		c.reply <- claimResult{Jobs: []*claimed{j("a")}}
		synctest.Wait()
		w3.success()
	})
}

// The loop's claim comes back full and, the extra claim being counted for
// the waiter left, the loop ends with nothing to ask for; the extra claim
// then comes back short. A posting that landed meanwhile makes it look
// again (the loop did not park, and no poll is armed).
func TestAcquirerExtraLoopEndsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		c0.reply <- claimResult{} // short: parked
		a.post(posting.Posting{Type: "a"})
		l1 := nextCall(t, s) // k=1, for w1
		a.post(posting.Posting{Type: "a"})
		e := nextCall(t, s) // the extra claim, k=1
		require.Equal(t, 1, e.k)
		w2 := startAcquiree(t, a, d)
		synctest.Wait()
		a.post(posting.Posting{Type: "a"}) // pending
		l1.reply <- claimResult{Jobs: []*claimed{j("a")}}
		synctest.Wait()
		w1.success()
		noCall(t, s)             // the loop ended: w2 is counted for the extra claim
		e.reply <- claimResult{} // short: what was posted is newer
		c := nextCall(t, s)
		c.reply <- claimResult{Jobs: []*claimed{j("a")}}
		synctest.Wait()
		w2.success()
	})
}

// The extra claim skips a locked job while the loop's claim is in flight:
// the loop looks again (and, skipping it too, again after a short backoff),
// so the job is not left to the backup poll.
func TestAcquirerExtraSkippedWhileLoopRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		c0.reply <- claimResult{}
		a.post(posting.Posting{Type: "a"})
		l1 := nextCall(t, s)
		a.post(posting.Posting{Type: "a"}) // job B committed; B's row locked by another tx
		e := nextCall(t, s)
		e.reply <- claimResult{Skipped: true} // B skipped (locked)
		synctest.Wait()
		l1.reply <- claimResult{} // its snapshot predates B: nothing
		synctest.Wait()
		w1.requireBlocked()
		start := time.Now()
		c := func() scriptCall {
			for {
				select {
				case c := <-s.calls:
					return c
				default:
				}
				advance(10 * time.Millisecond)
			}
		}()
		require.Less(t, time.Since(start), time.Second, "the skipped job was left to the backup poll")
		c.reply <- claimResult{Jobs: []*claimed{j("a")}}
		synctest.Wait()
		w1.success()
	})
}

// Both claims serve the same waiter; the job the second one took goes back
// rather than into the buffer of a domain with prefetch off.
func TestAcquirerExtraSurplusGoesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		a.join(d, 1, 0) // prefetch off
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		c0.reply <- claimResult{}
		a.post(posting.Posting{Type: "a"}) // A
		l1 := nextCall(t, s)
		a.post(posting.Posting{Type: "a"}) // B
		e := nextCall(t, s)
		l1.reply <- claimResult{Jobs: []*claimed{j("a")}}
		synctest.Wait()
		w1.success()
		e.reply <- claimResult{Jobs: []*claimed{j("a")}}
		synctest.Wait()
		a.mu.Lock()
		n := a.domains[d.key].pre.Len()
		a.mu.Unlock()
		require.Zero(t, n, "a leased job sits in the buffer of a domain with prefetch off")
		s.mu.Lock()
		require.Len(t, s.released, 1)
		s.mu.Unlock()
	})
}
