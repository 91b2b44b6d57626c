package backlog

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// A pause or a tightened limit (drop) that comes while a claim is in
// flight makes that claim give back what it took (its statement may have
// run under the old rules) and claim again: the waiter gets its job from
// the second claim, and what the first took went back.
func TestAcquirerDropMakesAClaimInFlightGiveBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.gates = []chan struct{}{make(chan struct{})}
		st.entered = make(chan string, 10)
		a := newTestAcquirer(t, st)
		first := st.add("a", nil, 0)
		d := spec(t, []string{"a"}, nil)
		ta := startAcquiree(t, a, d)
		<-st.entered // claim 0, in flight: it will take first
		a.drop([]string{"a"})
		close(st.gates[0])
		<-st.entered // claim 1, under the new rules
		synctest.Wait()
		st.mu.Lock()
		released, held := st.released, st.heldBack
		st.mu.Unlock()
		require.Equal(t, []*claimed{first}, released, "the claim in flight gave back what it took")
		require.Equal(t, [][]string{{"a"}}, held, "jobs handed out but not begun were held back")
		require.Equal(t, first.ID, ta.success().ID, "the waiter got the job from the claim made after the drop")
		require.Equal(t, 2, st.callCount())
	})
}

// fillBuffer has four workers take want jobs of d with prefetch on, and
// returns the domain, whose buffer then holds jobs claimed ahead.
func fillBuffer(t *testing.T, a *acquirer, d *domainSpec, want int) *domain {
	t.Helper()
	a.join(d, 4, 1000)
	drainWorkers(t, a, d, 4, want)
	synctest.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	dom := a.domains[d.key]
	require.NotZero(t, dom.pre.Len(), "nothing was prefetched")
	return dom
}

// bufferedTypes counts the buffered jobs of a domain by type.
func bufferedTypes(a *acquirer, dom *domain) map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := map[string]int{}
	for _, j := range dom.pre.Jobs() {
		n[j.Type]++
	}
	return n
}

// A drop gives back the buffered jobs of its types, and only those.
func TestAcquirerDropEmptiesTheBufferOfItsTypes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.delay = 10 * time.Millisecond
		a := newTestAcquirer(t, st)
		for range 3000 {
			st.add("a", nil, 0)
			st.add("b", nil, 0)
		}
		d := spec(t, []string{"a", "b"}, nil)
		dom := fillBuffer(t, a, d, 2000)
		before := bufferedTypes(a, dom)
		require.Positive(t, before["a"])
		require.Positive(t, before["b"])
		a.drop([]string{"a", "other"})
		after := bufferedTypes(a, dom)
		require.Zero(t, after["a"], "a's buffered jobs were kept")
		require.Equal(t, before["b"], after["b"], "b's buffered jobs went back too")
		st.mu.Lock()
		released := len(st.released)
		st.mu.Unlock()
		require.Equal(t, before["a"], released)
		a.leave(d, 4)
	})
}

// A process that holds prefetched jobs reads the flow epoch every
// flowWatch and gives back the jobs of types paused or limited since,
// with no notification at all (poll-only mode, a lost NOTIFY).
func TestAcquirerFlowWatchDropsWithoutANotification(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.delay = 10 * time.Millisecond
		a := newTestAcquirer(t, st)
		st.changeFlow("a") // before the process started: not news
		a.flowBaseline(context.Background())
		for range 3000 {
			st.add("a", nil, 0)
			st.add("b", nil, 0)
		}
		d := spec(t, []string{"a", "b"}, nil)
		dom := fillBuffer(t, a, d, 2000)
		require.Positive(t, bufferedTypes(a, dom)["a"], "a flow change from before the start dropped jobs")
		st.changeFlow("a")
		advance(flowWatch)
		require.Zero(t, bufferedTypes(a, dom)["a"], "a's buffered jobs outlived the flow watch")
		require.Positive(t, bufferedTypes(a, dom)["b"])
		a.leave(d, 4)
	})
}

// A process that holds no prefetched job does not read the flow epoch:
// idle and prefetch-off processes cost the database nothing more.
func TestAcquirerFlowWatchOnlyWhileBuffering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		for range 100 {
			st.add("a", nil, 0)
		}
		d := spec(t, []string{"a"}, nil)
		a.join(d, 4, 0)
		drainWorkers(t, a, d, 4, 100)
		advance(10 * flowWatch)
		st.mu.Lock()
		reads := st.flowReads
		st.mu.Unlock()
		require.Zero(t, reads)
		a.leave(d, 4)
	})
}
