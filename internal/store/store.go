// Package store holds every SQL statement backlog runs on its hot path and
// the code that binds and scans them. It knows nothing about handlers,
// domains or leases beyond what a statement needs.
//
// Statements that read the jobs table run with
// pgx.QueryExecModeCacheDescribe: an unnamed statement planned afresh at
// each execution. That keeps them from ever being stuck on a generic plan
// made when the table was empty (a 2-5x trap measured on this workload), and
// it works through PgBouncer in transaction pooling mode, which cannot keep
// named prepared statements. Statements whose plan cannot depend on the data
// (inserts from parameter arrays, NOTIFY) run in the pool's own default mode,
// so they are prepared once per connection unless the application configured
// its pool otherwise (as it must behind PgBouncer).
package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode is the query execution mode of every statement.
const Mode = pgx.QueryExecModeCacheDescribe

// MaxErrors is how many attempt errors a job keeps; older ones are dropped.
const MaxErrors = 20

// ids16 converts IDs for binding: pgx encodes [16]byte natively, while
// uuid.UUID goes through driver.Valuer and a failed fast path per element.
func ids16(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// ErrNotFound is returned by Get for an unknown job ID.
var ErrNotFound = errors.New("job not found")

// DB is what a statement runs on: the pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store runs backlog's statements against one schema.
type Store struct {
	Pool    *pgxpool.Pool
	Schema  string
	Channel string // NOTIFY channel of this schema

	jobs string // quoted, schema-qualified jobs table

	insertSQL, claimSQL, finishSQL, refusedSQL, extendSQL, sweepSQL, getSQL, notifySQL, notifyAsyncSQL string
	graph                                                                                              graphSQL
}

// ChannelName is the NOTIFY channel used for a schema.
func ChannelName(schema string) string { return schema + ".backlog" }

// New prepares the statement texts for schema, which the caller has already
// validated as a plain identifier.
func New(pool *pgxpool.Pool, schema string) *Store {
	s := &Store{Pool: pool, Schema: schema, Channel: ChannelName(schema)}
	s.jobs = pgx.Identifier{schema, "jobs"}.Sanitize()
	s.build()
	return s
}

// errorsAppend is the SQL expression that appends one attempt error to
// j.errors, keeping at most MaxErrors entries. $attempt and $err are SQL
// expressions.
func errorsAppend(attempt, errText string) string {
	return fmt.Sprintf(`(CASE WHEN jsonb_array_length(j.errors) >= %d THEN j.errors - 0 ELSE j.errors END)
		|| jsonb_build_array(jsonb_build_object('attempt', %s, 'at', now(), 'error', %s))`, MaxErrors, attempt, errText)
}

func (s *Store) build() {
	s.insertSQL = `WITH ins AS (
	INSERT INTO ` + s.jobs + ` (id, type, args, tags, priority, run_at, max_attempts, timeout_ms)
	SELECT t.id, t.type, t.args, t.tags, t.priority,
	       COALESCE(t.run_at, now() + t.delay_ms * interval '1 millisecond'), t.max_attempts, t.timeout_ms
	FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::smallint[], $6::timestamptz[], $7::bigint[], $8::integer[], $9::bigint[])
	     AS t(id, type, args, tags, priority, run_at, delay_ms, max_attempts, timeout_ms)
	RETURNING 1
)
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM (SELECT pg_notify($10, p) FROM unnest($11::text[]) AS p WHERE EXISTS (SELECT 1 FROM ins)) n)`

	// The claim is the function claim() of migration 0004: it locks up to
	// $3 due jobs of the domain, marks them running under a fresh lease
	// token and, only when it found fewer than asked, also reports how long
	// until the domain's next scheduled job is due (database clock) and
	// whether due jobs exist that it skipped because another transaction
	// held them locked. The function keeps its plans for the session.
	s.claimSQL = `SELECT * FROM ` + pgx.Identifier{s.Schema, "claim"}.Sanitize() + `($1::text[], $2::jsonb, $3::integer, $4::bigint, $5::text)`

	// The finish. Fenced by id, lease token and state; a cancel request
	// turns a retry into cancelled. Without $10, rows of jobs with
	// dependents are refused: those finish in a transaction that also
	// releases their dependents (FinishWithDependents).
	s.finishSQL = `WITH f AS (
	SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $5::integer[], $6::jsonb[], $7::text[])
	       AS t(id, token, state, delay_ms, attempt_delta, result, err)
), done AS (
	UPDATE ` + s.jobs + ` j SET
		state = CASE WHEN j.cancel_requested AND f.state = 'available' THEN 'cancelled' ELSE f.state END,
		run_at = CASE WHEN f.state = 'available' AND f.delay_ms >= 0 THEN now() + f.delay_ms * interval '1 millisecond' ELSE j.run_at END,
		attempt = j.attempt + f.attempt_delta,
		result = f.result,
		last_error = CASE WHEN j.cancel_requested AND f.state = 'available' THEN COALESCE(f.err, 'cancelled') ELSE COALESCE(f.err, j.last_error) END,
		errors = CASE WHEN f.err IS NULL THEN j.errors ELSE ` + errorsAppend("j.attempt", "f.err") + ` END,
		lease_token = NULL, lease_expires_at = NULL,
		finished_at = CASE WHEN f.state IN ('completed', 'failed', 'cancelled') OR j.cancel_requested THEN now() END
	FROM f WHERE j.id = f.id AND j.lease_token = f.token AND j.state = 'running' AND (NOT j.has_dependents OR $10::boolean)
	RETURNING j.id, j.state, j.has_dependents, j.notify_done
)
SELECT d.id, d.state, d.has_dependents FROM done d
UNION ALL
SELECT NULL::uuid, NULL::text, NULL::boolean FROM (SELECT pg_notify($8, p) FROM unnest($9::text[]) AS p) n
UNION ALL
SELECT NULL::uuid, NULL::text, NULL::boolean FROM (
	SELECT pg_notify($8, json_build_object('done', d.id)::text) FROM done d WHERE d.notify_done AND d.state IN ('completed', 'failed', 'cancelled')) w`

	s.refusedSQL = `SELECT j.id FROM ` + s.jobs + ` j JOIN unnest($1::uuid[], $2::uuid[]) AS t(id, token) ON j.id = t.id
WHERE j.lease_token = t.token AND j.state = 'running' AND j.has_dependents`

	// Lease renewal skips rows another transaction holds (the completer
	// finishing them, typically): it never waits, so it cannot deadlock
	// with a finish, and it reports those rows as busy rather than lost.
	s.extendSQL = `WITH t AS (
	SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS t(id, token)
), l AS (
	SELECT j.id FROM ` + s.jobs + ` j JOIN t ON j.id = t.id
	WHERE j.lease_token = t.token AND j.state = 'running'
	ORDER BY j.id FOR NO KEY UPDATE OF j SKIP LOCKED
), u AS (
	UPDATE ` + s.jobs + ` j SET lease_expires_at = now() + $3 * interval '1 millisecond'
	FROM l WHERE j.id = l.id
	RETURNING j.id, j.cancel_requested
)
SELECT u.id, u.cancel_requested, true FROM u
UNION ALL
SELECT j.id, false, false FROM ` + s.jobs + ` j JOIN t ON j.id = t.id
WHERE j.lease_token = t.token AND j.state = 'running' AND j.id NOT IN (SELECT id FROM u)`

	s.sweepSQL = `WITH expired AS (
	SELECT id FROM ` + s.jobs + ` WHERE state = 'running' AND lease_expires_at < now() AND (NOT has_dependents OR $3::boolean)
	LIMIT $1 FOR UPDATE SKIP LOCKED
), swept AS (
	UPDATE ` + s.jobs + ` j SET
		state = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'available' END,
		last_error = 'lease expired: worker ' || COALESCE(j.worker, '?') || ' stopped renewing it',
		errors = ` + errorsAppend("j.attempt", "'lease expired: worker ' || COALESCE(j.worker, '?') || ' stopped renewing it'") + `,
		lease_token = NULL, lease_expires_at = NULL, worker = NULL,
		finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END
	FROM expired WHERE j.id = expired.id
	RETURNING j.id, j.state, j.type, j.tags, j.has_dependents, j.notify_done
)
SELECT s.id, s.state, s.has_dependents FROM swept s
UNION ALL
SELECT NULL::uuid, NULL::text, NULL::boolean FROM (SELECT pg_notify($2, json_build_object('type', type, 'tags', tags)::text)
	FROM (SELECT DISTINCT type, tags FROM swept WHERE state = 'available') d) n
UNION ALL
SELECT NULL::uuid, NULL::text, NULL::boolean FROM (SELECT pg_notify($2, json_build_object('done', id)::text)
	FROM swept WHERE notify_done AND state <> 'available') w
UNION ALL
SELECT NULL::uuid, 'dependents', NULL::boolean WHERE NOT $3::boolean AND EXISTS (
	SELECT 1 FROM ` + s.jobs + ` WHERE state = 'running' AND lease_expires_at < now() AND has_dependents)`

	s.getSQL = `SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
	COALESCE(worker, ''), result, COALESCE(last_error, ''), errors, created_at, started_at, finished_at
FROM ` + s.jobs + ` WHERE id = $1`

	s.notifySQL = `SELECT count(*) FROM (SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p) n`
	// set_config(…, true) lasts until the end of the statement's implicit
	// transaction, whose commit then skips the WAL flush wait.
	s.notifyAsyncSQL = `SELECT count(*) FROM (SELECT set_config('synchronous_commit', 'off', true)) c,
	LATERAL (SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p) n`
	s.buildGraph()
}

// NewJob is one row to insert.
type NewJob struct {
	ID          uuid.UUID
	Type        string
	Args        json.RawMessage
	Tags        json.RawMessage
	Priority    int16
	RunAt       *time.Time    // absolute start time, or nil
	Delay       time.Duration // start after now() + Delay when RunAt is nil
	MaxAttempts int32
	Timeout     time.Duration
}

// Insert writes jobs in one statement and, in the same statement, sends the
// given NOTIFY payloads (delivered when the surrounding transaction commits).
func (s *Store) Insert(ctx context.Context, db DB, jobs []NewJob, payloads []string) error {
	n := len(jobs)
	ids := make([]uuid.UUID, n)
	types := make([]string, n)
	args := make([]json.RawMessage, n)
	tags := make([]json.RawMessage, n)
	prios := make([]int16, n)
	runAts := make([]*time.Time, n)
	delays := make([]int64, n)
	maxAtt := make([]int32, n)
	timeouts := make([]int64, n)
	for i, j := range jobs {
		ids[i], types[i], args[i], tags[i] = j.ID, j.Type, j.Args, j.Tags
		prios[i], runAts[i], maxAtt[i] = j.Priority, j.RunAt, j.MaxAttempts
		delays[i] = j.Delay.Milliseconds()
		timeouts[i] = j.Timeout.Milliseconds()
	}
	if payloads == nil {
		payloads = []string{}
	}
	var inserted, notified int64
	params := []any{ids16(ids), types, args, tags, prios, runAts, delays, maxAtt, timeouts, s.Channel, payloads}
	// [16]byte IDs need the server's parameter types: modes that do not
	// ask for them (exec, simple protocol) use the describe mode instead.
	if m := s.Pool.Config().ConnConfig.DefaultQueryExecMode; m == pgx.QueryExecModeExec || m == pgx.QueryExecModeSimpleProtocol {
		params = append([]any{Mode}, params...)
	}
	err := db.QueryRow(ctx, s.insertSQL, params...).Scan(&inserted, &notified)
	if err != nil {
		return err
	}
	if inserted != int64(n) {
		return fmt.Errorf("inserted %d of %d jobs", inserted, n)
	}
	return nil
}

// Claimed is one job a claim took, under its fresh lease token.
type Claimed struct {
	ID          uuid.UUID
	Type        string
	Args        json.RawMessage
	Tags        map[string]string
	Attempt     int
	MaxAttempts int
	Priority    int
	Timeout     time.Duration
	Token       uuid.UUID
	CreatedAt   time.Time
	RunAt       time.Time
	Waited      time.Duration // from run_at to the claim, on the database clock
}

// ClaimResult is what one claim statement took.
type ClaimResult struct {
	Jobs []Claimed
	// Next is, when fewer than k jobs were taken, the time until the
	// earliest future run_at of a job the domain could take; < 0: none.
	Next time.Duration
	// Skipped reports, when fewer than k jobs were taken, that due jobs
	// exist which the claim skipped because they were locked.
	Skipped bool
}

// Claim locks up to k due jobs of the given types whose tags are a subset of
// workerTags and leases them to worker for lease.
func (s *Store) Claim(ctx context.Context, types []string, workerTags json.RawMessage, k int, lease time.Duration, worker string) (ClaimResult, error) {
	res := ClaimResult{Next: -1}
	rows, err := s.Pool.Query(ctx, s.claimSQL, Mode, types, workerTags, k, lease.Milliseconds(), worker)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, token       *[16]byte
			typ             *string
			args, tags      []byte
			attempt, maxAtt *int32
			prio            *int16
			timeoutMS       *int64
			created, runAt  *time.Time
			waitedUS        *int64
			nextMS          *int64
			skipped         *bool
		)
		if err := rows.Scan(&id, &typ, &args, &tags, &attempt, &maxAtt, &prio, &timeoutMS, &token, &created, &runAt,
			&waitedUS, &nextMS, &skipped); err != nil {
			return res, err
		}
		if nextMS != nil {
			res.Next = max(0, time.Duration(*nextMS)*time.Millisecond)
		}
		if skipped != nil {
			res.Skipped = *skipped
		}
		if id == nil {
			continue // the row that only carries next_ms
		}
		c := Claimed{ID: *id, Type: *typ, Args: args, Attempt: int(*attempt), MaxAttempts: int(*maxAtt),
			Priority: int(*prio), Timeout: time.Duration(*timeoutMS) * time.Millisecond, Token: *token,
			CreatedAt: *created, RunAt: *runAt, Waited: time.Duration(*waitedUS) * time.Microsecond}
		if string(tags) != "{}" { // most jobs are untagged: skip the decoder
			if err := json.Unmarshal(tags, &c.Tags); err != nil {
				return res, fmt.Errorf("decoding tags of job %s: %w", c.ID, err)
			}
		}
		res.Jobs = append(res.Jobs, c)
	}
	return res, rows.Err()
}

