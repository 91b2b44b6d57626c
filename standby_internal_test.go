package backlog

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testdb"
)

// Tests of the hand-over of a slot to a standby job (standby.go).

// A standby job's token is passed with the ended jobs' until it is handed
// a slot; then the ended job's token is passed instead, and the ended
// job's outcome waits for the claims in flight that read the standby job
// as standby (without that wait, a claim in flight could count neither
// job once the outcome is written, and take the slot a third time).
func TestHandOverHoldsTheOutcomeForClaimsInFlight(t *testing.T) {
	ls := newLeases(nil, quiet(), nil, time.Minute, nil)
	add := func(standby bool) *heldLease {
		return ls.Add([]*store.Claimed{{ID: uuid.New(), Token: uuid.New(), Type: "t", Slot: true, Conc: true, Standby: standby}}, time.Now())[0]
	}
	tokens := func() [][16]byte {
		got, done := ls.Ended([]string{"t"})
		done()
		return got
	}
	has := func(got [][16]byte, le *heldLease) bool { return slices.Contains(got, [16]byte(le.token)) }

	ended, sb, other := add(false), add(true), add(true)
	got := tokens()
	require.True(t, has(got, sb) && has(got, other), "standby jobs hold no slot")
	require.False(t, has(got, ended), "a running handler holds its slot")

	inFlight, done := ls.Ended([]string{"t"}) // a claim in flight read sb as standby
	require.True(t, has(inFlight, sb))
	e := ls.end(ended, sb)
	require.True(t, e.handed)
	require.NotZero(t, e.holdUntil, "a claim in flight read sb as standby")
	got = tokens()
	require.False(t, has(got, sb), "sb holds the slot now")
	require.True(t, has(got, ended), "the ended job does not, for claims from now on")

	later, laterDone := ls.Ended([]string{"t"}) // a claim that started after the hand-over
	require.False(t, has(later, sb))
	sent := make(chan struct{})
	ls.afterReaders(e.holdUntil, func() { close(sent) })
	laterDone()
	select {
	case <-sent:
		t.Fatal("written while a claim that read sb as standby is in flight")
	default:
	}
	done()
	select {
	case <-sent:
	default:
		t.Fatal("not written once that claim ended")
	}

	// No claim in flight: nothing to wait for.
	second := add(false)
	e = ls.end(second, other)
	require.True(t, e.handed)
	require.Zero(t, e.holdUntil)
	written := false
	ls.afterReaders(e.holdUntil, func() { written = true })
	require.True(t, written)

	// An ended job whose lease is lost hands nothing over: its row may no
	// longer stand for the slot.
	lost, next := add(false), add(true)
	ls.mu.Lock()
	ls.loseLocked(lost)
	ls.mu.Unlock()
	e = ls.end(lost, next)
	require.False(t, e.handed)
	require.True(t, has(tokens(), next), "still standby")

	// The outcome of a standby job given back without running leaves
	// ended with its lease.
	next.Forget()
	require.False(t, has(tokens(), next))
}

// standbyJob is a claimed standby job of typ.
func standbyJob(typ string) *claimed {
	c := conc(typ)
	c.Standby = true
	return c
}

// endOften makes d's domain measure 1,000 slot ends a second and claims
// of 4 ms, and wakes it, as a handler's end would.
func endOften(a *acquirer, d *domainSpec) {
	a.mu.Lock()
	defer a.mu.Unlock()
	dom := a.domains[d.key]
	dom.sb.rate, dom.sb.claimDur = 1000, 4*time.Millisecond
	a.wakeLocked(dom)
}

// drainClaims answers every claim the script's acquirer starts with r,
// until none is left.
func drainClaims(s *scriptStore, r claimResult) {
	for {
		synctest.Wait()
		select {
		case c := <-s.calls:
			c.reply <- r
		default:
			return
		}
	}
}

// A domain whose limit binds asks for standby jobs once its handlers end
// often enough, keeps them, hands them out by type with their time in
// standby as queue latency, and gives them back on a pause of their type
// and when its last Work call leaves.
func TestAcquirerKeepsAndGivesBackStandbyJobs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a", "b"}, nil)
		a.join(d, 8, 0)
		idle := claimResult{Saturated: true, Limited: store.LimitedWait}
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		require.Zero(t, c0.standby, "nothing known of the limit yet")
		c0.reply <- claimResult{Jobs: []*claimed{conc("a")}, Saturated: true}
		synctest.Wait()
		w1.success()
		drainClaims(s, idle)

		w2 := startAcquiree(t, a, d)
		c1 := nextCall(t, s)
		require.True(t, c1.saturated)
		require.Zero(t, c1.standby, "no handler has ended yet: none asked for")
		c1.reply <- idle
		synctest.Wait()

		// Handlers end often: the next claim asks for standby jobs.
		endOften(a, d)
		c2 := nextCall(t, s)
		require.Equal(t, 4, c2.standby, "1,000 ends a second, 4 claims of 4 ms, at most half of 8 workers")
		sa, sb, sa2, sb2 := standbyJob("a"), standbyJob("b"), standbyJob("a"), standbyJob("b")
		c2.reply <- claimResult{Jobs: []*claimed{conc("a"), sa, sb, sa2, sb2}, Saturated: true, Limited: store.LimitedWait}
		synctest.Wait()
		w2.success()
		drainClaims(s, idle)

		require.Nil(t, a.takeStandby(d, "c"), "none of that type")
		require.Same(t, sb, a.takeStandby(d, "b"))
		drainClaims(s, idle)
		advance(flowWatch / 2) // the fake clock: less than a flowWatch, or they would go back idle
		drainClaims(s, idle)
		got := a.takeStandby(d, "a")
		require.Same(t, sa, got, "oldest first")
		require.GreaterOrEqual(t, got.Waited, flowWatch/2, "its time in standby is queue latency")
		drainClaims(s, idle)

		a.drop([]string{"b"})
		synctest.Wait()
		require.Contains(t, s.releasedJobs(), sb2, "a pause of b gives b's back")
		require.NotContains(t, s.releasedJobs(), sa2)
		drainClaims(s, idle)

		require.Contains(t, a.leave(d, 8), sa2, "the last Work call takes the rest back")
	})
}

