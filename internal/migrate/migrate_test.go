package migrate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

func embedded(t *testing.T) []Migration {
	t.Helper()
	ms, err := Load(migrations.FS)
	if err != nil || len(ms) == 0 {
		t.Fatalf("migrations: %d %v", len(ms), err)
	}
	return ms
}

// with returns ms and one more migration after them.
func with(ms []Migration, name, up, down string) []Migration {
	out := append([]Migration(nil), ms...)
	return append(out, Migration{Version: ms[len(ms)-1].Version + 1, Name: name, SQL: up, Down: down, HasDown: true})
}

// awaitTrue polls query (one boolean, of arg) until it is true; it fails
// the test with early if ended delivers first, with never if ctx ends.
func awaitTrue(ctx context.Context, t *testing.T, pool *pgxpool.Pool, query string, arg any, ended <-chan error, early, never string) {
	t.Helper()
	for {
		var ok bool
		if err := pool.QueryRow(ctx, query, arg).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		select {
		case err := <-ended:
			t.Fatalf("%s: %v", early, err)
		case <-ctx.Done():
			t.Fatal(never)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// setLocks shortens the lock waits for one test (not parallel: they are
// package variables).
func setLocks(t *testing.T, timeout, retryFor time.Duration) {
	t.Helper()
	saved := []time.Duration{LockTimeout, LockRetryFor, LockPause, LockPauseMax}
	LockTimeout, LockRetryFor, LockPause, LockPauseMax = timeout, retryFor, 10*time.Millisecond, 20*time.Millisecond
	t.Cleanup(func() { LockTimeout, LockRetryFor, LockPause, LockPauseMax = saved[0], saved[1], saved[2], saved[3] })
}

// TestUpUnderShortStatementTimeout: a pool whose sessions time statements
// out at 100 ms (and locks at 50 ms) still migrates from empty to the
// newest version, from three callers at once (two wait for the first's
// migration lock), through a migration slower than the timeout; and
// migrates all the way down again.
func TestUpUnderShortStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.PoolWith(t, 8, map[string]string{"statement_timeout": "100", "lock_timeout": "50", "idle_in_transaction_session_timeout": "100"})
	schema := testdb.Schema(t)
	ms := with(embedded(t), "slow", `SELECT pg_sleep(0.3);`, `SELECT pg_sleep(0.3);`)
	newest := ms[len(ms)-1].Version

	var wg sync.WaitGroup
	errs := make([]error, 3)
	applied := make([][]int64, 3)
	for i := range errs {
		wg.Go(func() { applied[i], errs[i] = Up(ctx, pool, schema, ms) })
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Up %d: %v", i, err)
		}
		total += len(applied[i])
	}
	if total != len(ms) {
		t.Fatalf("applied %v: each migration once, %d in all, expected", applied, len(ms))
	}
	st, err := ReadState(ctx, pool, schema, true)
	if err != nil || st.Version != newest || !st.Recorded || st.MigratedBy != ToolBacklog {
		t.Fatalf("state %+v %v", st, err)
	}
	done, err := Down(ctx, pool, schema, ms, len(ms))
	if err != nil || len(done) != len(ms) {
		t.Fatalf("Down: %v %v", done, err)
	}
}

// TestUpRetriesLocks: a migration that needs jobs while a long transaction
// holds a lock on it waits at most LockTimeout at a time, so the queue's
// own statements on jobs are not stalled behind it, and it applies once
// the transaction ends.
func TestUpRetriesLocks(t *testing.T) {
	setLocks(t, 50*time.Millisecond, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms := embedded(t)
	if _, err := Up(ctx, pool, schema, ms); err != nil {
		t.Fatal(err)
	}
	ms = with(ms, "alter", `ALTER TABLE jobs ADD COLUMN x integer;`, `ALTER TABLE jobs DROP COLUMN x;`)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()

	// A long reader of jobs.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background()) //nolint:errcheck // the test ends it
	if _, err := blocker.Exec(ctx, `SELECT count(*) FROM `+jobs); err != nil {
		t.Fatal(err)
	}
	up := make(chan error, 1)
	go func() {
		_, err := Up(ctx, pool, schema, ms)
		up <- err
	}()
	// Wait until the migration waits for its lock.
	awaitTrue(ctx, t, pool, `SELECT EXISTS (SELECT FROM pg_locks WHERE relation = $1::regclass AND NOT granted AND mode = 'AccessExclusiveLock')`,
		jobs, up, "Up returned while jobs was held", "the migration never waited for jobs")
	// The queue goes on: a statement on jobs gets through within a few
	// lock timeouts (it would wait for the long transaction otherwise).
	for range 5 {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := pool.Exec(sctx, `SELECT count(*) FROM `+jobs)
		scancel()
		if err != nil {
			t.Fatalf("a reader of jobs stalled behind the migration: %v", err)
		}
	}
	select {
	case err := <-up:
		t.Fatalf("Up returned while jobs was held: %v", err)
	default:
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-up; err != nil {
		t.Fatalf("Up after the long transaction: %v", err)
	}
	if v, err := Version(ctx, pool, schema); err != nil || v != ms[len(ms)-1].Version {
		t.Fatalf("version %d %v", v, err)
	}
}

// TestUpGivesUpOnLocks: held for longer than LockRetryFor, the lock error
// is returned, naming the tries, and nothing is applied.
func TestUpGivesUpOnLocks(t *testing.T) {
	setLocks(t, 20*time.Millisecond, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms := embedded(t)
	if _, err := Up(ctx, pool, schema, ms); err != nil {
		t.Fatal(err)
	}
	before := ms[len(ms)-1].Version
	ms = with(ms, "alter", `ALTER TABLE jobs ADD COLUMN x integer;`, `ALTER TABLE jobs DROP COLUMN x;`)
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background()) //nolint:errcheck // no-op at the end
	if _, err := blocker.Exec(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "jobs"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	_, err = Up(ctx, pool, schema, ms)
	if !pgerr.Busy(err) || !strings.Contains(err.Error(), "tries") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Up with jobs held: %v", err)
	}
	if v, err := Version(ctx, pool, schema); err != nil || v != before {
		t.Fatalf("version %d %v, want %d", v, err, before)
	}
}

// TestExportRefuses: a migration that would break its export is refused.
func TestExportRefuses(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	for _, bad := range []string{"SELECT $backlog_sql$x$backlog_sql$;", "-- +goose Down\nSELECT 1;"} {
		if _, err := Export(with(ms, "bad", bad, "SELECT 1;"), "backlog", FormatGoose); err == nil {
			t.Fatalf("exported %q", bad)
		}
	}
	if _, err := Export(ms, `back"log`, FormatGoose); err == nil {
		t.Fatal("exported for a schema name backlog refuses")
	}
}

// TestUpCancelsTheMaintenanceVacuum: a migration that needs the jobs
// table does not queue behind the maintenance loop's VACUUM of it (nor
// make every claim queue behind its own wait): it cancels the vacuum and
// applies at once. The vacuum here is the store's own, slowed by a cost
// delay so that it outlasts every lock wait the migration would make.
func TestUpCancelsTheMaintenanceVacuum(t *testing.T) {
	setLocks(t, 200*time.Millisecond, 600*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	ms := embedded(t)
	if _, err := Up(ctx, pool, schema, ms); err != nil {
		t.Fatal(err)
	}
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	if _, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (id, type, args) SELECT gen_random_uuid(), 'v', '{}' FROM generate_series(1, 5000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+jobs+` WHERE random() < 0.5`); err != nil {
		t.Fatal(err)
	}
	slow := testdb.PoolWith(t, 8, map[string]string{"vacuum_cost_delay": "100", "vacuum_cost_limit": "1"})
	vacuumed := make(chan error, 1)
	// vacuum starts the store's vacuum of jobs and returns once it runs.
	vacuum := func() {
		go func() {
			_, err := store.New(slow, schema).VacuumJobs(ctx, 0, 0, 0)
			vacuumed <- err
		}()
		awaitTrue(ctx, t, pool, `SELECT EXISTS (SELECT FROM pg_stat_progress_vacuum WHERE relid = $1::regclass)`,
			jobs, vacuumed, "the slowed vacuum ended before the migration", "the vacuum never started")
	}
	vacuum()
	ms = with(ms, "alter", `ALTER TABLE jobs ADD COLUMN x integer;`, `ALTER TABLE jobs DROP COLUMN x;`)
	if _, err := Up(ctx, pool, schema, ms); err != nil {
		t.Fatalf("Up behind the maintenance vacuum: %v", err)
	}
	if err := <-vacuumed; pgerr.Code(err) != "57014" || pgerr.StatementTimeout(err) {
		t.Fatalf("the vacuum was not cancelled by the migration: %v", err)
	}
	// Down cancels it the same way.
	vacuum()
	if _, err := Down(ctx, pool, schema, ms, 1); err != nil {
		t.Fatalf("Down behind the maintenance vacuum: %v", err)
	}
	if err := <-vacuumed; pgerr.Code(err) != "57014" {
		t.Fatalf("the vacuum was not cancelled by the down migration: %v", err)
	}
}