// Finish is one fenced terminal or retry write.
type Finish struct {
	ID           uuid.UUID
	Token        uuid.UUID
	State        string        // completed, failed, cancelled or available
	Delay        time.Duration // for available: run again at now() + Delay; < 0 keeps run_at (a release)
	AttemptDelta int           // -1 gives the attempt back (snooze, release)
	Result       json.RawMessage
	Err          *string // appended to the error history when set
}

// Finished is the result of one finish write that took effect.
type Finished struct {
	State         string
	HasDependents bool
}

// Finish writes outcomes in one statement on db. Each write is fenced by
// id, lease token and state = 'running'; it returns the writes that took
// effect. Payloads are NOTIFY postings for jobs made available again. With
// allowDeps false, jobs that have dependents are refused too: Finish them
// again with FinishWithDependents.
func (s *Store) Finish(ctx context.Context, db DB, fs []Finish, payloads []string, allowDeps bool) (map[uuid.UUID]Finished, error) {
	// In ID order, so concurrent writers that also lock in ID order (an
	// enqueue adding dependents) cannot deadlock with it.
	fs = append([]Finish(nil), fs...)
	sort.Slice(fs, func(i, j int) bool { return bytes.Compare(fs[i].ID[:], fs[j].ID[:]) < 0 })
	n := len(fs)
	ids := make([]uuid.UUID, n)
	tokens := make([]uuid.UUID, n)
	states := make([]string, n)
	delays := make([]int64, n)
	deltas := make([]int32, n)
	results := make([]json.RawMessage, n)
	errs := make([]*string, n)
	for i, f := range fs {
		ids[i], tokens[i], states[i] = f.ID, f.Token, f.State
		delays[i], deltas[i] = f.Delay.Milliseconds(), int32(f.AttemptDelta)
		if f.Delay < 0 {
			delays[i] = -1 // keep run_at
		}
		results[i], errs[i] = f.Result, f.Err
	}
	if payloads == nil {
		payloads = []string{}
	}
	rows, err := db.Query(ctx, s.finishSQL, Mode, ids16(ids), ids16(tokens), states, delays, deltas, results, errs, s.Channel, payloads, allowDeps)
	if err != nil {
		return nil, err
	}
	return scanFinished(rows)
}

