package backlog

import (
	"context"
	"errors"
	"fmt"
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

// fakeStore is a scripted claim store in the spirit of Coder's acquirer
// tests: an in-memory table of jobs, overlap detection per domain, an
// optional gate that holds claims until the test lets them go, and
// injectable errors.
type fakeStore struct {
	mu        sync.Mutex
	jobs      []*fakeJob
	locked    []*fakeJob     // held by "another transaction": claims skip them
	inFlight  map[string]int // claims in flight per domain: at most 2 (the loop's and an extra one)
	overlap   []string
	calls     []fakeCall
	released  []*claimed
	errs      []error         // returned by the next claims, in order
	gate      chan struct{}   // when set, each claim waits for one receive
	gates     []chan struct{} // when set, the claim entering n-th waits for gates[n] to close (if any)
	entries   int
	entered   chan string   // when set, each claim reports its domain on entry
	delay     time.Duration // each claim takes this long (fake time)
	heldBack  [][]string    // holdBack calls
	flow      map[string]int64
	flowEpoch int64
	flowReads int
}

type fakeJob struct {
	job   *claimed
	dueAt time.Time
}

type fakeCall struct {
	key     string
	k, took int
}

func newFakeStore() *fakeStore { return &fakeStore{inFlight: map[string]int{}} }

func (f *fakeStore) add(typ string, tags map[string]string, in time.Duration) *claimed {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := &claimed{Claimed: store.Claimed{ID: uuid.New(), Type: typ, Tags: tags}}
	f.jobs = append(f.jobs, &fakeJob{job: j, dueAt: time.Now().Add(in)})
	return j
}

func (f *fakeStore) claim(ctx context.Context, d *domainSpec, k, _ int, _ bool, _ int) (claimResult, error) {
	f.mu.Lock()
	if f.inFlight[d.key] >= 2 {
		f.overlap = append(f.overlap, d.key)
	}
	f.inFlight[d.key]++
	gate, entered := f.gate, f.entered
	var nth chan struct{}
	if f.entries < len(f.gates) {
		nth = f.gates[f.entries]
	}
	f.entries++
	f.mu.Unlock()
	if entered != nil {
		entered <- d.key
	}
	if nth != nil {
		select {
		case <-nth:
		case <-ctx.Done():
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	if f.delay > 0 {
		<-time.After(f.delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() { f.inFlight[d.key]-- }()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.calls = append(f.calls, fakeCall{key: d.key, k: k})
		return claimResult{}, err
	}
	now := time.Now()
	var took []*claimed
	rest := f.jobs[:0:0]
	for _, fj := range f.jobs {
		if !d.matches(fj.job.Type, fj.job.Tags) {
			rest = append(rest, fj)
			continue
		}
		if fj.dueAt.After(now) { // scheduled: not claimable yet
			rest = append(rest, fj)
			continue
		}
		if len(took) < k {
			took = append(took, fj.job)
			continue
		}
		rest = append(rest, fj)
	}
	f.jobs = rest
	f.calls = append(f.calls, fakeCall{key: d.key, k: k, took: len(took)})
	skipped := false
	if len(took) < k && len(f.locked) > 0 {
		for _, fj := range f.locked {
			skipped = skipped || (d.matches(fj.job.Type, fj.job.Tags) && !fj.dueAt.After(now))
		}
	}
	return claimResult{Jobs: took, Skipped: skipped}, nil
}

// lock holds a job as another transaction would: claims skip it.
func (f *fakeStore) lock(j *claimed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, fj := range f.jobs {
		if fj.job == j {
			f.locked = append(f.locked, fj)
			f.jobs = append(f.jobs[:i:i], f.jobs[i+1:]...)
			return
		}
	}
}

// unlock releases a job held with lock.
func (f *fakeStore) unlock(j *claimed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, fj := range f.locked {
		if fj.job == j {
			f.jobs = append(f.jobs, fj)
			f.locked = append(f.locked[:i:i], f.locked[i+1:]...)
			return
		}
	}
}

func (f *fakeStore) release(jobs []*claimed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, jobs...)
	for _, j := range jobs {
		f.jobs = append(f.jobs, &fakeJob{job: j, dueAt: time.Now()})
	}
}

// holdBack records the types the acquirer held back.
func (f *fakeStore) holdBack(types []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heldBack = append(f.heldBack, types)
}

// flowChanges answers from the scripted flow epochs (changeFlow).
func (f *fakeStore) flowChanges(_ context.Context, since int64) (int64, []string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flowReads++
	var types []string
	for t, e := range f.flow {
		if e > since {
			types = append(types, t)
		}
	}
	return f.flowEpoch, types, nil
}

// changeFlow records a pause or a tightened limit of typ under a new flow
// epoch, as SetLimit and Pause do in the database (no notification).
func (f *fakeStore) changeFlow(typ string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flowEpoch++
	if f.flow == nil {
		f.flow = map[string]int64{}
	}
	f.flow[typ] = f.flowEpoch
}

func (f *fakeStore) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeStore) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.overlap, "more than two claims of one domain overlapped")
}

