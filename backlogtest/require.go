package backlogtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testbridge"
)

// Want is what a job must be like to match. Its zero value (and nil)
// matches any job of the type; every field set narrows the match.
type Want struct {
	// Args, when not nil, must be a JSON subset of the job's args. Args is
	// encoded with encoding/json (json.RawMessage and []byte are taken as
	// JSON text), then compared with the job's args: an object matches
	// when every key it has is in the job's object with a matching value
	// (other keys of the job are ignored), an array when it has the same
	// length and each element matches the job's element at the same
	// index, a number when it is numerically equal, any other value when
	// it is equal. So map[string]any{"to": "ada@example.com"} checks one
	// field, while the application's args struct checks every field it
	// encodes. For strict equality, decode the returned job with Args and
	// compare the values.
	Args any
	// Tags: every tag listed must be on the job with that value; the job
	// may have others.
	Tags map[string]string
	// The job's keys must equal these when they are not "".
	OrderingKey, UniqueKey, ConcurrencyKey string
	// Priority, when not nil, must equal the job's (new(5) makes one).
	Priority *int
	// MaxAttempts, when not 0, must equal the job's.
	MaxAttempts int
	// State, when not "", must equal the job's state.
	State backlog.State
	// RunAfter and RunBefore, when not zero, bound the job's run_at
	// (inclusive).
	RunAfter, RunBefore time.Time
}

// Expect is one job RequireManyEnqueued expects.
type Expect struct {
	Type string
	Want *Want // nil: any job of the type
}

// querier runs a query: a *pgxpool.Pool, a pgx.Tx, or a database/sql
// transaction through store.SQL.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// txQuerier reads through tx, any transaction EnqueueTx takes (see
// backlog.Tx); anything else fails t.
func txQuerier(t TB, fn string, tx backlog.Tx) querier {
	t.Helper()
	if r := reflect.ValueOf(tx); r.Kind() != reflect.Pointer || !r.IsNil() {
		switch tx := tx.(type) {
		case pgx.Tx:
			return tx
		case backlog.SQLTx:
			return store.SQL(tx)
		}
	}
	fatalf(t, "%s: tx is %T, neither a pgx.Tx nor a database/sql transaction (*sql.Tx, or a type with the methods of backlog.SQLTx)", fn, tx)
	return nil
}

// RequireEnqueued asserts that a job of type typ matching want was
// enqueued (committed) in q's schema, in any state, finished or not (use
// Want.State to require one), and returns it: the oldest match when there
// are several. Otherwise it fails t with a message that lists the jobs of
// the type that were enqueued, each with why it does not match, and the
// other types enqueued.
func RequireEnqueued(ctx context.Context, t TB, q *backlog.Queue, typ string, want *Want) *backlog.JobInfo {
	t.Helper()
	return requireEnqueued(ctx, t, q, testbridge.Pool(q), typ, want)
}

// RequireEnqueuedTx is RequireEnqueued reading through tx, so that it sees
// the jobs tx enqueued and has not committed yet (and, with REPEATABLE READ
// or SERIALIZABLE, only what tx's snapshot shows). tx is any transaction
// EnqueueTx takes: a pgx.Tx or a database/sql one, exactly as the doc of
// backlog.Tx lists them; anything else fails t.
func RequireEnqueuedTx(ctx context.Context, t TB, q *backlog.Queue, tx backlog.Tx, typ string, want *Want) *backlog.JobInfo {
	t.Helper()
	return requireEnqueued(ctx, t, q, txQuerier(t, "RequireEnqueuedTx", tx), typ, want)
}

func requireEnqueued(ctx context.Context, t TB, q *backlog.Queue, db querier, typ string, want *Want) *backlog.JobInfo {
	t.Helper()
	w, err := want.compile()
	if err != nil {
		fatalf(t, "RequireEnqueued(%q): %v", typ, err)
	}
	jobs, err := readJobs(ctx, q, db)
	if err != nil {
		fatalf(t, "RequireEnqueued(%q): %v", typ, err)
	}
	for _, j := range jobs {
		if j.Type == typ && w.mismatch(j) == "" {
			return j
		}
	}
	fatalf(t, "no job of type %q%s was enqueued.\n%s", typ, want.describe(), listing(jobs, []string{typ}, w))
	return nil
}