// scanFinished reads (id, state, has_dependents) rows; rows with a NULL id
// (those that only carried a pg_notify) are skipped.
func scanFinished(rows pgx.Rows) (map[uuid.UUID]Finished, error) {
	out := map[uuid.UUID]Finished{}
	var (
		id    *[16]byte
		state *string
		deps  *bool
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &state, &deps}, func() error {
		if id != nil {
			out[*id] = Finished{State: *state, HasDependents: *deps}
		}
		return nil
	})
	return out, err
}

// endedWithDependents returns the jobs that reached a terminal state and
// have dependents to release.
func endedWithDependents(fs map[uuid.UUID]Finished) []uuid.UUID {
	var out []uuid.UUID
	for id, f := range fs {
		if f.State != "available" && f.HasDependents {
			out = append(out, id)
		}
	}
	return out
}

// RefusedForDependents returns which of the given leases are still held by
// jobs that have dependents (their Finish was refused for that reason, not
// because the lease was lost).
func (s *Store) RefusedForDependents(ctx context.Context, ids, tokens []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := s.Pool.Query(ctx, s.refusedSQL, Mode, ids16(ids), ids16(tokens))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// FinishWithDependents writes outcomes of jobs that have dependents and, in
// the same transaction, releases (or cancels) their dependents.
func (s *Store) FinishWithDependents(ctx context.Context, fs []Finish, payloads []string) (map[uuid.UUID]Finished, error) {
	var out map[uuid.UUID]Finished
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		// Statement one takes the row locks (waiting for any transaction
		// that is adding a dependent); the release below runs on a newer
		// snapshot and so sees every edge committed before.
		if out, err = s.Finish(ctx, tx, fs, payloads, true); err != nil {
			return err
		}
		return s.Release(ctx, tx, endedWithDependents(out))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Extended reports one lease a heartbeat found still held.
type Extended struct {
	ID              uuid.UUID
	CancelRequested bool
	// Renewed is false when the row was locked by another transaction
	// (being finished, typically): still held, but not renewed this time.
	Renewed bool
}

// Extend renews the leases given by ids and tokens to now() + lease, fenced
// like Finish. It returns the leases still held; the others are lost.
func (s *Store) Extend(ctx context.Context, ids, tokens []uuid.UUID, lease time.Duration) ([]Extended, error) {
	rows, err := s.Pool.Query(ctx, s.extendSQL, Mode, ids16(ids), ids16(tokens), lease.Milliseconds())
	if err != nil {
		return nil, err
	}
	var out []Extended
	var id [16]byte
	var e Extended
	_, err = pgx.ForEachRow(rows, []any{&id, &e.CancelRequested, &e.Renewed}, func() error {
		e.ID = id
		out = append(out, e)
		return nil
	})
	return out, err
}

// SweepExpired returns up to limit running jobs whose lease has expired to
// available, keeping their run_at so they go ahead of jobs due later (or to
// failed, when their attempts are used up; cancelled when a cancel was
// requested), and notifies the domains that can take them. It returns how
// many it swept. One statement does it, unless expired jobs
// have dependents: those are swept in a transaction that also releases
// (or cancels) their dependents.
func (s *Store) SweepExpired(ctx context.Context, limit int) (int, error) {
	n, withDeps, err := s.sweep(ctx, s.Pool, limit, false)
	if err != nil || !withDeps {
		return n, err
	}
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		m, _, err := s.sweep(ctx, tx, limit, true)
		n += m
		return err
	})
	return n, err
}

