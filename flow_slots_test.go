package backlog_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// TestLimitSlotFreesWhenHandlerEnds: a job holding the only slot of a
// concurrency limit frees it for its process's next claim when its
// handler ends, before its outcome is written (version 28). Here the
// outcome cannot be written: a transaction holds the job's row. The next
// job starts all the same, while the first is still running in the
// database; once the row is free, the first's outcome is written. Before
// version 28 the second job waited for that write. With one worker the
// worker itself claims the next job; with two, the waiting worker's
// domain is woken by the first's end.
func TestLimitSlotFreesWhenHandlerEnds(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			require.NoError(t, e.q.SetLimit(ctx, "slotend", backlog.Limit{Concurrency: 1}))
			first, err := e.q.Enqueue(ctx, "slotend", "first", backlog.Priority(1))
			require.NoError(t, err)
			second, err := e.q.Enqueue(ctx, "slotend", "second", backlog.Priority(2))
			require.NoError(t, err)
			tx, err := e.pool.Begin(ctx)
			require.NoError(t, err)

			started := make(chan struct{})
			var running, peak atomic.Int32
			h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
				n := running.Add(1)
				defer running.Add(-1)
				raisePeak(&peak, n)
				if job.ID == first {
					// Its outcome waits for this transaction.
					_, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{e.schema, "jobs"}.Sanitize()+` WHERE id = $1 FOR UPDATE`, first)
					return err
				}
				close(started)
				return nil
			})
			work(t, e.q, h, backlog.Concurrency(workers), backlog.Types("slotend"))
			// Before Work's stop, which waits for the first's outcome
			// (cleanups run last in, first out).
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the second job did not start while the first's outcome waited to be written")
			}
			require.Equal(t, 1, e.countLive(`id = $1 AND state = 'running'`, first), "the first's outcome is not written yet")
			require.NoError(t, tx.Rollback(ctx))
			e.waitState(first, 10*time.Second, backlog.StateCompleted)
			e.waitState(second, 10*time.Second, backlog.StateCompleted)
			require.EqualValues(t, 1, peak.Load(), "one handler at a time")
		})
	}
}

// TestLimitHoldsAcrossProcessesWithSlotsFreedEarly: three processes, each
// with more workers than the limit, run 300 jobs of 1 ms under a limit
// of 3, whose slots are freed as handlers end (version 28), by each
// process for its own claims only, and 200 keyed ones under a key limit
// of 1, freed as outcomes are written, in the same Work calls. No more
// than 3 handlers of the first type, and no more than 1 of a key, ever
// run at once, and every job runs once.
func TestLimitHoldsAcrossProcessesWithSlotsFreedEarly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.q.SetLimit(ctx, "early", backlog.Limit{Concurrency: 3}))
	require.NoError(t, e.q.SetLimit(ctx, "earlykeys", backlog.Limit{KeyConcurrency: 1}))
	var specs []backlog.JobSpec
	for i := range 300 {
		specs = append(specs, backlog.JobSpec{Type: "early", Args: i})
	}
	for i := range 200 {
		specs = append(specs, backlog.JobSpec{Type: "earlykeys", Args: i,
			Options: []backlog.EnqueueOption{backlog.ConcurrencyKey(fmt.Sprintf("k%d", i%4))}})
	}
	_, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	var running, peak atomic.Int32
	var keyRunning [4]atomic.Int32
	var keyPeak atomic.Int32
	h := backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		c, p := &running, &peak
		if job.Type == "earlykeys" {
			var i int
			_, err := fmt.Sscan(string(job.Args), &i)
			if err != nil {
				return err
			}
			c, p = &keyRunning[i%4], &keyPeak
		}
		n := c.Add(1)
		defer c.Add(-1)
		raisePeak(p, n)
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	for range 3 {
		work(t, e.queue(testdb.NewPool(t, 4)), h, backlog.Concurrency(8), backlog.Types("early", "earlykeys"))
	}
	e.waitCount(`state = 'completed'`, len(specs), 60*time.Second)
	require.Zero(t, e.count(`attempt <> 1`), "jobs that ran more than once")
	require.LessOrEqual(t, peak.Load(), int32(3), "the limit of 3")
	require.LessOrEqual(t, keyPeak.Load(), int32(1), "the key limit of 1")
}