// RequireNotEnqueued asserts that no job of type typ matching want was
// enqueued (committed) in q's schema, in any state; otherwise it fails t,
// listing the jobs that match.
func RequireNotEnqueued(ctx context.Context, t TB, q *backlog.Queue, typ string, want *Want) {
	t.Helper()
	requireNotEnqueued(ctx, t, q, testbridge.Pool(q), typ, want)
}

// RequireNotEnqueuedTx is RequireNotEnqueued reading through tx (a
// backlog.Tx, as RequireEnqueuedTx takes).
func RequireNotEnqueuedTx(ctx context.Context, t TB, q *backlog.Queue, tx backlog.Tx, typ string, want *Want) {
	t.Helper()
	requireNotEnqueued(ctx, t, q, txQuerier(t, "RequireNotEnqueuedTx", tx), typ, want)
}

func requireNotEnqueued(ctx context.Context, t TB, q *backlog.Queue, db querier, typ string, want *Want) {
	t.Helper()
	w, err := want.compile()
	if err != nil {
		fatalf(t, "RequireNotEnqueued(%q): %v", typ, err)
	}
	jobs, err := readJobs(ctx, q, db)
	if err != nil {
		fatalf(t, "RequireNotEnqueued(%q): %v", typ, err)
	}
	var found []string
	for _, j := range jobs {
		if j.Type == typ && w.mismatch(j) == "" {
			found = append(found, "  - "+describeJob(j))
		}
	}
	if len(found) > 0 {
		fatalf(t, "%d job(s) of type %q%s were enqueued, want none:\n%s", len(found), typ, want.describe(), strings.Join(found, "\n"))
	}
}

// RequireManyEnqueued asserts that the jobs of the types named in want,
// in the order they were enqueued (creation time, then ID: IDs are
// UUIDv7, so jobs of one batch or one transaction keep their order), are
// exactly the jobs want describes, one to one. Jobs of other types are
// ignored. It returns the jobs, in want's order; on a mismatch it fails t,
// listing the jobs of those types with what each should have been.
func RequireManyEnqueued(ctx context.Context, t TB, q *backlog.Queue, want []Expect) []*backlog.JobInfo {
	t.Helper()
	return requireMany(ctx, t, q, testbridge.Pool(q), want)
}

// RequireManyEnqueuedTx is RequireManyEnqueued reading through tx (a
// backlog.Tx, as RequireEnqueuedTx takes).
func RequireManyEnqueuedTx(ctx context.Context, t TB, q *backlog.Queue, tx backlog.Tx, want []Expect) []*backlog.JobInfo {
	t.Helper()
	return requireMany(ctx, t, q, txQuerier(t, "RequireManyEnqueuedTx", tx), want)
}

func requireMany(ctx context.Context, t TB, q *backlog.Queue, db querier, want []Expect) []*backlog.JobInfo {
	t.Helper()
	if len(want) == 0 {
		fatalf(t, "RequireManyEnqueued: no job expected (use RequireNotEnqueued)")
	}
	ws := make([]*matcher, len(want))
	var types []string
	for i, e := range want {
		m, err := e.Want.compile()
		if err != nil {
			fatalf(t, "RequireManyEnqueued: job %d (%q): %v", i+1, e.Type, err)
		}
		ws[i] = m
		if !slices.Contains(types, e.Type) {
			types = append(types, e.Type)
		}
	}
	jobs, err := readJobs(ctx, q, db)
	if err != nil {
		fatalf(t, "RequireManyEnqueued: %v", err)
	}
	var got []*backlog.JobInfo
	for _, j := range jobs {
		if slices.Contains(types, j.Type) {
			got = append(got, j)
		}
	}
	var b strings.Builder
	bad := len(got) != len(want)
	for i := range max(len(got), len(want)) {
		var line string
		switch {
		case i >= len(got):
			line = fmt.Sprintf("  %d. missing: want %q%s", i+1, want[i].Type, want[i].Want.describe())
			bad = true
		case i >= len(want):
			line = fmt.Sprintf("  %d. %s: not expected", i+1, describeJob(got[i]))
		case got[i].Type != want[i].Type:
			line = fmt.Sprintf("  %d. %s: want type %q%s", i+1, describeJob(got[i]), want[i].Type, want[i].Want.describe())
			bad = true
		default:
			if why := ws[i].mismatch(got[i]); why != "" {
				line = fmt.Sprintf("  %d. %s: %s", i+1, describeJob(got[i]), why)
				bad = true
			} else {
				line = fmt.Sprintf("  %d. %s: ok", i+1, describeJob(got[i]))
			}
		}
		b.WriteString(line + "\n")
	}
	if bad {
		fatalf(t, "RequireManyEnqueued: want %d job(s) of types %q in this order, %d were enqueued:\n%s",
			len(want), types, len(got), strings.TrimSuffix(b.String(), "\n"))
	}
	return got
}