// sweep runs the sweep statement once on db. With allowDeps (inside a
// transaction) it also takes jobs with dependents and releases them.
func (s *Store) sweep(ctx context.Context, db DB, limit int, allowDeps bool) (n int, withDeps bool, err error) {
	rows, err := db.Query(ctx, s.sweepSQL, Mode, limit, s.Channel, allowDeps)
	if err != nil {
		return 0, false, err
	}
	done := map[uuid.UUID]Finished{}
	var (
		id    *[16]byte
		state *string
		deps  *bool
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &state, &deps}, func() error {
		switch {
		case id != nil:
			done[*id] = Finished{State: *state, HasDependents: *deps}
		case state != nil: // the marker row: expired jobs with dependents wait
			withDeps = true
		}
		return nil
	}); err != nil {
		return 0, false, err
	}
	if allowDeps {
		tx, ok := db.(pgx.Tx)
		if !ok {
			return 0, false, errors.New("sweeping jobs with dependents needs a transaction")
		}
		if err := s.Release(ctx, tx, endedWithDependents(done)); err != nil {
			return 0, false, err
		}
	}
	return len(done), withDeps, nil
}

// Notify sends NOTIFY postings in a transaction of their own: one
// statement, committed asynchronously (the postings need no durability), so
// the notification lock is held only for an instant.
func (s *Store) Notify(ctx context.Context, payloads []string) error {
	var n int64
	return s.Pool.QueryRow(ctx, s.notifyAsyncSQL, Mode, s.Channel, payloads).Scan(&n)
}

