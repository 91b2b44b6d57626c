package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStaleRunningBoundDoesNotCapAClaim: a limited type's running bound
// (job_limits.running_bound) only grows between counts. A claim whose
// bound is stale, though below the point where the limit would be
// exceeded, counts the running jobs again before it sizes a prefetch
// buffer by the free slots (version 26): with none running and a limit of
// 100, a claim for a buffer of 40 takes 25 (a quarter of the 100 free
// slots), not 12 (a quarter of the 50 the stale bound of 50 leaves).
func TestStaleRunningBoundDoesNotCapAClaim(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := s.SetLimit(ctx, LimitRow{Type: "bounded", Concurrency: 100})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args)
		SELECT gen_random_uuid(), 'bounded', '{}' FROM generate_series(1, 60)`)
	require.NoError(t, err)
	// Claims took 50 jobs since the last count; all have finished.
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".job_limits SET running_bound = 50 WHERE type = 'bounded'`)
	require.NoError(t, err)

	res, err := s.Claim(ctx, []string{"bounded"}, []byte(`{}`), 40, 0, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Equal(t, 25, len(res.Jobs), "a quarter of the 100 free slots (12: the stale bound capped the claim)")
	var bound int
	require.NoError(t, pool.QueryRow(ctx, `SELECT running_bound FROM "`+schema+`".job_limits WHERE type = 'bounded'`).Scan(&bound))
	require.Equal(t, 25, bound, "counted again (0 running), plus the 25 taken")
}