// Args decodes a job's args into a T, failing t when they do not decode.
func Args[T any](t TB, job *backlog.JobInfo) T {
	t.Helper()
	var v T
	if job == nil {
		fatalf(t, "Args: job is nil")
		return v
	}
	if err := json.Unmarshal(job.Args, &v); err != nil {
		fatalf(t, "Args: decoding the args of job %s (%s) into %T: %v", job.ID, job.Type, v, err)
	}
	return v
}

// maxListed bounds the jobs a failure message lists.
const maxListed = 20

// listing describes the jobs of types (with why each does not match w) and
// counts the others, for a failure message.
func listing(jobs []*backlog.JobInfo, types []string, w *matcher) string {
	var b strings.Builder
	others := map[string]int{}
	n := 0
	for _, j := range jobs {
		if !slices.Contains(types, j.Type) {
			others[j.Type]++
			continue
		}
		if n++; n <= maxListed {
			fmt.Fprintf(&b, "  - %s: %s\n", describeJob(j), w.mismatch(j))
		}
	}
	head := fmt.Sprintf("Jobs of type %q enqueued: %d", strings.Join(types, ", "), n)
	if n == 0 {
		head = fmt.Sprintf("No job of type %q was enqueued.", strings.Join(types, ", "))
	} else {
		head += ":"
	}
	if n > maxListed {
		fmt.Fprintf(&b, "  … and %d more\n", n-maxListed)
	}
	tail := "Jobs of other types: none."
	if len(others) > 0 {
		var parts []string
		for _, typ := range slices.Sorted(maps.Keys(others)) {
			parts = append(parts, fmt.Sprintf("%q (%d)", typ, others[typ]))
		}
		tail = "Jobs of other types: " + strings.Join(parts, ", ") + "."
	}
	if n == 0 {
		return head + "\n" + tail
	}
	return head + "\n" + b.String() + tail
}

// describeJob is one line about a job for a failure message.
func describeJob(j *backlog.JobInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s (%s, %s) args=%s", j.ID, j.Type, j.State, compactJSON(j.Args))
	if len(j.Tags) > 0 {
		tj, _ := json.Marshal(j.Tags)
		fmt.Fprintf(&b, " tags=%s", tj)
	}
	fmt.Fprintf(&b, " priority=%d max_attempts=%d run_at=%s", j.Priority, j.MaxAttempts, j.RunAt.UTC().Format(time.RFC3339Nano))
	for _, k := range [][2]string{{"ordering_key", j.OrderingKey}, {"unique_key", j.UniqueKey}, {"concurrency_key", j.ConcurrencyKey}} {
		if k[1] != "" {
			fmt.Fprintf(&b, " %s=%q", k[0], k[1])
		}
	}
	return b.String()
}

