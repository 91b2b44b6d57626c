// Package store holds every SQL statement backlog runs and the code that
// binds and scans them. It knows nothing about handlers, domains or leases
// beyond what a statement needs.
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
//
// Postings (NOTIFY payloads on the schema's channel) have one format, the
// root package's posting type. Postings about available jobs are built in
// Go (encodePosting): statements that make jobs available return them
// (Avail) and the caller announces them after the commit (Notify,
// NotifyTx, or the insert's $11 for a quiet process's inline NOTIFY), so
// they are coalesced and bounded in one place. The postings statements
// here build in SQL are those that only the statement knows to send:
//   - completion notices for Queue.Wait ({"done":id}), sent by every
//     statement that ends a job someone waits for (the finish, the
//     expired-lease sweep, cancels, failed and cancelled dependents);
//   - cancel requests to the worker running a job ({"cancel":id});
//   - the insert's scheduled posting ({"sched":true,"in":ms}), sent with
//     the inline payloads.
//
// The schema's functions send some too: finish() its completion notices,
// enqueue() the postings of the job it inserts. Every payload built in SQL
// comes from one function, the schema's posting() (migration 0019, which
// mirrors encodePosting; see postingSQL), never from json_build_object
// or text written by hand: posting_sql_test.go in the root package holds
// posting() to encodePosting, and TestPostingsBuiltByPostingFunction here
// holds every statement to posting().
package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode is the query execution mode of every statement that reads the jobs
// table.
const Mode = pgx.QueryExecModeCacheDescribe

// MaxErrors is how many attempt errors a job keeps; older ones are dropped.
const MaxErrors = 20

// ErrNotFound is returned for an unknown job ID.
var ErrNotFound = errors.New("job not found")

// DB is what a statement runs on: the pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store runs backlog's statements against one schema.
type Store struct {
	pool    *pgxpool.Pool
	schema  string
	channel string // NOTIFY channel of this schema
	jobs    string // quoted, schema-qualified jobs table (live jobs)
	history string // quoted, schema-qualified job_history table (finished jobs)
	edges   string // quoted, schema-qualified job_edges table
	inputs  string // quoted, schema-qualified job_inputs table (prerequisites' results)

	// Retention of finished jobs, written into job_history's expires_at.
	keepCompleted, keepFailed time.Duration

	// explain, when set (by tests), sees every listing statement before it
	// runs.
	explain func(sql string, args []any)

	// The pool's default isolation, once known (strictSessions).
	isoMu               sync.Mutex
	isoKnown, isoStrict bool
	// pipelines: the pool's default query mode describes statements, so
	// a batch may carry [16]byte parameters (the pool's config, read once:
	// Config copies it).
	pipelines bool

	sql struct {
		insert, insertKeyed, insertMeta, claim, get, notify, notifyAsync, now string
	}
	fin     finishSQL
	graph   graphSQL
	maint   maintSQL
	hist    historySQL
	counts  countsSQL
	control controlSQL
	retry   retrySQL
	procs   procSQL
	sched   schedSQL
	in      inputsSQL
	okeys   orderKeysSQL
	nb      neighboursSQL
}

// postingSQL is the SQL expression of a posting's payload: a call of the
// schema's posting() (migration 0019), the one definition of the payload
// format in SQL, with args, its named arguments (p_type, p_tags, p_sched,
// p_in_ms, p_cancel, p_done), e.g. "p_done => j.id". PostgreSQL inlines
// the call, so it costs what the expression it stands for costs.
func (s *Store) postingSQL(args string) string {
	return pgx.Identifier{s.schema, "posting"}.Sanitize() + "(" + args + ")"
}

// ChannelName is the NOTIFY channel used for a schema.
func ChannelName(schema string) string { return schema + ".backlog" }