// A claim that finds the limit no longer binding gives the domain's
// standby jobs back: they would wait for slots that claims now take.
func TestAcquirerGivesStandbyBackWhenTheLimitStopsBinding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		a.join(d, 8, 0)
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		c0.reply <- claimResult{Jobs: []*claimed{conc("a")}, Saturated: true}
		synctest.Wait()
		w1.success()
		a.mu.Lock()
		dom := a.domains[d.key]
		dom.sb.rate, dom.sb.claimDur = 1000, 4*time.Millisecond
		a.mu.Unlock()
		w2 := startAcquiree(t, a, d)
		c1 := nextCall(t, s)
		require.Equal(t, 4, c1.standby)
		sa := standbyJob("a")
		c1.reply <- claimResult{Jobs: []*claimed{sa}, Saturated: true, Limited: store.LimitedWait}
		synctest.Wait()
		a.mu.Lock()
		a.wakeLocked(dom) // as a handler's end would
		a.mu.Unlock()
		c2 := nextCall(t, s)
		require.Equal(t, 3, c2.standby, "one held, 3 more")
		c2.reply <- claimResult{Jobs: []*claimed{conc("a")}} // free slots again
		synctest.Wait()
		w2.success()
		require.Contains(t, s.releasedJobs(), sa)
		require.Nil(t, a.takeStandby(d, "a"))
	})
}

// Standby jobs none of which is taken for a flowWatch go back: the
// process may hold no slot to hand them (the limit's slots were all
// another process's when they were claimed), and nothing else would run
// them.
func TestAcquirerGivesIdleStandbyBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a := newScript(t)
		d := spec(t, []string{"a"}, nil)
		a.join(d, 8, 0)
		idle := claimResult{Saturated: true, Limited: store.LimitedWait}
		w1 := startAcquiree(t, a, d)
		c0 := nextCall(t, s)
		c0.reply <- idle // another process holds every slot
		synctest.Wait()
		endOften(a, d)
		c1 := nextCall(t, s)
		sa := standbyJob("a")
		c1.reply <- claimResult{Jobs: []*claimed{sa}, Saturated: true, Limited: store.LimitedWait}
		drainClaims(s, idle)
		require.NotContains(t, s.releasedJobs(), sa)
		for range 3 {
			advance(flowWatch)
			drainClaims(s, idle)
		}
		require.Contains(t, s.releasedJobs(), sa, "not taken for a flowWatch")
		require.Nil(t, a.takeStandby(d, "a"))
		w1.requireCanceled()
	})
}

// One process, then two, each with twice the limit's workers, run 1,000
// jobs of 2 ms under a limit of 6 on a real database: their slots go to
// standby jobs as handlers end (each process within its share), and still
// no more than 6 handlers ever run at once, across the processes, and
// every job runs once. (The hold of leases.end is pinned by
// TestHandOverHoldsTheOutcomeForClaimsInFlight: without it, this test
// failed 2 runs in 5 with three processes sharing a limit of 4 before
// standby jobs were kept within a process's share, 1 in 6 after.)
func TestStandbyJobsKeepTheLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d processes", procs), func(t *testing.T) { standbyKeepsTheLimit(t, procs) })
	}
}

func standbyKeepsTheLimit(t *testing.T, procs int) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	var qs []*Queue
	for range procs {
		q, err := New(ctx, testdb.NewPool(t, 6), WithSchema(schema), WithLogger(quiet()))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, q.Close()) })
		qs = append(qs, q)
	}
	require.NoError(t, qs[0].Migrate(ctx))
	require.NoError(t, qs[0].SetLimit(ctx, "sb", Limit{Concurrency: 6}))
	specs := make([]JobSpec, 1000)
	for i := range specs {
		specs[i] = JobSpec{Type: "sb"}
	}
	_, err := qs[0].EnqueueMany(ctx, specs)
	require.NoError(t, err)
	var running, peak atomic.Int32
	h := HandlerFunc(func(ctx context.Context, _ *Job) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Go(func() { _ = q.Work(wctx, h, Concurrency(12), Types("sb")) })
	}
	defer func() { stop(); wg.Wait() }()
	pool := testdb.Pool(t)
	count := func(where string) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".all_jobs WHERE `+where).Scan(&n))
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for count(`state = 'completed'`) < len(specs) {
		require.True(t, time.Now().Before(deadline), "1,000 jobs within 60 s: %d", count(`state = 'completed'`))
		<-tick.C
	}
	require.Zero(t, count(`attempt <> 1`), "jobs that ran more than once")
	require.LessOrEqual(t, peak.Load(), int32(6), "the limit of 6")
	var handed uint64
	for _, q := range qs {
		handed += q.acq.handOvers.Load()
	}
	require.NotZero(t, handed, "slots went to standby jobs")
	t.Logf("%d of %d jobs ran in a slot handed over", handed, len(specs))
}