const testPoll = 30 * time.Second

// advance moves the synctest bubble's fake clock forward by d (timers due
// meanwhile fire in order) and returns once every goroutine of the bubble is
// blocked again. Inside a bubble nothing real is waited for.
func advance(d time.Duration) {
	<-time.After(d)
	synctest.Wait()
}

func newTestAcquirer(t *testing.T, st *fakeStore) *acquirer {
	a := newAcquirer(st, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, testPoll, 0, nil)
	t.Cleanup(func() {
		a.close()
		st.check(t)
	})
	return a
}

func spec(t *testing.T, types []string, tags map[string]string) *domainSpec {
	d, err := newDomainSpec(types, tags)
	require.NoError(t, err)
	return d
}

// testAcquiree runs one acquire in the background.
type testAcquiree struct {
	t      *testing.T
	cancel context.CancelFunc
	res    chan handout
}

func startAcquiree(t *testing.T, a *acquirer, d *domainSpec) *testAcquiree {
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAcquiree{t: t, cancel: cancel, res: make(chan handout, 1)}
	go func() {
		j, err := a.acquire(ctx, d)
		ta.res <- handout{job: j, err: err}
	}()
	return ta
}

// success requires a job now (call after synctest.Wait).
func (ta *testAcquiree) success() *claimed {
	ta.t.Helper()
	select {
	case r := <-ta.res:
		require.NoError(ta.t, r.err)
		require.NotNil(ta.t, r.job)
		ta.cancel()
		return r.job
	default:
		ta.t.Fatal("waiting worker got no job")
		return nil
	}
}

func (ta *testAcquiree) requireBlocked() {
	ta.t.Helper()
	select {
	case r := <-ta.res:
		ta.t.Fatalf("waiting worker should be blocked, got job %v err %v", r.job, r.err)
	default:
	}
}

// requireHandedAfterCancel requires the answer to a waiting worker cancelled
// during a claim that handed it a job: the job, with context.Canceled.
func (ta *testAcquiree) requireHandedAfterCancel() *claimed {
	ta.t.Helper()
	select {
	case r := <-ta.res:
		require.ErrorIs(ta.t, r.err, context.Canceled)
		require.NotNil(ta.t, r.job)
		return r.job
	default:
		ta.t.Fatal("waiting worker was not answered")
		return nil
	}
}

func (ta *testAcquiree) requireCanceled() {
	ta.t.Helper()
	ta.cancel()
	r := <-ta.res
	require.ErrorIs(ta.t, r.err, context.Canceled)
	require.Nil(ta.t, r.job)
}

func TestAcquirerSingleAcquiree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		want := st.add("a", nil, 0)
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		require.Equal(t, want.ID, ta.success().ID)
		require.Equal(t, 1, st.callCount())
	})
}

func TestAcquirerTenAcquireesOneDomainBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.gate = make(chan struct{})
		st.entered = make(chan string, 100)
		a := newTestAcquirer(t, st)
		d := spec(t, []string{"a"}, nil)
		for range 10 {
			st.add("a", nil, 0)
		}
		// The first waiting worker starts a claim (k=1) that the gate holds; the
		// other nine queue up behind it and are served by one claim (k=9).
		first := startAcquiree(t, a, d)
		<-st.entered
		var rest []*testAcquiree
		for range 9 {
			rest = append(rest, startAcquiree(t, a, d))
		}
		synctest.Wait()
		require.Len(t, st.entered, 0, "only one claim per domain at a time")
		st.gate <- struct{}{}
		<-st.entered
		st.gate <- struct{}{}
		synctest.Wait()
		seen := map[uuid.UUID]bool{first.success().ID: true}
		for _, ta := range rest {
			id := ta.success().ID
			require.False(t, seen[id], "a job handed out twice")
			seen[id] = true
		}
		require.Len(t, seen, 10)
		require.Equal(t, []fakeCall{{d.key, 1, 1}, {d.key, 9, 9}}, st.calls)
		st.gate = nil
		require.NoError(t, a.checkIdle())
	})
}