// New prepares the statement texts for schema, which the caller has already
// validated as a plain identifier.
func New(pool *pgxpool.Pool, schema string) *Store {
	s := &Store{pool: pool, schema: schema, channel: ChannelName(schema), keepCompleted: 24 * time.Hour, keepFailed: 7 * 24 * time.Hour}
	if pool != nil { // nil: a store for statement text only (tests)
		m := pool.Config().ConnConfig.DefaultQueryExecMode
		s.pipelines = m == pgx.QueryExecModeCacheStatement || m == pgx.QueryExecModeCacheDescribe
	}
	s.jobs = pgx.Identifier{schema, "jobs"}.Sanitize()
	s.history = pgx.Identifier{schema, "job_history"}.Sanitize()
	s.edges = pgx.Identifier{schema, "job_edges"}.Sanitize()
	s.inputs = pgx.Identifier{schema, "job_inputs"}.Sanitize()
	s.buildCore()
	s.buildFinish()
	s.buildGraph()
	s.buildOrderKeys()
	s.buildInputs()
	s.buildNeighbours()
	s.buildMaintenance()
	s.buildHistory()
	s.buildCounts()
	s.buildControl()
	s.buildRetry()
	s.buildProcesses() // after buildFinish: it extends the lease renewal
	s.buildSchedules()
	return s
}

// SetRetention sets how long finished jobs are kept: completed ones, and
// failed or cancelled ones. Call it before the store is used.
func (s *Store) SetRetention(completed, failed time.Duration) {
	s.keepCompleted, s.keepFailed = completed, failed
}

// Schema is the store's schema.
func (s *Store) Schema() string { return s.schema }

// Channel is the NOTIFY channel of the store's schema.
func (s *Store) Channel() string { return s.channel }

// Pool is the pool the store runs on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// insertStatement is the insert of a batch of jobs, with their
// concurrency keys ($12) when keyed, and their metadata ($13) too when
// meta.
func (s *Store) insertStatement(keyed, meta bool) string {
	var cols, sel, from, params string
	if keyed {
		cols, sel, from, params = ", concurrency_key", ", t.concurrency_key", ", u.concurrency_key", ", $12::text[]"
	}
	if meta {
		cols, sel, from, params = cols+", meta", sel+", t.meta", from+", u.meta", params+", $13::jsonb[]"
	}
	return `WITH ins AS (
	INSERT INTO ` + s.jobs + ` (id, type, args, tags, priority, run_at, max_attempts, timeout_ms, state` + cols + `)
	SELECT t.id, t.type, t.args, t.tags, t.priority, t.run_at, t.max_attempts, t.timeout_ms,
	       CASE WHEN t.run_at > now() THEN 'scheduled' ELSE 'available' END` + sel + `
	FROM (SELECT u.id, u.type, u.args, u.tags, u.priority, COALESCE(u.run_at, now() + u.delay_ms * interval '1 millisecond') AS run_at,
	             u.max_attempts, u.timeout_ms` + from + `
	      FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::smallint[], $6::timestamptz[], $7::bigint[], $8::integer[], $9::bigint[]` + params + `)
	           AS u(id, type, args, tags, priority, run_at, delay_ms, max_attempts, timeout_ms` + cols + `)) t
	RETURNING state, run_at
), agg AS (
	SELECT count(*) AS n, count(*) FILTER (WHERE state = 'available') AS avail,
	       ceil(extract(epoch FROM min(run_at) FILTER (WHERE state = 'scheduled') - now()) * 1000)::bigint AS sched_ms
	FROM ins
)
SELECT a.n, a.avail, a.sched_ms,
       (SELECT count(*) FROM (SELECT pg_notify($10, p) FROM unnest($11::text[]) AS p WHERE a.avail > 0) n)
     + (SELECT count(*) FROM (SELECT pg_notify($10, ` + s.postingSQL("p_sched => true, p_in_ms => greatest(a.sched_ms, 0)") + `)
                              WHERE a.sched_ms IS NOT NULL AND cardinality($11::text[]) > 0) s)
FROM agg a`
}

