package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// keyedClaim runs claim_jobs for typ and returns the claimed jobs' names
// (their args' "n"), in the order the claim returned them, and its
// limited flag.
func keyedClaim(t *testing.T, s *Store, typ string, k, now int) (names []string, limited int16) {
	t.Helper()
	ctx := context.Background()
	fn := strings.TrimPrefix(s.sql.claim, "SELECT * FROM ")
	rows, err := s.pool.Query(ctx, `SELECT c.args ->> 'n', c.limited FROM `+fn+` WITH ORDINALITY AS c ORDER BY c.ordinality`,
		Mode, []string{typ}, `{}`, k, now, 30000, "w", nil, 0)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var name *string
		require.NoError(t, rows.Scan(&name, &limited))
		if name != nil {
			names = append(names, *name)
		}
	}
	require.NoError(t, rows.Err())
	return names, limited
}

// addKeyed inserts jobs of typ named by names, oldest first, each "key/n"
// (key "-": no concurrency key) in the given state.
func addKeyed(t *testing.T, s *Store, typ, state string, prio int, names ...string) {
	t.Helper()
	for i, name := range names {
		key, _, _ := strings.Cut(name, "/")
		var ck *string
		if key != "-" {
			ck = &key
		}
		q := `INSERT INTO ` + pgx.Identifier{s.schema, "jobs"}.Sanitize() + ` (id, type, args, priority, concurrency_key, run_at, state, lease_token, lease_expires_at, attempt, worker, started_at)
			VALUES (gen_random_uuid(), $1, jsonb_build_object('n', $2::text), $3, $4, now() - interval '1 hour' + $5 * interval '1 ms', 'available', NULL, NULL, 0, NULL, NULL)`
		if state == "running" {
			q = `INSERT INTO ` + pgx.Identifier{s.schema, "jobs"}.Sanitize() + ` (id, type, args, priority, concurrency_key, run_at, state, lease_token, lease_expires_at, attempt, worker, started_at)
			VALUES (gen_random_uuid(), $1, jsonb_build_object('n', $2::text), $3, $4, now() - interval '1 hour' + $5 * interval '1 ms', 'running', gen_random_uuid(), now() + interval '1 hour', 1, 'w', now())`
		}
		_, err := s.pool.Exec(context.Background(), q, typ, name, prio, ck, i)
		require.NoError(t, err)
	}
}

// TestKeyedClaimTakesKeysInTurn pins the choices of a claim of keyed jobs
// (version 22 takes them in a few statements; version 9 visited the keys
// one by one and chose the same): one job a group a round, the jobs
// without a key as one more group after the keys when no key was served
// yet, then from the key after the last one served, the jobs without a
// key, and the keys from the first.
func TestKeyedClaimTakesKeysInTurn(t *testing.T) {
	s, _, _ := newTestStore(t)
	addKeyed(t, s, "rr", "available", 0, "a/1", "a/2", "a/3", "b/1", "c/1", "c/2", "-/1", "-/2")

	got, limited := keyedClaim(t, s, "rr", 6, 6)
	require.Equal(t, []string{"a/1", "b/1", "c/1", "-/1", "a/2", "c/2"}, got)
	require.Zero(t, limited)
	// The last key served was c: the jobs without a key, then a.
	got, _ = keyedClaim(t, s, "rr", 6, 6)
	require.Equal(t, []string{"-/2", "a/3"}, got)
	got, _ = keyedClaim(t, s, "rr", 6, 6)
	require.Empty(t, got)

	// More urgent jobs first, in turn among themselves; each priority
	// from the key after the one the claim began from (a).
	addKeyed(t, s, "rr", "available", 5, "a/4", "b/2")
	addKeyed(t, s, "rr", "available", 1, "b/3", "c/3", "c/4")
	got, _ = keyedClaim(t, s, "rr", 4, 4)
	require.Equal(t, []string{"b/3", "c/3", "c/4", "b/2"}, got)
}

// TestKeyedClaimKeepsEveryKeysLimit: a key's running jobs and the jobs a
// claim takes at a more urgent priority count against its limit, a key
// without room is passed over (and the claim says a limit held jobs
// back), and a per-key rate allows each key its burst.
func TestKeyedClaimKeepsEveryKeysLimit(t *testing.T) {
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	_, err := s.SetLimit(ctx, LimitRow{Type: "lim", KeyConcurrency: 2})
	require.NoError(t, err)
	addKeyed(t, s, "lim", "running", 0, "x/0", "x/00", "y/0")
	addKeyed(t, s, "lim", "available", 0, "x/1", "y/1", "y/2", "z/1")
	addKeyed(t, s, "lim", "available", 3, "z/2", "z/3", "w/1")
	got, limited := keyedClaim(t, s, "lim", 10, 10)
	require.Equal(t, []string{"y/1", "z/1", "w/1", "z/2"}, got)
	require.EqualValues(t, 2, limited, "x had no room: a limit held jobs back")

	_, err = s.SetLimit(ctx, LimitRow{Type: "rate", Rate: 1, Per: time.Hour, Burst: 2, RatePerKey: true})
	require.NoError(t, err)
	addKeyed(t, s, "rate", "available", 0, "p/1", "p/2", "p/3", "q/1", "-/1", "-/2", "-/3")
	got, limited = keyedClaim(t, s, "rate", 10, 10)
	require.Equal(t, []string{"p/1", "q/1", "-/1", "p/2", "-/2"}, got)
	require.EqualValues(t, 2, limited)
	got, _ = keyedClaim(t, s, "rate", 10, 10)
	require.Empty(t, got, "every key used its burst")
}