func TestAcquirerWaitsAndIgnoresNonMatchingPostings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		d := spec(t, []string{"a", "b"}, map[string]string{"region": "eu"})
		ta := startAcquiree(t, a, d)
		synctest.Wait()
		ta.requireBlocked()
		require.Equal(t, 1, st.callCount())

		for _, p := range []posting.Posting{
			{Type: "c"}, // other type
			{Type: "a", Tags: map[string]string{"region": "us"}},               // conflicting value
			{Type: "a", Tags: map[string]string{"region": "eu", "gpu": "yes"}}, // extra job tag
		} {
			st.add(p.Type, p.Tags, 0)
			a.post(p)
			synctest.Wait()
			ta.requireBlocked()
			require.Equal(t, 1, st.callCount(), "posting %+v must not wake the domain", p)
		}
		want := st.add("b", map[string]string{"region": "eu"}, 0)
		a.post(posting.Posting{Type: "b", Tags: map[string]string{"region": "eu"}})
		synctest.Wait()
		require.Equal(t, want.ID, ta.success().ID)

		// An untagged job matches a tagged worker.
		ta = startAcquiree(t, a, d)
		synctest.Wait()
		want = st.add("a", nil, 0)
		a.post(posting.Posting{Type: "a"})
		synctest.Wait()
		require.Equal(t, want.ID, ta.success().ID)
	})
}

func TestAcquirerPendingPostingMidClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.gate = make(chan struct{})
		st.entered = make(chan string, 10)
		a := newTestAcquirer(t, st)
		d := spec(t, []string{"a"}, nil)
		ta := startAcquiree(t, a, d)
		<-st.entered
		// The job commits after the claim's snapshot: the claim finds
		// nothing, but the posting that lands meanwhile makes the domain
		// query again at once instead of parking.
		a.post(posting.Posting{Type: "a"})
		st.gate <- struct{}{} // first claim: nothing (the job is not there yet)
		<-st.entered
		want := st.add("a", nil, 0)
		st.gate <- struct{}{}
		synctest.Wait()
		require.Equal(t, want.ID, ta.success().ID)
		require.Equal(t, 2, st.callCount())
		st.gate = nil
	})
}

func TestAcquirerExtraClaimWhileClaimInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.entered = make(chan string, 10)
		st.gates = []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
		a := newTestAcquirer(t, st)
		d := spec(t, []string{"a"}, nil)
		ta := startAcquiree(t, a, d)
		<-st.entered // claim 0
		close(st.gates[0])
		synctest.Wait() // nothing: the domain parks, with no backlog
		a.post(posting.Posting{Type: "a"})
		<-st.entered // claim 1: in flight, its snapshot older than the job below
		want := st.add("a", nil, 0)
		a.post(posting.Posting{Type: "a"})
		<-st.entered // claim 2: the extra claim, at once
		close(st.gates[2])
		synctest.Wait()
		// The waiter has the job while claim 1 is still in flight.
		require.Equal(t, want.ID, ta.success().ID)
		close(st.gates[1])
		synctest.Wait()
		// The extra claim came back full (1 of 1), so the loop was told to
		// query again; with no waiter left and no buffer, it does not.
		require.Equal(t, 3, st.callCount())
	})
}

func TestAcquirerNoExtraClaimWithBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.entered = make(chan string, 10)
		st.gates = []chan struct{}{make(chan struct{}), make(chan struct{})}
		a := newTestAcquirer(t, st)
		d := spec(t, []string{"a"}, nil)
		st.add("a", nil, 0)
		st.add("a", nil, 0)
		ta := startAcquiree(t, a, d)
		<-st.entered // claim 0 asks for 1 and gets 1: a backlog
		close(st.gates[0])
		synctest.Wait()
		ta.success()
		tb := startAcquiree(t, a, d)
		tc := startAcquiree(t, a, d)
		<-st.entered // claim 1 (the buffer was empty)
		st.add("a", nil, 0)
		a.post(posting.Posting{Type: "a"}) // no extra claim: the loop queries again after claim 1
		synctest.Wait()
		select {
		case k := <-st.entered:
			t.Fatalf("an extra claim started (%s) although the domain had a backlog", k)
		default:
		}
		close(st.gates[1])
		synctest.Wait()
		tb.success()
		tc.success()
	})
}

func TestAcquirerDomainsDoNotBlockEachOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.gate = make(chan struct{})
		st.entered = make(chan string, 10)
		a := newTestAcquirer(t, st)
		slow := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		<-st.entered // domain a's claim is held by the gate
		st.add("b", nil, 0)
		fast := startAcquiree(t, a, spec(t, []string{"b"}, nil))
		<-st.entered
		st.gate <- struct{}{} // lets one claim through: whichever is first in line
		synctest.Wait()
		st.gate <- struct{}{}
		synctest.Wait()
		fast.success()
		slow.requireBlocked()
		slow.requireCanceled()
		st.gate = nil
	})
}

func TestAcquirerBackupPollWakesDomain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		ta.requireBlocked()
		st.add("a", nil, 0) // inserted without a posting
		advance(testPoll - time.Second)
		ta.requireBlocked()
		require.Equal(t, 1, st.callCount(), "no query before the backup poll")
		advance(2 * time.Second)
		ta.success()
		require.Equal(t, 2, st.callCount())
	})
}

func TestAcquirerIdleCostIsOneQueryPerPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		var tas []*testAcquiree
		for i := range 20 {
			d := spec(t, []string{fmt.Sprintf("t%d", i)}, nil)
			for range 10 {
				tas = append(tas, startAcquiree(t, a, d))
			}
		}
		synctest.Wait()
		before := st.callCount()
		require.LessOrEqual(t, before, 20*10) // at most one claim per waiting worker arrival
		advance(10*testPoll + time.Second)
		require.Equal(t, 20*10, st.callCount()-before, "20 domains x 10 polls")
		for _, ta := range tas {
			ta.requireCanceled()
		}
		synctest.Wait()
		require.NoError(t, a.checkIdle())
	})
}

func TestAcquirerCancelledAcquireeNeverStrandsDomain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.gate = make(chan struct{})
		st.entered = make(chan string, 10)
		a := newTestAcquirer(t, st)
		d := spec(t, []string{"a"}, nil)
		st.add("a", nil, 0)
		st.add("a", nil, 0)
		first := startAcquiree(t, a, d)
		<-st.entered
		second := startAcquiree(t, a, d)
		synctest.Wait()
		// The waiting worker whose arrival started the claim leaves mid-claim: it
		// waits for the claim made on its behalf, which answers it with
		// the job; its caller releases it (accounted to its Work call).
		first.cancel()
		synctest.Wait()
		first.requireBlocked()
		st.gate <- struct{}{}
		synctest.Wait()
		first.requireHandedAfterCancel()
		// The remaining waiter is served by the next claim.
		<-st.entered
		st.gate <- struct{}{}
		synctest.Wait()
		second.success()
		require.Empty(t, st.released, "nothing is released behind a Work call's back")

		// A lone waiting worker leaving mid-claim of an empty domain is answered
		// with nothing once the claim returns.
		lone := startAcquiree(t, a, d)
		<-st.entered
		lone.cancel()
		synctest.Wait()
		lone.requireBlocked()
		st.gate <- struct{}{}
		synctest.Wait()
		lone.requireCanceled()
		require.NoError(t, a.checkIdle())
		st.gate = nil
	})
}

func TestAcquirerPostingWakesEveryMatchingDomain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		one := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		two := startAcquiree(t, a, spec(t, []string{"a", "b"}, map[string]string{"x": "1"}))
		synctest.Wait()
		st.add("a", nil, 0)
		st.add("a", nil, 0)
		a.post(posting.Posting{Type: "a"})
		synctest.Wait()
		one.success()
		two.success()
	})
}

func TestAcquirerErrorRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.errs = []error{errors.New("connection refused"), errors.New("connection refused")}
		a := newTestAcquirer(t, st)
		st.add("a", nil, 0)
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		ta.requireBlocked()
		require.Equal(t, 1, st.callCount())
		advance(10 * time.Second) // well past the capped backoff
		ta.success()
		require.Equal(t, 3, st.callCount())
	})
}

// TestAcquirerErrorRetriesWithinThePollInterval: a failed claim is
// retried with a backoff that never grows past the poll interval when
// that is shorter than the backoff's bound (5 s): a queue polling every
// 300 ms (WithPollOnly, typically, which has no listener to wake it when
// the database is back) goes on claiming every 300 ms or so (450 ms with
// the backoff's ±50 %) through an outage, not every 5 to 7.5 s.
func TestAcquirerErrorRetriesWithinThePollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const poll = 300 * time.Millisecond
		st := newFakeStore()
		for range 20 {
			st.errs = append(st.errs, errors.New("connection refused"))
		}
		a := newAcquirer(st, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, poll, 0, nil)
		t.Cleanup(func() {
			a.close()
			st.check(t)
		})
		st.add("a", nil, 0)
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		for st.callCount() <= 20 {
			before := st.callCount()
			advance(poll*3/2 + 10*time.Millisecond)
			require.Greater(t, st.callCount(), before, "no claim within 1.5 poll intervals after %d failed ones", before)
		}
		ta.success()
	})
}

func TestAcquirerWakeAllAfterReconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		x := startAcquiree(t, a, spec(t, []string{"x"}, nil))
		y := startAcquiree(t, a, spec(t, []string{"y"}, map[string]string{"k": "v"}))
		synctest.Wait()
		st.add("x", nil, 0)
		st.add("y", nil, 0)
		a.wakeAll()
		synctest.Wait()
		x.success()
		y.success()
	})
}

func TestAcquirerPostingForLaterGoesToThePromoter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		var heard []time.Duration
		a.scheduled = func(in time.Duration) { heard = append(heard, in) }
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		ta.requireBlocked()
		calls := st.callCount()

		// Jobs due later are the promoter's: the parked domain does not
		// query for them, then or at their run_at.
		st.add("a", nil, 3*time.Second)
		a.post(posting.Sched(3 * time.Second))
		require.Equal(t, []time.Duration{3 * time.Second}, heard)
		advance(4 * time.Second)
		ta.requireBlocked()
		require.Equal(t, calls, st.callCount())

		// The promoter's announcement (In 0) wakes it.
		a.post(posting.Posting{Type: "a"})
		synctest.Wait()
		ta.success()
	})
}

func TestAcquirerCloseFailsWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newAcquirer(st, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, testPoll, time.Second, nil)
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		a.close()
		r := <-ta.res
		require.ErrorIs(t, r.err, ErrClosed)
		a.close() // idempotent
		_, err := a.acquire(context.Background(), spec(t, []string{"a"}, nil))
		require.ErrorIs(t, err, ErrClosed)
		ta.cancel()
	})
}

func TestDomainKeyIsCanonical(t *testing.T) {
	a := spec(t, []string{"b", "a", "a"}, map[string]string{"y": "2", "x": "1"})
	b := spec(t, []string{"a", "b"}, map[string]string{"x": "1", "y": "2"})
	require.Equal(t, a.key, b.key)
	require.Equal(t, []string{"a", "b"}, a.types)
	// No two different domains share a key, whatever their strings.
	c := spec(t, []string{"a=b"}, nil)
	d := spec(t, []string{"a"}, map[string]string{"b": ""})
	require.NotEqual(t, c.key, d.key)
	_, err := newDomainSpec([]string{"a\x00b"}, nil)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestAcquirerDoesNotParkOnLockedJobs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		j := st.add("a", nil, 0)
		st.lock(j) // e.g. an enqueue adding a dependent holds the row
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		ta.requireBlocked()
		calls := st.callCount()
		advance(20 * time.Millisecond) // the skip backoff, not the backup poll
		require.Greater(t, st.callCount(), calls, "the domain looks again while jobs are locked")
		st.unlock(j) // committed, with no posting
		advance(time.Second)
		require.Equal(t, j.ID, ta.success().ID, "found well before the 30s backup poll")
	})
}