func (s *Store) buildCore() {
	// A job due later (by the database clock) is inserted scheduled: the
	// promoter makes it available when it is due. The statement reports
	// how many jobs it made available and when the earliest scheduled one
	// is due, and, when $11 holds payloads (a quiet process's inline
	// NOTIFY), sends them if a job was made available, and a scheduled
	// posting if one was scheduled.
	s.sql.insert = s.insertStatement(false, false)
	// The same, with the jobs' concurrency keys ($12).
	s.sql.insertKeyed = s.insertStatement(true, false)
	// The same, with the jobs' concurrency keys ($12) and metadata ($13):
	// for calls where a job has metadata.
	s.sql.insertMeta = s.insertStatement(true, true)

	// The claim is the function claim() of migration 0004: it locks up to
	// $3 due jobs of the domain, marks them running under a fresh lease
	// token and, only when it found fewer than asked, also reports how long
	// until the domain's next scheduled job is due (database clock) and
	// whether due jobs exist that it skipped because another transaction
	// held them locked. The function keeps its plans for the session.
	// claim_jobs (migrations 0011 and 0012) is that claim returning each
	// job's metadata and prerequisites too; since 0028 it is passed the
	// caller's ended jobs ($7), since 0029 how many standby jobs it may
	// take ($8).
	s.sql.claim = `SELECT * FROM ` + pgx.Identifier{s.schema, "claim_jobs"}.Sanitize() + `($1::text[], $2::jsonb, $3::integer, $4::integer, $5::bigint, $6::text, $7::uuid[], $8::integer)`

	// A job is in jobs while live and in job_history once finished (the
	// move is one transaction, so one snapshot sees it in exactly one).
	getCols := `id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
	COALESCE(worker, ''), result, COALESCE(last_error, ''), errors, created_at, started_at, finished_at,
	COALESCE(ordering_key, ''), COALESCE(unique_key, ''), COALESCE(concurrency_key, ''), meta, progress`
	s.sql.get = `SELECT ` + getCols + ` FROM ` + s.jobs + ` WHERE id = $1
UNION ALL
SELECT ` + getCols + ` FROM ` + s.history + ` WHERE id = $1
LIMIT 1`

	s.sql.notify = `SELECT count(*) FROM (SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p) n`
	// set_config(…, true) lasts until the end of the statement's implicit
	// transaction, whose commit then skips the WAL flush wait.
	s.sql.notifyAsync = `SELECT count(*) FROM (SELECT set_config('synchronous_commit', 'off', true)) c,
	LATERAL (SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p) n`
	s.sql.now = `SELECT now()`
}

