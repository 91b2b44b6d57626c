package backlog

import (
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/store"
)

// Tests of the wake-up a job's end gives a domain whose concurrency limit
// binds (slotEnded): its next claim passes the tokens of the jobs whose
// handlers ended (leases.Ended), which hold no slot for this process.

// conc is a claimed job holding a slot of a concurrency limit.
func conc(typ string) *claimed {
	c := j(typ)
	c.Slot, c.Conc = true, true
	return c
}

// A claim that finds the limit binding makes the next claim pass the
// ended jobs' tokens, and a job's end wakes the domain at once: without
// the wake its waiter would wait for the outcome's write or for the
// limited domain's poll (limitedPoll).
func TestAcquirerSlotEndWakesASaturatedDomain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		a.join(d, 2, 0) // a Work call of 2 workers: the domain stays
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		require.False(t, c0.saturated, "nothing known of the limit yet")
		c0.reply <- claimResult{Jobs: []*claimed{conc("a")}, Saturated: true} // the last free slot
		synctest.Wait()
		w1.success()
		require.EqualValues(t, 1, a.saturated.Load(), "one domain's limit binds")

		w2 := startAcquiree(t, a, d)
		c1 := nextCall(t, s)
		require.True(t, c1.saturated, "the limit binds: pass the ended jobs' tokens")
		c1.reply <- claimResult{Limited: store.LimitedWait, Saturated: true} // w1's job still counts
		synctest.Wait()
		w2.requireBlocked()

		a.slotEnded("b") // another type: no claim
		noCall(t, s)
		a.slotEnded("a") // w1's handler ended
		c2 := nextCall(t, s)
		require.True(t, c2.saturated)
		c2.reply <- claimResult{Jobs: []*claimed{conc("a")}, Saturated: true}
		synctest.Wait()
		w2.success()
	})
}

// A handler that ends while a claim is in flight, before the domain knew
// that its limit binds, is not missed: when that claim says the limit
// binds, the domain claims again at once.
func TestAcquirerSlotEndDuringAClaimIsNotMissed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		a.join(d, 2, 0) // a Work call of 2 workers: the domain stays
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		a.slotEnded("a") // a job of another Work call of the process ended
		c0.reply <- claimResult{Limited: store.LimitedWait, Saturated: true}
		c1 := nextCall(t, s)
		require.True(t, c1.saturated)
		c1.reply <- claimResult{Jobs: []*claimed{conc("a")}, Saturated: true}
		synctest.Wait()
		w1.success()
	})
}

// A failed claim clears what the domain knew of its limit: during an
// outage the ends of handlers do not wake it past its error backoff.
func TestAcquirerSlotEndAfterAFailedClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		a.join(d, 2, 0) // a Work call of 2 workers: the domain stays
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		c0.reply <- claimResult{Limited: store.LimitedWait, Saturated: true}
		synctest.Wait()
		a.slotEnded("a")
		c1 := nextCall(t, s)
		s.mu.Lock()
		s.fail = errors.New("connection refused")
		s.mu.Unlock()
		c1.reply <- claimResult{}
		synctest.Wait()
		require.Zero(t, a.saturated.Load())
		a.slotEnded("a")
		noCall(t, s) // the backoff's retry comes later
		advance(claimRetryMax)
		c2 := nextCall(t, s)
		require.False(t, c2.saturated, "unknown again after the failure")
		c2.reply <- claimResult{Jobs: []*claimed{conc("a")}}
		synctest.Wait()
		w1.success()
	})
}