// NotifyTx sends NOTIFY postings inside tx (delivered at commit).
func (s *Store) NotifyTx(ctx context.Context, tx pgx.Tx, payloads []string) error {
	if len(payloads) == 0 {
		return nil
	}
	var n int64
	return tx.QueryRow(ctx, s.notifySQL, Mode, s.Channel, payloads).Scan(&n)
}

// Row is one job as Get reads it.
type Row struct {
	ID          uuid.UUID
	Type        string
	Args        json.RawMessage
	Tags        map[string]string
	State       string
	Priority    int
	RunAt       time.Time
	Attempt     int
	MaxAttempts int
	Timeout     time.Duration
	Worker      string
	Result      json.RawMessage
	LastError   string
	Errors      json.RawMessage
	CreatedAt   time.Time
	StartedAt   *time.Time
	FinishedAt  *time.Time
}

// Get reads one job, or returns ErrNotFound.
func (s *Store) Get(ctx context.Context, db DB, id uuid.UUID) (Row, error) {
	var (
		r         Row
		tags      []byte
		prio      int16
		att, maxA int32
		timeoutMS int64
	)
	err := db.QueryRow(ctx, s.getSQL, Mode, id).Scan(&r.ID, &r.Type, &r.Args, &tags, &r.State, &prio, &r.RunAt,
		&att, &maxA, &timeoutMS, &r.Worker, &r.Result, &r.LastError, &r.Errors, &r.CreatedAt, &r.StartedAt, &r.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotFound
	}
	if err != nil {
		return Row{}, err
	}
	r.Priority, r.Attempt, r.MaxAttempts = int(prio), int(att), int(maxA)
	r.Timeout = time.Duration(timeoutMS) * time.Millisecond
	if err := json.Unmarshal(tags, &r.Tags); err != nil {
		return Row{}, fmt.Errorf("decoding tags: %w", err)
	}
	return r, nil
}