func compactJSON(raw []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// describe renders want for a failure message ("" for nil or empty).
func (w *Want) describe() string {
	if w == nil {
		return ""
	}
	var parts []string
	if w.Args != nil {
		if b, err := encodeJSON(w.Args); err == nil {
			parts = append(parts, "args ⊇ "+compactJSON(b))
		}
	}
	if len(w.Tags) > 0 {
		tj, _ := json.Marshal(w.Tags)
		parts = append(parts, "tags ⊇ "+string(tj))
	}
	for _, k := range [][2]string{{"ordering_key", w.OrderingKey}, {"unique_key", w.UniqueKey}, {"concurrency_key", w.ConcurrencyKey}} {
		if k[1] != "" {
			parts = append(parts, fmt.Sprintf("%s=%q", k[0], k[1]))
		}
	}
	if w.Priority != nil {
		parts = append(parts, fmt.Sprintf("priority=%d", *w.Priority))
	}
	if w.MaxAttempts != 0 {
		parts = append(parts, fmt.Sprintf("max_attempts=%d", w.MaxAttempts))
	}
	if w.State != "" {
		parts = append(parts, fmt.Sprintf("state=%s", w.State))
	}
	if !w.RunAfter.IsZero() {
		parts = append(parts, "run_at ≥ "+w.RunAfter.UTC().Format(time.RFC3339Nano))
	}
	if !w.RunBefore.IsZero() {
		parts = append(parts, "run_at ≤ "+w.RunBefore.UTC().Format(time.RFC3339Nano))
	}
	if len(parts) == 0 {
		return ""
	}
	return " matching {" + strings.Join(parts, ", ") + "}"
}

// matcher is a compiled Want.
type matcher struct {
	w    Want
	args any // decoded want.Args (UseNumber), when set
	has  bool
}

func (w *Want) compile() (*matcher, error) {
	if w == nil {
		return &matcher{}, nil
	}
	m := &matcher{w: *w}
	if w.Args != nil {
		b, err := encodeJSON(w.Args)
		if err != nil {
			return nil, fmt.Errorf("Want.Args: %w", err)
		}
		if m.args, err = decodeJSON(b); err != nil {
			return nil, fmt.Errorf("Want.Args: %w", err)
		}
		m.has = true
	}
	if w.Priority != nil && (*w.Priority < backlog.MinPriority || *w.Priority > backlog.MaxPriority) {
		return nil, fmt.Errorf("Want.Priority: %d is outside [%d, %d]", *w.Priority, backlog.MinPriority, backlog.MaxPriority)
	}
	if !w.RunAfter.IsZero() && !w.RunBefore.IsZero() && w.RunBefore.Before(w.RunAfter) {
		return nil, fmt.Errorf("Want.RunBefore (%s) is before Want.RunAfter (%s)", w.RunBefore, w.RunAfter)
	}
	return m, nil
}

// mismatch says why j does not match ("" when it does). The type is the
// caller's to check.
func (m *matcher) mismatch(j *backlog.JobInfo) string {
	w := &m.w
	var why []string
	if m.has {
		have, err := decodeJSON(j.Args)
		if err != nil {
			why = append(why, fmt.Sprintf("args do not decode: %v", err))
		} else if d := subset(m.args, have, ""); d != "" {
			why = append(why, "args "+d)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(w.Tags)) {
		v, ok := j.Tags[k]
		switch {
		case !ok:
			why = append(why, fmt.Sprintf("tag %q missing", k))
		case v != w.Tags[k]:
			why = append(why, fmt.Sprintf("tag %q is %q, want %q", k, v, w.Tags[k]))
		}
	}
	for _, k := range [][3]string{{"ordering_key", w.OrderingKey, j.OrderingKey}, {"unique_key", w.UniqueKey, j.UniqueKey},
		{"concurrency_key", w.ConcurrencyKey, j.ConcurrencyKey}} {
		if k[1] != "" && k[1] != k[2] {
			why = append(why, fmt.Sprintf("%s is %q, want %q", k[0], k[2], k[1]))
		}
	}
	if w.Priority != nil && *w.Priority != j.Priority {
		why = append(why, fmt.Sprintf("priority is %d, want %d", j.Priority, *w.Priority))
	}
	if w.MaxAttempts != 0 && w.MaxAttempts != j.MaxAttempts {
		why = append(why, fmt.Sprintf("max_attempts is %d, want %d", j.MaxAttempts, w.MaxAttempts))
	}
	if w.State != "" && w.State != j.State {
		why = append(why, fmt.Sprintf("state is %s, want %s", j.State, w.State))
	}
	if !w.RunAfter.IsZero() && j.RunAt.Before(w.RunAfter) {
		why = append(why, fmt.Sprintf("run_at %s is before %s", j.RunAt.UTC().Format(time.RFC3339Nano), w.RunAfter.UTC().Format(time.RFC3339Nano)))
	}
	if !w.RunBefore.IsZero() && j.RunAt.After(w.RunBefore) {
		why = append(why, fmt.Sprintf("run_at %s is after %s", j.RunAt.UTC().Format(time.RFC3339Nano), w.RunBefore.UTC().Format(time.RFC3339Nano)))
	}
	return strings.Join(why, "; ")
}

// encodeJSON encodes v, taking json.RawMessage and []byte as JSON text.
func encodeJSON(v any) ([]byte, error) {
	switch x := v.(type) {
	case json.RawMessage:
		return x, nil
	case []byte:
		return x, nil
	}
	return json.Marshal(v)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}

// subset says where want is not a JSON subset of have ("" when it is);
// path is where they are, for the message.
func subset(want, have any, path string) string {
	at := path
	if at == "" {
		at = "."
	}
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return fmt.Sprintf("at %s: want an object, have %s", at, render(have))
		}
		for _, k := range slices.Sorted(maps.Keys(w)) {
			hv, ok := h[k]
			if !ok {
				return fmt.Sprintf("at %s: key %q missing (want %s)", at, k, render(w[k]))
			}
			if d := subset(w[k], hv, path+"."+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		h, ok := have.([]any)
		if !ok {
			return fmt.Sprintf("at %s: want an array, have %s", at, render(have))
		}
		if len(h) != len(w) {
			return fmt.Sprintf("at %s: want %d elements, have %d: %s", at, len(w), len(h), render(have))
		}
		for i := range w {
			if d := subset(w[i], h[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	case json.Number:
		if h, ok := have.(json.Number); ok && numEqual(w, h) {
			return ""
		}
	default:
		if want == have {
			return ""
		}
	}
	return fmt.Sprintf("at %s: want %s, have %s", at, render(want), render(have))
}

func numEqual(a, b json.Number) bool {
	if a == b {
		return true
	}
	x, ok1 := new(big.Rat).SetString(string(a))
	y, ok2 := new(big.Rat).SetString(string(b))
	return ok1 && ok2 && x.Cmp(y) == 0
}

func render(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// readJobs reads every job of q's schema through db, in enqueue order.
func readJobs(ctx context.Context, q *backlog.Queue, db querier) ([]*backlog.JobInfo, error) {
	rows, err := db.Query(ctx, `SELECT id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms,
       COALESCE(worker, ''), result, COALESCE(last_error, ''), errors, created_at, started_at, finished_at,
       COALESCE(ordering_key, ''), COALESCE(unique_key, ''), COALESCE(concurrency_key, ''), meta, progress
FROM `+pgx.Identifier{q.Schema(), "all_jobs"}.Sanitize()+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("reading the jobs of schema %s: %w", q.Schema(), err)
	}
	defer rows.Close()
	var out []*backlog.JobInfo
	for rows.Next() {
		var (
			j         backlog.JobInfo
			id        uuid.UUID
			state     string
			tags      []byte
			errs      []byte
			prio      int16
			timeoutMS int64
			meta      []byte
			// JSON as []byte, not json.RawMessage: database/sql scans
			// NULL, and the text pgx's stdlib driver gives, only into that.
			args, result, progress []byte
		)
		if err := rows.Scan(&id, &j.Type, &args, &tags, &state, &prio, &j.RunAt, &j.Attempt, &j.MaxAttempts, &timeoutMS,
			&j.Worker, &result, &j.LastError, &errs, &j.CreatedAt, &j.StartedAt, &j.FinishedAt,
			&j.OrderingKey, &j.UniqueKey, &j.ConcurrencyKey, &meta, &progress); err != nil {
			return nil, fmt.Errorf("reading the jobs of schema %s: %w", q.Schema(), err)
		}
		j.ID, j.State, j.Priority, j.Timeout = id, backlog.State(state), int(prio), time.Duration(timeoutMS)*time.Millisecond
		j.Args, j.Result, j.Progress = args, result, progress
		if len(tags) > 0 && string(tags) != "{}" {
			if err := json.Unmarshal(tags, &j.Tags); err != nil {
				return nil, fmt.Errorf("decoding the tags of job %s: %w", id, err)
			}
		}
		if len(meta) > 0 {
			if err := json.Unmarshal(meta, &j.Metadata); err != nil {
				return nil, fmt.Errorf("decoding the metadata of job %s: %w", id, err)
			}
		}
		if len(errs) > 0 {
			if err := json.Unmarshal(errs, &j.Errors); err != nil {
				return nil, fmt.Errorf("decoding the errors of job %s: %w", id, err)
			}
		}
		out = append(out, &j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the jobs of schema %s: %w", q.Schema(), err)
	}
	return out, nil
}
