package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
)

type typedArgs struct {
	N int `json:"n"`
}

// TestBadInputUnderLoad: while 1,000 normal jobs run, jobs with oversized
// results, args that do not decode, and a type no handler is registered
// for (claimed because Work's Types names it) each end failed at their
// first attempt with a clear error, and every normal job completes once.
func TestBadInputUnderLoad(t *testing.T) {
	requireFaults(t)
	const (
		normal = 1000
		bad    = 25 // of each kind
	)
	e := newFEnv(t)
	ctx := context.Background()
	q := e.queue(e.pool("s6", 6, nil), "s6", backlog.WithPollInterval(time.Second))

	mux := backlog.NewMux()
	mux.Handle("s6.ok", e.recorder("s6"))
	mux.HandleFunc("s6.big", func(ctx context.Context, job *backlog.Job) error {
		if _, err := e.record(ctx, e.ctl, job, "s6"); err != nil {
			return err
		}
		if err := job.SetResult(strings.Repeat("x", backlog.MaxResultBytes)); err == nil { // +2 quotes
			return fmt.Errorf("SetResult accepted %d bytes", backlog.MaxResultBytes+2)
		}
		return nil // the handler ignores the error: the job must still fail
	})
	mux.Handle("s6.args", backlog.HandleJSON(func(ctx context.Context, job *backlog.Job, a typedArgs) error {
		_, err := e.record(ctx, e.ctl, job, "s6")
		return err
	}))
	work(t, q, mux, backlog.Concurrency(16), backlog.Types("s6.ok", "s6.big", "s6.args", "s6.nohandler"))

	// Interleave the bad jobs with the normal ones, in batches and alone.
	var specs []backlog.JobSpec
	for i := range normal {
		specs = append(specs, backlog.JobSpec{Type: "s6.ok", Args: typedArgs{N: i}})
	}
	for i := range bad {
		specs = append(specs,
			backlog.JobSpec{Type: "s6.big", Args: typedArgs{N: i}},
			backlog.JobSpec{Type: "s6.args", Args: []int{i, i}},
			backlog.JobSpec{Type: "s6.nohandler", Args: typedArgs{N: i}})
	}
	rand.Shuffle(len(specs), func(i, j int) { specs[i], specs[j] = specs[j], specs[i] })
	for len(specs) > 0 {
		n := min(len(specs), 1+rand.N(50))
		if n == 1 {
			_, err := q.Enqueue(ctx, specs[0].Type, specs[0].Args)
			require.NoError(t, err)
		} else {
			_, err := q.EnqueueMany(ctx, specs[:n])
			require.NoError(t, err)
		}
		specs = specs[n:]
	}
	e.waitSettled(time.Minute)

	l := e.ledger()
	require.Len(t, l.jobs, normal+3*bad)
	l.requireCompletedOnceNoAttemptTwice(t, "s6.ok")
	l.requireOneExecutionEach(t, "s6.ok", "s6.big")
	require.Equal(t, normal, l.states["completed"])
	require.Equal(t, 3*bad, l.states["failed"])
	want := map[string][]string{
		"s6.big":       {"invalid result", fmt.Sprintf("exceeds the %d-byte limit", backlog.MaxResultBytes)},
		"s6.args":      {"decoding args of s6.args into faults_test.typedArgs", "cannot unmarshal array"},
		"s6.nohandler": {`no handler registered for job type "s6.nohandler"`},
	}
	sample := map[string]string{}
	for _, j := range l.jobs {
		if j.Type == "s6.ok" {
			continue
		}
		require.Equal(t, "failed", j.State, "job %s (%s)", j.ID, j.Type)
		require.Equal(t, 1, j.Attempt, "job %s (%s) failed at once, without retries", j.ID, j.Type)
		require.Len(t, j.Errors, 1, "job %s (%s)", j.ID, j.Type)
		for _, s := range want[j.Type] {
			require.Contains(t, j.LastError, s, "job %s (%s)", j.ID, j.Type)
		}
		sample[j.Type] = j.LastError
		switch j.Type {
		case "s6.big":
			require.Len(t, j.Execs, 1, "job %s", j.ID)
		default: // the handler body never ran
			require.Empty(t, j.Execs, "job %s", j.ID)
		}
	}
	for typ, msg := range sample {
		t.Logf("%s ends failed with: %q", typ, msg)
	}
	report(t, summaryRow{
		Scenario:   "6. bad input under load (oversized result, undecodable args, unregistered type)",
		Jobs:       normal + 3*bad,
		Faults:     fmt.Sprintf("%d bad jobs of each kind among %d normal ones", bad, normal),
		Lost:       0,
		Duplicates: "0; every bad job failed at attempt 1 with a clear error",
		Pickup:     "n/a",
	})
}