// TestMigration28RollingUpgrade: processes of version 27 keep claiming
// against a schema at 0028: they call claim_jobs with six parameters, whose
// overload 0028 left as it was (its 18 columns), and its count takes in
// every running job, ended or not, while a claim of version 28 that passes
// an ended job's token leaves that one out.
func TestMigration28RollingUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	st, err := e.q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Version, int64(28))
	require.NoError(t, e.q.SetLimit(ctx, "v27", backlog.Limit{Concurrency: 1}))
	_, err = e.q.EnqueueMany(ctx, []backlog.JobSpec{{Type: "v27"}, {Type: "v27"}, {Type: "v27"}})
	require.NoError(t, err)
	fn := pgx.Identifier{e.schema, "claim_jobs"}.Sanitize()
	old := func() (tokens [][16]byte) {
		t.Helper()
		// Version 27's claim statement, as it was.
		rows, err := e.pool.Query(ctx, `SELECT lease_token FROM `+fn+`($1::text[], $2::jsonb, $3::integer, $4::integer, $5::bigint, $6::text)
			WHERE id IS NOT NULL`, []string{"v27"}, `{}`, 3, 3, 60000, "old")
		require.NoError(t, err)
		tokens, err = pgx.CollectRows(rows, pgx.RowTo[[16]byte])
		require.NoError(t, err)
		return tokens
	}
	took := old()
	require.Len(t, took, 1, "the limit")
	require.Empty(t, old(), "version 27 counts the running job")
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+fn+`($1::text[], $2::jsonb, $3::integer, $4::integer, $5::bigint, $6::text, $7::uuid[])
		WHERE id IS NOT NULL`, []string{"v27"}, `{}`, 3, 3, 60000, "new", took).Scan(&n))
	require.Equal(t, 1, n, "version 28, passing the job's token as ended, does not")
	require.Empty(t, old(), "two running: version 27's count takes in both")
}

// TestMigration29RollingUpgrade: processes of version 28 keep claiming
// against a schema at 0029: they call claim_jobs with seven parameters,
// whose overload 0029 left as it was (its 20 columns), and they count a
// process's standby jobs as running (fewer slots for them, never more),
// while a claim of version 29 may take standby jobs beyond the limit.
func TestMigration29RollingUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	st, err := e.q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Version, int64(29))
	require.NoError(t, e.q.SetLimit(ctx, "v28", backlog.Limit{Concurrency: 1}))
	specs := make([]backlog.JobSpec, 6)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "v28"}
	}
	_, err = e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	fn := pgx.Identifier{e.schema, "claim_jobs"}.Sanitize()

	// Version 29: the slot, then, holding it, two standby jobs beyond it.
	type took struct {
		Token   [16]byte
		Standby bool
	}
	claim29 := func(k, standby int) []took {
		t.Helper()
		rows, err := e.pool.Query(ctx, `SELECT lease_token, standby FROM `+fn+`($1::text[], $2::jsonb, $3::integer, $4::integer, $5::bigint, $6::text, $7::uuid[], $8::integer)
			WHERE id IS NOT NULL`, []string{"v28"}, `{}`, k, k, 60000, "new", nil, standby)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[took])
		require.NoError(t, err)
		return got
	}
	got := claim29(1, 0)
	require.Len(t, got, 1)
	require.False(t, got[0].Standby)
	got = append(got, claim29(1, 2)...)
	require.Len(t, got, 3, "no slot left: two standby jobs")
	require.True(t, got[1].Standby && got[2].Standby)

	// Version 28, as it was: its handler of the slot ended, it counts the
	// standby rows.
	var cols, n int
	rows, err := e.pool.Query(ctx, `SELECT * FROM `+fn+`($1::text[], $2::jsonb, $3::integer, $4::integer, $5::bigint, $6::text, $7::uuid[])`,
		[]string{"v28"}, `{}`, 3, 3, 60000, "old", [][16]byte{got[0].Token})
	require.NoError(t, err)
	for rows.Next() {
		cols = len(rows.RawValues())
		if rows.RawValues()[0] != nil {
			n++
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 20, cols, "version 28's columns")
	require.Zero(t, n, "version 28 counts the standby rows as running")

	// Version 29 passing the ended job's and the standby jobs' tokens: the
	// slot is free.
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+fn+`($1::text[], $2::jsonb, $3::integer, $4::integer, $5::bigint, $6::text, $7::uuid[], $8::integer)
		WHERE id IS NOT NULL AND NOT standby`, []string{"v28"}, `{}`, 1, 1, 60000, "new",
		[][16]byte{got[0].Token, got[1].Token, got[2].Token}, 0).Scan(&n))
	require.Equal(t, 1, n)
}