// TestKeyedClaimExaminesAtMost256Keys: keys without room are passed over,
// at most 256 a claim; the next claim goes on from the last one examined,
// so a free key behind 300 full ones is reached by the second claim.
func TestKeyedClaimExaminesAtMost256Keys(t *testing.T) {
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	_, err := s.SetLimit(ctx, LimitRow{Type: "many", KeyConcurrency: 1})
	require.NoError(t, err)
	var running, waiting []string
	for i := range 300 {
		running = append(running, fmt.Sprintf("k%03d/0", i))
		waiting = append(waiting, fmt.Sprintf("k%03d/1", i))
	}
	addKeyed(t, s, "many", "running", 0, running...)
	addKeyed(t, s, "many", "available", 0, waiting...)
	addKeyed(t, s, "many", "available", 0, "zz/1")
	got, limited := keyedClaim(t, s, "many", 1, 1)
	require.Empty(t, got)
	require.EqualValues(t, 2, limited)
	var cursor string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT key FROM `+pgx.Identifier{s.schema, "job_key_cursors"}.Sanitize()+` WHERE type = 'many'`).Scan(&cursor))
	require.Equal(t, "k255", cursor, "the cursor moves to the last key examined")
	got, _ = keyedClaim(t, s, "many", 1, 1)
	require.Equal(t, []string{"zz/1"}, got)
}

// TestKeyedClaimReadsFewIndexEntries: a claim of 10 keyed jobs out of
// 20,000 fetches about what it takes, whatever the statistics say. Version 9
// found the next priority with min(), which a plan made on an analysed
// empty table ran as a read of every available keyed job (20,000 index
// entries a claim; 60 ms at 50,000 jobs).
func TestKeyedClaimReadsFewIndexEntries(t *testing.T) {
	ctx := context.Background()
	s, pool, schema := newTestStore(t)
	_, err := s.SetLimit(ctx, LimitRow{Type: "k", KeyConcurrency: 2})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE "`+schema+`".jobs`)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	claim := func() (n int, read int64) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback(ctx)) }()
		rows, err := tx.Query(ctx, s.sql.claim, Mode, []string{"k"}, `{}`, 10, 10, 30000, "w", nil, 0)
		require.NoError(t, err)
		for rows.Next() {
			n++
		}
		require.NoError(t, rows.Err())
		require.NoError(t, tx.QueryRow(ctx, `SELECT idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`,
			`"`+schema+`".jobs`).Scan(&read))
		return n, read
	}
	for range 12 { // past PL/pgSQL's switch to a generic plan
		claim()
	}
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".jobs (id, type, args, concurrency_key)
		SELECT gen_random_uuid(), 'k', '{}', 'key-' || (g % 200) FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	n, read := claim()
	t.Logf("a claim of 10 keyed jobs out of 20,000 fetched %d rows through indexes", read)
	require.Equal(t, 10, n)
	require.Less(t, read, int64(500), "a claim of 10 keyed jobs fetched %d rows through indexes", read)
}

// TestKeyedClaimWalksKeysForTheRoomItNeeds pins the walk of version 27: a
// key under a key limit counts for the room the limit leaves it, so a
// claim walks only as many keys as cover its need and takes up to each
// key's room from them, and the next claim goes on after the last key it
// served. When the keys it walked run short (fewer jobs than room), the
// walk goes on from where it stopped, counting each key for one job: the
// claim still fills from the keys after them.
func TestKeyedClaimWalksKeysForTheRoomItNeeds(t *testing.T) {
	s, _, _ := newTestStore(t)
	ctx := context.Background()
	_, err := s.SetLimit(ctx, LimitRow{Type: "room", KeyConcurrency: 2})
	require.NoError(t, err)
	addKeyed(t, s, "room", "available", 0, "a/1", "a/2", "a/3", "b/1", "b/2", "b/3", "c/1", "c/2", "c/3")
	got, limited := keyedClaim(t, s, "room", 4, 4)
	require.Equal(t, []string{"a/1", "b/1", "a/2", "b/2"}, got, "two keys' room covers the need: c is not walked")
	require.EqualValues(t, 0, limited)
	got, _ = keyedClaim(t, s, "room", 2, 2)
	require.Equal(t, []string{"c/1", "c/2"}, got, "the next claim goes on after b")

	// Keys with one job each under a limit of 3: the first two keys'
	// room (6) covers a claim of 6, but they hold two jobs; the walk goes
	// on until the claim is full.
	_, err = s.SetLimit(ctx, LimitRow{Type: "short", KeyConcurrency: 3})
	require.NoError(t, err)
	var names []string
	for k := range 10 {
		names = append(names, fmt.Sprintf("k%d/1", k))
	}
	addKeyed(t, s, "short", "available", 0, names...)
	got, _ = keyedClaim(t, s, "short", 6, 6)
	require.Equal(t, names[:6], got)
	got, _ = keyedClaim(t, s, "short", 6, 6)
	require.Equal(t, names[6:], got)

	// Once a chunk ran short, the rest of the walk counts each key for one
	// job, as before version 27 (keys that sparse would otherwise cost a
	// chunk, two statements, for every few jobs): k2 and k3 give one job
	// each, not k2 two.
	_, err = s.SetLimit(ctx, LimitRow{Type: "sparse", KeyConcurrency: 3})
	require.NoError(t, err)
	addKeyed(t, s, "sparse", "available", 0, "k0/1", "k0/2", "k1/1", "k1/2", "k2/1", "k2/2", "k3/1", "k3/2")
	got, _ = keyedClaim(t, s, "sparse", 6, 6)
	require.Equal(t, []string{"k0/1", "k1/1", "k0/2", "k1/2", "k2/1", "k3/1"}, got)
}
