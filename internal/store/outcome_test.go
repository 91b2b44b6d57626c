package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestFinishRecordsTheOutcomeSent: both finish paths, the one-statement
// Finish and FinishGraph (jobs with dependents, and the slow lane), record
// each attempt's outcome as the caller sent it, whatever the error text
// says (migration 25), except where the database decides the state: a
// retry of a job whose cancel was requested ends cancelled, and so does its
// outcome. FinishGraph recorded that retry as "error" (it named the
// outcome from the state sent, 'available', and the text), and both paths
// recorded the wrapped timeout and lease loss below as "error" (their
// texts do not start with backlog's).
func TestFinishRecordsTheOutcomeSent(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	text := func(s string) *string { return &s }
	type want struct{ state, outcome string }
	cases := []struct {
		name   string
		f      Finish
		cancel bool // a cancel was requested while the attempt ran
		want   want
	}{
		{"wrapped timeout, retried", Finish{State: "available", Err: text("fetching: backlog: job timeout"), Outcome: "timeout"},
			false, want{"available", "timeout"}},
		{"wrapped lease loss, failed", Finish{State: "failed", Err: text("uploading: backlog: lease lost"), Outcome: "lease lost"},
			false, want{"failed", "lease lost"}},
		{"retry of a job whose cancel was requested", Finish{State: "available", Err: text("boom"), Outcome: "error"},
			true, want{"cancelled", "cancelled"}},
		{"no outcome sent: the text is not read", Finish{State: "failed", Err: text("backlog: job timeout after 1s")},
			false, want{"failed", "error"}},
		{"panic", Finish{State: "failed", Err: text("panic: out of toner"), Outcome: "panic"},
			false, want{"failed", "panic"}},
	}
	for _, graph := range []bool{false, true} {
		typ := "finish"
		if graph {
			typ = "graph"
		}
		_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args) SELECT gen_random_uuid(), $1, '{}' FROM generate_series(1, $2)`,
			typ, len(cases))
		require.NoError(t, err)
		res, err := s.Claim(ctx, []string{typ}, []byte(`{}`), len(cases), len(cases), time.Minute, "w", nil)
		require.NoError(t, err)
		require.Len(t, res.Jobs, len(cases))
		fs := make([]Finish, len(cases))
		for i, c := range cases {
			fs[i] = c.f
			fs[i].ID, fs[i].Token = res.Jobs[i].ID, res.Jobs[i].Token
			if c.cancel {
				_, err := pool.Exec(ctx, `UPDATE `+jobs+` SET cancel_requested = true WHERE id = $1`, fs[i].ID)
				require.NoError(t, err)
			}
		}
		var out FinishResult
		if graph {
			out, err = s.FinishGraph(ctx, fs, true)
		} else {
			out, err = s.Finish(ctx, fs)
		}
		require.NoError(t, err)
		for i, c := range cases {
			require.Equal(t, Written, out.Status[fs[i].ID], "%s (graph %v)", c.name, graph)
			var got want
			require.NoError(t, pool.QueryRow(ctx, `SELECT state, errors->-1->>'outcome' FROM `+
				pgx.Identifier{schema, "all_jobs"}.Sanitize()+` WHERE id = $1`, fs[i].ID).Scan(&got.state, &got.outcome))
			require.Equal(t, c.want, got, "%s (graph %v)", c.name, graph)
		}
	}
}

// TestOutcomesSentOnlyBesideErrors: a batch without errors sends no
// outcomes (NULL: nothing more on the hot path's wire than before), and an
// outcome is sent only beside an error.
func TestOutcomesSentOnlyBesideErrors(t *testing.T) {
	msg := "boom"
	id := uuid.New()
	a := finishArraysOf([]Finish{{ID: id, State: "completed", Outcome: "timeout"}, {ID: id, State: "completed"}}, true)
	require.Nil(t, a.outcomes)
	a = finishArraysOf([]Finish{{ID: id, State: "completed"}, {ID: id, State: "failed", Err: &msg, Outcome: "panic"}}, true)
	require.Len(t, a.outcomes, 2)
	require.Nil(t, a.outcomes[0])
	require.Equal(t, "panic", *a.outcomes[1])
}
