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

// TestClaimTakesStandbyJobs: a claim may take standby jobs beyond a
// concurrency limit (version 29) only once it leaves no slot free: they
// come last, marked Standby, add nothing to the running bound, and a
// claim that passes their tokens does not count them; one that does not
// pass them counts them as running (other processes: fewer slots, never
// more). A limit exceeded (lowered), a key limit, a rate or keyed jobs
// give none.
func TestClaimTakesStandbyJobs(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	for _, l := range []LimitRow{{Type: "lim", Concurrency: 2}, {Type: "keys", Concurrency: 2, KeyConcurrency: 1},
		{Type: "rate", Concurrency: 1, Rate: 100, Per: time.Second, Burst: 100}, {Type: "keyed", Concurrency: 1}} {
		_, err := s.SetLimit(ctx, l)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, run_at)
		SELECT gen_random_uuid(), t, '{}', now() - g * interval '1 second' FROM generate_series(1, 10) g, unnest(ARRAY['lim', 'keys', 'rate']) t`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, concurrency_key)
		SELECT gen_random_uuid(), 'keyed', '{}', 'k' || g FROM generate_series(1, 4) g`)
	require.NoError(t, err)
	claim := func(typ string, k, standby int, ended ...[16]byte) ClaimResult {
		t.Helper()
		var res ClaimResult
		r, err := s.ClaimEach(ctx, []string{typ}, []byte(`{}`), k, k, time.Minute, "w", ended, standby, func(c *Claimed) {
			res.Jobs = append(res.Jobs, *c)
		})
		require.NoError(t, err)
		r.Jobs = res.Jobs
		return r
	}
	tokens := func(js []Claimed) (out [][16]byte) {
		for _, j := range js {
			out = append(out, j.Token)
		}
		return out
	}
	bound := func() (n int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT running_bound FROM "`+schema+`".job_limits WHERE type = 'lim'`).Scan(&n))
		return n
	}

	first := claim("lim", 1, 3)
	require.Len(t, first.Jobs, 1, "a slot is left after this claim: no standby")
	require.False(t, first.Jobs[0].Standby)
	second := claim("lim", 3, 3)
	require.Len(t, second.Jobs, 4, "the last slot, then 3 standby")
	require.False(t, second.Jobs[0].Standby, "the slot's job comes first")
	for _, j := range second.Jobs[1:] {
		require.True(t, j.Standby && j.Conc && j.Slot)
	}
	require.True(t, second.Saturated)
	require.Equal(t, 2, bound(), "standby jobs add nothing to the running bound")
	sb := tokens(second.Jobs[1:])
	require.Empty(t, claim("lim", 2, 0, sb...).Jobs, "both slots held by handlers")
	more := claim("lim", 2, 2, sb...)
	require.Len(t, more.Jobs, 2, "standby again, the older ones passed")
	for _, j := range more.Jobs {
		require.True(t, j.Standby)
	}
	sb = append(sb, tokens(more.Jobs)...)
	ended := tokens(first.Jobs)
	got := claim("lim", 1, 0, append(ended, sb...)...)
	require.Len(t, got.Jobs, 1, "an ended handler's slot")
	require.False(t, got.Jobs[0].Standby)
	require.Empty(t, claim("lim", 1, 2).Jobs, "without the tokens the standby rows count: the limit is exceeded, no standby either")

	for _, typ := range []string{"keys", "rate", "keyed"} {
		res := claim(typ, 2, 3)
		for _, j := range res.Jobs {
			require.False(t, j.Standby, typ)
		}
		res = claim(typ, 2, 3, tokens(res.Jobs)...)
		for _, j := range res.Jobs {
			require.False(t, j.Standby, typ)
		}
	}
}

// TestStandbyOnlyWithinAProcessShare: standby jobs go only to a process
// that holds a slot of the type (a handler whose end can hand it over) and
// no more than its share of the slots, the limit over the live processes
// whose Work calls take the type (a process hands its slots to its standby
// jobs: beyond its share they would stay with it while others wait). A
// dead process's row, or one of another type, does not count.
func TestStandbyOnlyWithinAProcessShare(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := s.SetLimit(ctx, LimitRow{Type: "fair", Concurrency: 4})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, run_at)
		SELECT gen_random_uuid(), 'fair', '{}', now() - g * interval '1 second' FROM generate_series(1, 20) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".processes (worker, instance, host, pid, started_at, heartbeat_at, lease_ms, works, running, leased)
		VALUES ('a', 'i', 'h', 1, now(), now(), 30000, '[{"types": ["x", "fair"], "concurrency": 4}]', 0, 0),
		       ('b', 'i', 'h', 2, now(), now(), 30000, '[{"types": ["fair"], "concurrency": 4}]', 0, 0),
		       ('dead', 'i', 'h', 3, now(), now() - interval '10 minutes', 30000, '[{"types": ["fair"], "concurrency": 4}]', 0, 0),
		       ('other', 'i', 'h', 4, now(), now(), 30000, '[{"types": ["x"], "concurrency": 4}]', 0, 0)`)
	require.NoError(t, err)
	standby := map[string][][16]byte{}
	claim := func(worker string, k, sb int) (slots, took int) {
		t.Helper()
		_, err := s.ClaimEach(ctx, []string{"fair"}, []byte(`{}`), k, k, time.Minute, worker, standby[worker], sb, func(c *Claimed) {
			if c.Standby {
				took++
				standby[worker] = append(standby[worker], c.Token)
			} else {
				slots++
			}
		})
		require.NoError(t, err)
		return slots, took
	}
	slots, took := claim("a", 3, 3)
	require.Equal(t, 3, slots)
	require.Zero(t, took, "a slot is left")
	slots, took = claim("b", 2, 3)
	require.Equal(t, 1, slots)
	require.Zero(t, took, "b held no slot before this claim: none to hand over")
	slots, took = claim("a", 1, 3)
	require.Zero(t, slots)
	require.Zero(t, took, "a holds 3 slots, beyond its share of 2 (b works the type too)")
	slots, took = claim("b", 1, 3)
	require.Zero(t, slots)
	require.Equal(t, 3, took, "b holds 1 of its share of 2")

	// b stops, giving its jobs back: a is alone (the dead process and the
	// other type's do not count), and the whole limit is its share.
	_, err = pool.Exec(ctx, `DELETE FROM "`+schema+`".processes WHERE worker = 'b'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".jobs SET state = 'available', lease_token = NULL, worker = NULL WHERE worker = 'b'`)
	require.NoError(t, err)
	slots, took = claim("a", 1, 2)
	require.Equal(t, 1, slots)
	require.Equal(t, 2, took)
}