// checkIdle returns an error describing any domain state that should not
// exist when no waiting worker waits. Tests call it; it documents the invariants.
func (a *acquirer) checkIdle() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for k, d := range a.domains {
		errs = append(errs, fmt.Errorf("domain %q still present (waiters %d, querying %v)", k, len(d.waiters), d.querying))
	}
	return errors.Join(errs...)
}

// drainWorkers runs n workers that take jobs of d until want jobs were
// taken in all, and returns every job handed out, in order.
func drainWorkers(t *testing.T, a *acquirer, d *domainSpec, n, want int) []*claimed {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var got []*claimed
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				j, err := a.acquire(ctx, d)
				mu.Lock()
				if j != nil {
					got = append(got, j)
				}
				if len(got) >= want {
					cancel()
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return got
}

func requireDistinct(t *testing.T, jobs ...[]*claimed) int {
	t.Helper()
	seen := map[*claimed]bool{}
	for _, js := range jobs {
		for _, j := range js {
			require.False(t, seen[j], "job %s handed out twice", j.ID)
			seen[j] = true
		}
	}
	return len(seen)
}

func TestAcquirerPrefetchFollowsDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.delay = 10 * time.Millisecond
		a := newTestAcquirer(t, st)
		for range 5000 {
			st.add("a", nil, 0)
		}
		d := spec(t, []string{"a"}, nil)
		a.join(d, 4, 500)
		got := drainWorkers(t, a, d, 4, 4000)
		left := a.leave(d, 4)
		require.Equal(t, len(got)+len(left), requireDistinct(t, got, left))
		require.GreaterOrEqual(t, len(got), 4000)

		// Claims took far more than the 4 workers waiting: the buffer
		// served them while the next claim ran, so a few claims did.
		maxK := 0
		for _, c := range st.calls {
			maxK = max(maxK, c.k)
		}
		require.Greater(t, maxK, 100)
		require.LessOrEqual(t, maxK, 4+500)
		require.Less(t, st.callCount(), 4000/10, "claims did not batch")
		st.mu.Lock()
		require.Len(t, st.jobs, 5000-len(got)-len(left), "claimed jobs are handed out or given back")
		st.mu.Unlock()
	})
}

func TestAcquirerPrefetchOffClaimsForWaitersOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.delay = 10 * time.Millisecond
		a := newTestAcquirer(t, st)
		for range 400 {
			st.add("a", nil, 0)
		}
		d := spec(t, []string{"a"}, nil)
		a.join(d, 4, 0)
		got := drainWorkers(t, a, d, 4, 300)
		require.Empty(t, a.leave(d, 4))
		requireDistinct(t, got)
		for _, c := range st.calls {
			require.LessOrEqual(t, c.k, 4)
		}
	})
}

// TestAcquirerSlowHandlersPrefetchNothing: workers that take long per job
// leave the buffer empty: nothing is kept back from other processes (the
// buffer's size is rounded: rounded up, it stocked one job).
func TestAcquirerSlowHandlersPrefetchNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.delay = time.Millisecond
		a := newTestAcquirer(t, st)
		for range 1000 {
			st.add("a", nil, 0)
		}
		d := spec(t, []string{"a"}, nil)
		a.join(d, 4, 1000)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for n := 0; n < 25; n++ {
					if _, err := a.acquire(ctx, d); err != nil {
						return
					}
					<-time.After(time.Second) // the handler's work, in fake time
				}
			})
		}
		wg.Wait()
		cancel()
		left := a.leave(d, 4)
		require.Empty(t, left, "slow handlers kept jobs back")
	})
}

