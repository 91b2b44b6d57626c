package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClaimDiscountsEndedJobs: a claim that passes the lease tokens of
// jobs whose handlers have ended (version 28) does not count those jobs
// against a concurrency limit, and only those: a token of an earlier
// attempt of a job running again, or of a job of another type, frees
// nothing, and a claim without tokens counts every running job. A claim
// that leaves no slot beyond its callers' says the limit binds
// (Saturated), and its jobs hold slots of a concurrency limit (Conc).
func TestClaimDiscountsEndedJobs(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := s.SetLimit(ctx, LimitRow{Type: "lim", Concurrency: 2})
	require.NoError(t, err)
	_, err = s.SetLimit(ctx, LimitRow{Type: "other", Concurrency: 5})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args)
		SELECT gen_random_uuid(), t, '{}' FROM generate_series(1, 6), unnest(ARRAY['lim', 'other']) t`)
	require.NoError(t, err)
	claim := func(ended ...[16]byte) []Claimed {
		t.Helper()
		res, err := s.Claim(ctx, []string{"lim"}, []byte(`{}`), 6, 6, time.Minute, "w", ended)
		require.NoError(t, err)
		require.Equal(t, LimitedWait, res.Limited)
		require.True(t, res.Saturated, "callers wait for the limit's slots")
		for _, j := range res.Jobs {
			require.True(t, j.Slot && j.Conc, "a slot of a concurrency limit")
		}
		return res.Jobs
	}

	first := claim()
	require.Len(t, first, 2, "the limit")
	require.Empty(t, claim(), "both slots held")
	other, err := s.Claim(ctx, []string{"other"}, []byte(`{}`), 1, 1, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, other.Jobs, 1)
	require.Equal(t, LimitedNone, other.Limited)
	require.False(t, other.Saturated, "4 slots left beyond the caller's")
	exact, err := s.Claim(ctx, []string{"other"}, []byte(`{}`), 4, 4, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, exact.Jobs, 4)
	require.Equal(t, LimitedNone, exact.Limited)
	require.True(t, exact.Saturated, "the claim took the last free slots: the limit binds")
	require.Empty(t, claim(other.Jobs[0].Token, [16]byte{1}), "another type's job and an unknown token free nothing")

	second := claim(first[0].Token)
	require.Len(t, second, 1, "the ended job's slot")
	require.Empty(t, claim(first[0].Token), "the ended job is discounted once: two others run")
	require.Len(t, claim(first[0].Token, first[1].Token), 1, "both ended jobs discounted: one slot more")
	require.Empty(t, claim(), "without tokens every running job counts (3 of 2)")

	// first[1] runs again under a new attempt: its old token is no
	// longer its lease.
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".jobs SET lease_token = gen_random_uuid() WHERE id = $1`, first[1].ID)
	require.NoError(t, err)
	require.Empty(t, claim(first[0].Token, first[1].Token), "a stale token counts its job as running")
}

// TestKeyLimitsCountEndedJobs: a key limit counts ended jobs as
// before: a key's slot is freed by the outcome's write; a claim held back
// by key limits is not Saturated, and its jobs are not Conc.
func TestKeyLimitsCountEndedJobs(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := s.SetLimit(ctx, LimitRow{Type: "keyed", KeyConcurrency: 1})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, concurrency_key, run_at)
		SELECT gen_random_uuid(), 'keyed', '{}', k, now() - g * interval '1 second'
		FROM generate_series(1, 3) g, unnest(ARRAY['a', 'b']) k`)
	require.NoError(t, err)
	claim := func(ended ...[16]byte) map[string]int {
		t.Helper()
		res, err := s.Claim(ctx, []string{"keyed"}, []byte(`{}`), 6, 6, time.Minute, "w", ended)
		require.NoError(t, err)
		keys := map[string]int{}
		for _, j := range res.Jobs {
			var k string
			require.NoError(t, pool.QueryRow(ctx, `SELECT concurrency_key FROM "`+schema+`".jobs WHERE id = $1`, j.ID).Scan(&k))
			keys[k]++
		}
		return keys
	}
	res, err := s.Claim(ctx, []string{"keyed"}, []byte(`{}`), 6, 6, time.Minute, "w", nil)
	require.NoError(t, err)
	require.Len(t, res.Jobs, 2, "one a key")
	for _, j := range res.Jobs {
		require.True(t, j.Slot, "a slot of the key limit")
		require.False(t, j.Conc, "no concurrency limit")
	}
	var a [16]byte
	for _, j := range res.Jobs {
		var k string
		require.NoError(t, pool.QueryRow(ctx, `SELECT concurrency_key FROM "`+schema+`".jobs WHERE id = $1`, j.ID).Scan(&k))
		if k == "a" {
			a = j.Token
		}
	}
	require.Empty(t, claim(), "each key at its limit")
	require.Empty(t, claim(a), "key a's ended job still holds key a's slot")
	res, err = s.Claim(ctx, []string{"keyed"}, []byte(`{}`), 6, 6, time.Minute, "w", [][16]byte{a})
	require.NoError(t, err)
	require.Equal(t, LimitedWait, res.Limited)
	require.False(t, res.Saturated, "held back by key limits only")
}
