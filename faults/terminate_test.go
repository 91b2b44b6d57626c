package faults_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

// terminate ends every backend whose application_name starts with prefix
// (never the caller's own) and returns how many it signalled.
func (e *fenv) terminate(prefix string) int {
	e.t.Helper()
	return e.count(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE starts_with(application_name, $1) AND pid <> pg_backend_pid()`, prefix)
}

// TestBackendsTerminated: while enqueuers (single Enqueue in a loop) and
// workers run, every backend of the queues under test (pools, LISTEN) is
// terminated with pg_terminate_backend several times. Enqueue errors are
// all ErrRetryable; every ID Enqueue returned is committed; failed calls
// that committed anyway are counted; every job completes; workers and the
// listener reconnect by themselves.
func TestBackendsTerminated(t *testing.T) {
	requireFaults(t)
	const (
		enqueuers    = 4
		terminations = 6
	)
	e := newFEnv(t)
	ctx := context.Background()
	prefix := e.app("")
	// The queue under test: one pool for its enqueues, workers, heartbeat,
	// completer and (hijacked from it) LISTEN connection.
	pool := e.pool("s2", 8, nil)
	q := e.queue(pool, "s2", backlog.WithLease(3*time.Second), backlog.WithSweepInterval(200*time.Millisecond),
		backlog.WithPollInterval(time.Second), backlog.WithPollJitter(200*time.Millisecond),
		backlog.WithRetryBackoff(backlog.Backoff{Initial: 50 * time.Millisecond, Max: time.Second}))
	mux := backlog.NewMux()
	mux.HandleFunc("s2.work", func(ctx context.Context, job *backlog.Job) error {
		_, err := e.record(ctx, pool, job, "s2") // on the faulty pool: the side effect can fail too
		return err
	})
	work(t, q, mux, backlog.Concurrency(8))

	// Enqueuers: single Enqueue calls with a unique sequence number each.
	type failure struct {
		seq int
		err error
	}
	var (
		mu       sync.Mutex
		ok       = map[uuid.UUID]int{}
		failures []failure
		seq      int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range enqueuers {
		wg.Go(func() {
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				mu.Lock()
				seq++
				n := seq
				mu.Unlock()
				cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				id, err := q.Enqueue(cctx, "s2.work", map[string]int{"seq": n})
				cancel()
				mu.Lock()
				if err != nil {
					failures = append(failures, failure{n, err})
				} else {
					ok[id] = n
				}
				mu.Unlock()
			}
		})
	}

	var termAt []time.Time
	killed := 0
	tick := time.NewTimer(time.Second)
	for len(termAt) < terminations {
		<-tick.C
		at := e.dbNow()
		n := e.terminate(prefix)
		require.Positive(t, n, "termination %d found no backend of the queue to terminate", len(termAt)+1)
		termAt = append(termAt, at)
		killed += n
		t.Logf("terminated %d backends", n)
		tick.Reset(800 * time.Millisecond)
	}
	tick.Stop()
	// The listener comes back by itself.
	listenQuery := `LISTEN "` + e.schema + `.backlog"`
	listenBack := time.Now()
	eventually(t, 30*time.Second, 20*time.Millisecond, "the listener reconnects", func() bool {
		return e.count(`SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1) AND query = $2`, prefix, listenQuery) == 1
	})
	listenDelay := time.Since(listenBack)
	// Keep enqueueing a moment after the last fault, then stop.
	settle := time.NewTimer(time.Second)
	<-settle.C
	close(stop)
	wg.Wait()
	e.waitSettled(time.Minute)

	// Every failure is retryable.
	byErr := map[string]int{}
	for _, f := range failures {
		require.ErrorIs(t, f.err, backlog.ErrRetryable, "Enqueue #%d failed with a non-retryable error", f.seq)
		msg := f.err.Error()
		if i := strings.Index(msg, ": "); i >= 0 { // drop "enqueueing 1 job(s): "
			msg = msg[i+2:]
		}
		byErr[msg]++
	}
	l := e.ledger()
	l.requireCompletedOnceNoAttemptTwice(t, "s2.work")
	// Every acknowledged ID is committed.
	for id, n := range ok {
		require.NotNil(t, l.jobs[id.String()], "Enqueue #%d returned %s but the job does not exist", n, id)
	}
	// Jobs beyond the acknowledged ones come from failed calls that
	// committed after all.
	failedSeq := map[int]bool{}
	for _, f := range failures {
		failedSeq[f.seq] = true
	}
	ackedSeq := map[int]bool{}
	for _, n := range ok {
		ackedSeq[n] = true
	}
	var rows []struct {
		ID  string
		Seq int
	}
	r, err := e.ctl.Query(ctx, `SELECT id::text, (args->>'seq')::int FROM `+e.table("all_jobs"))
	require.NoError(t, err)
	for r.Next() {
		var x struct {
			ID  string
			Seq int
		}
		require.NoError(t, r.Scan(&x.ID, &x.Seq))
		rows = append(rows, x)
	}
	require.NoError(t, r.Err())
	committedAnyway := 0
	for _, x := range rows {
		if ackedSeq[x.Seq] {
			continue
		}
		require.True(t, failedSeq[x.Seq], "job %s (seq %d) was neither acknowledged nor a failed call", x.ID, x.Seq)
		committedAnyway++
	}
	require.Equal(t, len(ok)+committedAnyway, len(l.jobs))

	// Duplicates: a handler whose side effect committed but whose
	// connection died before it heard so returned an error, and the retry
	// ran it again. Each earlier execution must belong to an attempt that
	// is recorded as failed.
	dups := l.duplicates()
	why := map[string]int{}
	for _, j := range dups {
		for _, x := range j.Execs[:len(j.Execs)-1] {
			msg := j.errorOf(x.Attempt)
			require.NotEmpty(t, msg, "job %s: attempt %d ran, did not complete, and has no recorded error: %+v", j.ID, x.Attempt, j)
			why[shortErr(msg)]++
		}
	}
	// Attempts that failed without a duplicate (the handler's insert or
	// the claim's answer was lost; a retry or the sweep ran the job).
	failedAttempts := map[string]int{}
	for _, j := range l.jobs {
		for _, ae := range j.Errors {
			failedAttempts[shortErr(ae.Error)]++
		}
	}
	t.Logf("failed attempts: %v", failedAttempts)
	var pickup durations
	for _, at := range termAt {
		if s, ok := l.firstStartAfter(at, ""); ok {
			pickup = append(pickup, s.Sub(at))
		}
	}
	errs := make([]string, 0, len(byErr))
	for m, n := range byErr {
		errs = append(errs, fmt.Sprintf("%d× %s", n, m))
	}
	sort.Strings(errs)
	t.Logf("%d Enqueue calls: %d acknowledged, %d failed (all ErrRetryable), %d of the failed committed anyway; errors: %s",
		len(ok)+len(failures), len(ok), len(failures), committedAnyway, strings.Join(errs, "; "))
	t.Logf("%d terminations (%d backends); %d jobs, %d executions, %d jobs ran twice (%v); listener back %s after the last termination was checked; termination → next job start: %s",
		terminations, killed, len(l.jobs), l.execs, len(dups), why, listenDelay.Round(time.Millisecond), pickup)
	dupText := "0"
	if len(dups) > 0 {
		dupText = fmt.Sprintf("%d: the handler's own insert committed but its connection was terminated before the reply; the attempt failed (%v) and its retry ran again", len(dups), why)
	}
	report(t, summaryRow{
		Scenario: "2. all backends of the queue terminated (pg_terminate_backend) under enqueue + work",
		Jobs:     len(l.jobs),
		Faults: fmt.Sprintf("%d terminations, %d backends; %d of %d Enqueue calls failed (all ErrRetryable), %d of those committed anyway",
			terminations, killed, len(failures), len(ok)+len(failures), committedAnyway),
		Lost:       len(l.jobs) - l.states["completed"],
		Duplicates: dupText,
		Pickup:     "termination → next job start: " + pickup.String(),
	})

}

// shortErr keeps the gist of an error text.
func shortErr(s string) string {
	if i := strings.Index(s, "(SQLSTATE"); i >= 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.TrimSpace(s)
}