// TestAcquirerBusyWorkersGiveTheBufferBack: a worker that went into a
// long handler after quick ones does not keep its domain's buffered jobs
// for the handler's duration, where another process's idle workers could
// not run them: within two flow watches they are given back, and the
// domain does not claim again until a worker waits. (Before: the buffer
// aimed at what the rate last measured asked for, and kept 1 or 2 jobs,
// leased, for the whole 30 s.)
func TestAcquirerBusyWorkersGiveTheBufferBack(t *testing.T) {
	for _, quick := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		t.Run(quick.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newFakeStore()
				st.delay = time.Millisecond
				a := newTestAcquirer(t, st)
				for range 300 {
					st.add("a", nil, 0)
				}
				d := spec(t, []string{"a"}, nil)
				a.join(d, 1, 1000)
				ctx := context.Background()
				var got []*claimed
				take := func() {
					j, err := a.acquire(ctx, d)
					require.NoError(t, err)
					got = append(got, j)
				}
				for range 50 {
					take()
					<-time.After(quick) // a quick handler, in fake time
				}
				take()
				<-time.After(10 * time.Millisecond) // the refill's claim lands
				synctest.Wait()
				buffered := func() int {
					a.mu.Lock()
					defer a.mu.Unlock()
					return a.domains[d.key].pre.Len()
				}
				held := buffered()
				if quick == time.Millisecond {
					require.Positive(t, held, "nothing buffered to begin with: the test shows nothing")
				}
				// A long handler: 30 s, in fake time.
				<-time.After(2 * flowWatch)
				synctest.Wait()
				st.mu.Lock()
				released := append([]*claimed(nil), st.released...)
				st.mu.Unlock()
				require.Len(t, released, held, "the buffered jobs were not given back")
				handed := len(got) // before the give-back
				claims := st.callCount()
				// The jobs given back are announced, as a release's are: the
				// domain, its demand forgotten, does not take them again.
				a.post(posting.Posting{Type: "a"})
				<-time.After(30*time.Second - 2*flowWatch - 10*time.Millisecond)
				synctest.Wait()
				require.Equal(t, claims, st.callCount(), "the domain claimed again while its worker was busy")
				require.Zero(t, buffered(), "jobs stayed buffered while the worker was busy")

				// Quick handlers again: the buffer is sized anew, and claims
				// batch once more (1 ms handlers; 20 ms ones, one worker, take
				// less than half a job during two claims: nothing is stocked).
				for range 100 {
					take()
					<-time.After(quick)
				}
				maxK := 0
				st.mu.Lock()
				for _, c := range st.calls[claims:] {
					maxK = max(maxK, c.k)
				}
				st.mu.Unlock()
				if quick == time.Millisecond {
					require.Greater(t, maxK, 1, "no claim took more than the waiting worker after the buffer was given back")
				}
				left := a.leave(d, 1)
				require.Equal(t, len(got)+len(left), requireDistinct(t, got, left))
				for _, r := range released {
					require.NotContains(t, got[:handed], r, "a job both handed out and given back")
				}
			})
		})
	}
}

func TestAcquirerCloseReleasesTheBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		st.delay = 10 * time.Millisecond
		a := newAcquirer(st, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, testPoll, 0, nil)
		for range 3000 {
			st.add("a", nil, 0)
		}
		d := spec(t, []string{"a"}, nil)
		a.join(d, 4, 1000)
		got := drainWorkers(t, a, d, 4, 2000)
		a.close()
		st.mu.Lock()
		released := st.released
		st.mu.Unlock()
		require.NotEmpty(t, released, "the buffer goes back")
		// A claim in flight at close may take jobs the close just gave
		// back and give them back again (the fake store, like the
		// database, makes released jobs claimable): count each once. No
		// job handed out may be among them.
		once := map[*claimed]bool{}
		var back []*claimed
		for _, j := range released {
			if !once[j] {
				once[j] = true
				back = append(back, j)
			}
		}
		requireDistinct(t, got, back)
		require.Empty(t, a.leave(d, 4))
		st.check(t)
	})
}

// TestListenerIgnoresItsOwnQueuesPostings: a Queue wakes its own workers
// when it commits jobs, so the NOTIFY of those jobs coming back is
// ignored; postings of other Queues wake as always.
func TestListenerIgnoresItsOwnQueuesPostings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newFakeStore()
		a := newTestAcquirer(t, st)
		l := newListener(nil, nil, "ch", "self", a, func(uuid.UUID) {}, func(uuid.UUID) {}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		ta := startAcquiree(t, a, spec(t, []string{"a"}, nil))
		synctest.Wait()
		ta.requireBlocked()
		calls := st.callCount()
		st.add("a", nil, 0)
		l.dispatch(`{"type":"a","src":"self"}`)
		synctest.Wait()
		ta.requireBlocked()
		require.Equal(t, calls, st.callCount(), "its own posting woke the domain")
		l.dispatch(`{"type":"a","src":"other"}`)
		synctest.Wait()
		ta.success()
	})
}