// ids16 converts IDs for binding: pgx encodes [16]byte natively, while
// uuid.UUID goes through driver.Valuer and a failed fast path per element.
func ids16(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// errorsAppend is the SQL expression that appends one attempt's entry to
// j.errors, keeping at most MaxErrors entries: its error and, as finish()
// writes them since migration 23, the attempt's worker, start, run time
// (ms) and outcome. attempt, errText and outcome are SQL expressions; the
// outcome is never derived from the error text (the process decides it,
// see Finish.Outcome).
func errorsAppend(attempt, errText, outcome string) string {
	return fmt.Sprintf(`(CASE WHEN jsonb_array_length(j.errors) >= %d THEN j.errors - 0 ELSE j.errors END)
		|| jsonb_build_array(jsonb_build_object('attempt', %s, 'at', now(), 'error', %s, 'worker', j.worker,
		'started_at', j.started_at, 'ms', round(extract(epoch FROM now() - j.started_at) * 1000)::bigint, 'outcome', %s))`,
		MaxErrors, attempt, errText, outcome)
}

// Avail is a job a statement made available (now or at RunAt): what a
// posting announces.
type Avail struct {
	Type  string
	Tags  json.RawMessage
	RunAt time.Time // on the database clock
	In    time.Duration
	// Scheduled: the job waits as scheduled until In has passed (the
	// promoter's concern); else it is available now.
	Scheduled bool
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
	// ConcurrencyKey groups the job with others for flow control ("":
	// none).
	ConcurrencyKey string
	// Meta is the job's metadata, a JSON object of strings (nil: none,
	// stored as NULL).
	Meta json.RawMessage
}

// InsertResult is what an Insert wrote, as the database decided it.
type InsertResult struct {
	// Available is how many jobs were inserted due (state available).
	Available int
	// SchedIn is when the earliest job inserted as scheduled is due; < 0:
	// none was.
	SchedIn time.Duration
}

// Insert writes jobs in one statement. With payloads (NOTIFY postings of
// the jobs' types and tags), the same statement sends them when a job was
// made available, and a scheduled posting when one was scheduled
// (delivered when the surrounding transaction commits).
func (s *Store) Insert(ctx context.Context, db DB, jobs []NewJob, payloads []string) (InsertResult, error) {
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
	var inserted, avail, notified int64
	var schedMS *int64
	params := []any{ids16(ids), types, args, tags, prios, runAts, delays, maxAtt, timeouts, s.channel, payloads}
	q := s.sql.insert
	for i, j := range jobs {
		if j.ConcurrencyKey == "" {
			continue
		}
		// Jobs with concurrency keys: the statement with the column.
		keys := make([]*string, n)
		for x := i; x < n; x++ {
			if jobs[x].ConcurrencyKey != "" {
				keys[x] = &jobs[x].ConcurrencyKey
			}
		}
		params, q = append(params, keys), s.sql.insertKeyed
		break
	}
	for i, j := range jobs {
		if j.Meta == nil {
			continue
		}
		// Jobs with metadata: the statement with both columns.
		if q == s.sql.insert {
			params = append(params, make([]*string, n))
		}
		metas := make([]json.RawMessage, n) // nil: NULL
		for x := i; x < n; x++ {
			metas[x] = jobs[x].Meta
		}
		params, q = append(params, metas), s.sql.insertMeta
		break
	}
	// [16]byte IDs need the server's parameter types: modes that do not
	// ask for them (exec, simple protocol) use the describe mode instead.
	if m := s.pool.Config().ConnConfig.DefaultQueryExecMode; m == pgx.QueryExecModeExec || m == pgx.QueryExecModeSimpleProtocol {
		params = append([]any{Mode}, params...)
	}
	res := InsertResult{SchedIn: -1}
	err := db.QueryRow(ctx, q, params...).Scan(&inserted, &avail, &schedMS, &notified)
	if err != nil {
		return res, err
	}
	if inserted != int64(n) {
		return res, fmt.Errorf("inserted %d of %d jobs", inserted, n)
	}
	res.Available = int(avail)
	if schedMS != nil {
		res.SchedIn = max(0, time.Duration(*schedMS)*time.Millisecond)
	}
	return res, nil
}

// ExistingIDs returns those of ids that name a job, live or finished.
// job_history is searched by ranges of IDs, one per cluster of IDs made
// within a second of each other (UUIDv7 IDs sort by time): its BRIN index
// answers a range with one scan of the index, where "id = ANY(ids)" would
// scan the whole index once per ID.
func (s *Store) ExistingIDs(ctx context.Context, db DB, ids []uuid.UUID) ([]uuid.UUID, error) {
	lo, hi := idRanges(ids, 1000)
	rows, err := db.Query(ctx, `SELECT id FROM `+s.jobs+` WHERE id = ANY($1::uuid[])
UNION ALL SELECT h.id FROM unnest($2::uuid[], $3::uuid[]) AS r(lo, hi)
CROSS JOIN LATERAL (SELECT id FROM `+s.history+` WHERE id BETWEEN r.lo AND r.hi AND (id = ANY($1::uuid[])) IS TRUE) h`,
		Mode, ids16(ids), ids16(lo), ids16(hi))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// idRanges cuts ids, in order, into ranges whose neighbouring IDs' UUIDv7
// times lie at most gapMS apart.
func idRanges(ids []uuid.UUID, gapMS int64) (lo, hi []uuid.UUID) {
	sorted := slices.Clone(ids)
	slices.SortFunc(sorted, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	for i, id := range sorted {
		if i == 0 || v7ms(id)-v7ms(sorted[i-1]) > gapMS {
			lo, hi = append(lo, id), append(hi, id)
			continue
		}
		hi[len(hi)-1] = id
	}
	return lo, hi
}

// v7ms is the millisecond time of a UUIDv7.
func v7ms(id uuid.UUID) int64 {
	return int64(binary.BigEndian.Uint64(append([]byte{0, 0}, id[:6]...)))
}

// Notify sends NOTIFY postings in a transaction of their own: one
// statement, committed asynchronously (the postings need no durability), so
// the notification lock is held only for an instant.
func (s *Store) Notify(ctx context.Context, payloads []string) error {
	var n int64
	return s.pool.QueryRow(ctx, s.sql.notifyAsync, Mode, s.channel, payloads).Scan(&n)
}

// NotifyTx sends NOTIFY postings inside tx (delivered at commit).
func (s *Store) NotifyTx(ctx context.Context, tx DB, payloads []string) error {
	if len(payloads) == 0 {
		return nil
	}
	var n int64
	return tx.QueryRow(ctx, s.sql.notify, Mode, s.channel, payloads).Scan(&n)
}

// Now returns the database clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := s.pool.QueryRow(ctx, s.sql.now, Mode).Scan(&t)
	return t, err
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
	// The job's keys ("": none).
	OrderingKey, UniqueKey, ConcurrencyKey string
	// Meta is the job's metadata (nil: none).
	Meta map[string]string
	// Progress is Job.SetProgress's latest value (nil: none).
	Progress json.RawMessage
}

// Get reads one job, or returns ErrNotFound.
func (s *Store) Get(ctx context.Context, db DB, id uuid.UUID) (Row, error) {
	var (
		r         Row
		tags      []byte
		prio      int16
		att, maxA int32
		timeoutMS int64
		meta      []byte
	)
	err := db.QueryRow(ctx, s.sql.get, Mode, id).Scan(&r.ID, &r.Type, &r.Args, &tags, &r.State, &prio, &r.RunAt,
		&att, &maxA, &timeoutMS, &r.Worker, &r.Result, &r.LastError, &r.Errors, &r.CreatedAt, &r.StartedAt, &r.FinishedAt,
		&r.OrderingKey, &r.UniqueKey, &r.ConcurrencyKey, &meta, &r.Progress)
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
	if meta != nil {
		if err := json.Unmarshal(meta, &r.Meta); err != nil {
			return Row{}, fmt.Errorf("decoding metadata: %w", err)
		}
	}
	return r, nil
}

// TxID returns the ID of tx's transaction (assigning one if needed).
func (s *Store) TxID(ctx context.Context, tx DB) (int64, error) {
	var x int64
	err := tx.QueryRow(ctx, `SELECT txid_current()`, Mode).Scan(&x)
	return x, err
}

// TxEnded returns, for each of the given transaction IDs that has ended,
// whether it committed. A transaction too old for the server to know is
// reported as committed.
func (s *Store) TxEnded(ctx context.Context, xids []int64) (map[int64]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT x, txid_status(x) FROM unnest($1::bigint[]) AS x`, Mode, xids)
	if err != nil {
		return nil, err
	}
	out := map[int64]bool{}
	var x int64
	var status *string
	_, err = pgx.ForEachRow(rows, []any{&x, &status}, func() error {
		switch {
		case status == nil, *status == "committed":
			out[x] = true
		case *status == "aborted":
			out[x] = false
		}
		return nil
	})
	return out, err
}
