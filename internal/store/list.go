package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Listing jobs in two phases: live jobs (table jobs) by ID, which is
// creation order (UUIDv7), then finished jobs (job_history) by finish time
// and ID; newest first, or oldest first (finished jobs first, then live
// ones). Every statement is bounded, whatever the filter: it reads at most
// ListQuery.Scan rows, or a window of finish time that holds about that
// many by the counters (and at most windowCap times as many), then filters
// them:
//   - jobs along its primary key (or the index of a key filter);
//   - job_history by ID, or along the index of a key filter, or of failed
//     and cancelled jobs when only those are asked for; else in windows of
//     finish time through its BRIN
//     index (rows enter in finish order, so a window is a run of adjacent
//     pages), a window that comes back sparse followed by a wider one, one
//     over the cap by a narrower one.
// A page that ran out of rows to read before it was full says where to go
// on (Next).

// ListQuery selects jobs. Zero fields do not filter.
type ListQuery struct {
	States      []string
	Types       []string
	Tags        json.RawMessage // a JSON object: jobs whose tags contain it
	OrderingKey string
	UniqueKey   string
	// ConcurrencyKey has no index of its own: it filters the rows the
	// other conditions' walk reads (a bounded scan per page).
	ConcurrencyKey string
	ErrorContains  string // in last_error, case-insensitive
	CreatedFrom    time.Time
	CreatedTo      time.Time // exclusive
	FinishedFrom   time.Time
	FinishedTo     time.Time // exclusive
	IDs            []uuid.UUID
	Oldest         bool        // oldest first; else newest first
	After          *ListCursor // go on after this position
	Limit          int         // rows to return
	Scan           int         // rows to read per statement
}

// ListCursor is a position in a listing: in the live phase, the last ID
// seen; in the finished phase, the last finish time and ID seen.
type ListCursor struct {
	Finished   bool
	ID         uuid.UUID
	FinishedAt time.Time
}

// ListResult is one page.
type ListResult struct {
	Rows []Row
	// Next, when set, is where the listing goes on (the next query's
	// After); nil when every job was seen.
	Next *ListCursor
	// Scanned is how many rows were read.
	Scanned int
}

var terminalStates = []string{"completed", "failed", "cancelled"}

// DefaultScan is how many rows a listing statement reads at most: a few
// thousand buffers at worst (rows of a sparse filter each on a page of its
// own), whatever the table's size.
const DefaultScan = 2000

// V7Floor is the smallest UUIDv7 of millisecond t: every job created at or
// after t has an ID at least this.
func V7Floor(t time.Time) uuid.UUID {
	var u uuid.UUID
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(max(t.UnixMilli(), 0)))
	copy(u[:6], b[2:])
	u[6], u[8] = 0x70, 0x80
	return u
}

// List returns one page of jobs. Its statements share one snapshot (a
// read-only REPEATABLE READ transaction): a job that moves from jobs to
// job_history meanwhile is seen in one of the two, never in neither (the
// walk reads job_history first when oldest first).
func (s *Store) List(ctx context.Context, q ListQuery) (ListResult, error) {
	var res ListResult
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return res, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	// Never a sequential scan: a window of job_history is read through its
	// BRIN index even when the planner guesses the window holds much of
	// the table (it then read all 18,500 pages of a million jobs). Nor JIT
	// compilation or parallel workers, which the same guess brings about:
	// every statement here reads a bounded number of rows, and with the
	// statistics of a day of 10,000,000 jobs (and a burst of 200,000 in a
	// few seconds), the planner saw 175,000 rows in a window that held
	// 8,001 and compiled its plan, 100 ms of a statement's 110.
	if _, err := tx.Exec(ctx, `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true),
	set_config('max_parallel_workers_per_gather', '0', true)`, Mode); err != nil {
		return res, err
	}
	// A job that just finished may still be in jobs, for the moment before
	// it moves: jobs is always walked.
	wantFinished := len(q.States) == 0 || slices.ContainsFunc(q.States, func(st string) bool { return slices.Contains(terminalStates, st) })
	// Newest first: live jobs, then finished ones; oldest first the other
	// way round.
	type phase struct {
		finished bool
		run      func(*ListCursor) (*ListCursor, error)
	}
	live := phase{false, func(after *ListCursor) (*ListCursor, error) { return s.listLive(ctx, tx, &q, after, &res) }}
	fin := phase{true, func(after *ListCursor) (*ListCursor, error) { return s.listFinished(ctx, tx, &q, after, &res) }}
	phases := []phase{live, fin}
	if q.Oldest {
		phases = []phase{fin, live}
	}
	for i, p := range phases {
		if p.finished && !wantFinished {
			continue
		}
		after := q.After
		if after != nil && after.Finished != p.finished {
			// The cursor is in the other phase: this one was done
			// already (if it comes first) or starts afresh.
			if i == 0 {
				continue
			}
			after = nil
		}
		next, err := p.run(after)
		if err != nil {
			return ListResult{}, err
		}
		if len(res.Rows) > q.Limit {
			res.Rows = res.Rows[:q.Limit]
			last := res.Rows[len(res.Rows)-1]
			res.Next = &ListCursor{Finished: p.finished, ID: last.ID}
			if last.FinishedAt != nil {
				res.Next.FinishedAt = *last.FinishedAt
			}
			return res, nil
		}
		if next != nil {
			res.Next = next // the phase has more: go on with it next time
			return res, nil
		}
		if len(res.Rows) == q.Limit && i+1 < len(phases) {
			// Full, and the phase ended: the next page starts the next one.
			res.Next = &ListCursor{Finished: phases[i+1].finished}
			if phases[i+1].finished {
				res.Next.FinishedAt = farFuture(q.Oldest)
			}
			return res, nil
		}
	}
	return res, nil
}

// farFuture is a cursor position before every finished job in the walk's
// order.
func farFuture(oldest bool) time.Time {
	if oldest {
		return time.Time{}
	}
	return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
}

// listArgs builds a WHERE clause with bound parameters only.
type listArgs struct {
	args  []any
	where []string
}

// add appends a condition whose $? is the next parameter, v (or, when v is
// nil, a condition without one).
func (a *listArgs) add(cond string, v any) {
	if v != nil {
		a.args = append(a.args, v)
		cond = strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(a.args)))
	}
	a.where = append(a.where, cond)
}

func (a *listArgs) sql(prefix string) string {
	if len(a.where) == 0 {
		return "true"
	}
	out := make([]string, len(a.where))
	for i, w := range a.where {
		out[i] = strings.ReplaceAll(w, "§", prefix)
	}
	return strings.Join(out, " AND ")
}

// filters adds q's filters to a; § stands for the row's alias.
func (q *ListQuery) filters(a *listArgs) {
	if len(q.States) > 0 {
		a.add("§state = ANY($?::text[])", q.States)
	}
	if len(q.Types) > 0 {
		a.add("§type = ANY($?::text[])", q.Types)
	}
	if len(q.Tags) > 0 {
		a.add("§tags @> $?::jsonb", string(q.Tags))
	}
	if q.OrderingKey != "" {
		a.add("§ordering_key = $?", q.OrderingKey)
	}
	if q.UniqueKey != "" {
		a.add("§unique_key = $?", q.UniqueKey)
	}
	if q.ConcurrencyKey != "" {
		a.add("§concurrency_key = $?", q.ConcurrencyKey)
	}
	if q.ErrorContains != "" {
		a.add(`§last_error ILIKE $? ESCAPE '\'`, "%"+likeEscape(q.ErrorContains)+"%")
	}
	if !q.CreatedFrom.IsZero() {
		a.add("§id >= $?", V7Floor(q.CreatedFrom))
	}
	if !q.CreatedTo.IsZero() {
		a.add("§id < $?", V7Floor(q.CreatedTo))
	}
	if !q.FinishedFrom.IsZero() {
		a.add("§finished_at >= $?", q.FinishedFrom)
	}
	if !q.FinishedTo.IsZero() {
		a.add("§finished_at < $?", q.FinishedTo)
	}
	if len(q.IDs) > 0 {
		a.add("§id = ANY($?::uuid[])", q.IDs)
	}
}

// likeEscape makes s match itself in a LIKE pattern with ESCAPE '\'.
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

const listCols = `r.id, r.type, r.args, r.tags, r.state, r.priority, r.run_at, r.attempt, r.max_attempts, r.timeout_ms,
	COALESCE(r.worker, ''), r.result, COALESCE(r.last_error, ''), r.errors, r.created_at, r.started_at, r.finished_at,
	COALESCE(r.ordering_key, ''), COALESCE(r.unique_key, ''), COALESCE(r.concurrency_key, ''), r.meta, r.progress`

// listScan runs one bounded listing statement: the rows of `read` (a
// SELECT of at most q.Scan rows, in the walk's order, whose parameters
// come first in a), those of them matching q's filters, and the last row
// read (its id and finished_at) with how many were. It adds the matching
// rows to the result and returns the last row read (nil when none was)
// and how many rows were read: the rows of `read`, or what `counted` (SQL,
// on r or on the common table expressions of `with`, which come before r;
// empty: the rows of r) says.
func (s *Store) listScan(ctx context.Context, tx pgx.Tx, q *ListQuery, with, read string, a *listArgs, lastOrder string, res *ListResult, counted string) (*ListCursor, int, error) {
	f := &listArgs{args: a.args}
	q.filters(f)
	if counted == "" {
		counted = `(SELECT count(*) FROM r)`
	}
	if with != "" {
		with += ", "
	}
	sql := `WITH ` + with + `r AS (` + read + `)
SELECT ` + listCols + `, m.id, m.finished_at, m.n
FROM (SELECT (SELECT id FROM r ORDER BY ` + lastOrder + ` LIMIT 1) AS id,
             (SELECT finished_at FROM r ORDER BY ` + lastOrder + ` LIMIT 1) AS finished_at, ` + counted + ` AS n) m
LEFT JOIN r ON ` + f.sql("r.")
	if s.explain != nil {
		s.explain(sql, f.args)
	}
	rows, err := tx.Query(ctx, sql, append([]any{Mode}, f.args...)...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var last *ListCursor
	n := 0
	for rows.Next() {
		var (
			r                  Row
			id, lastID         *[16]byte
			typ, state, worker *string
			lastErr            *string
			tags               []byte
			prio               *int16
			att, maxA          *int32
			timeoutMS, count   *int64
			runAt, created     *time.Time
			lastFin            *time.Time
			okey, ukey, ckey   *string
			meta               []byte
		)
		if err := rows.Scan(&id, &typ, &r.Args, &tags, &state, &prio, &runAt, &att, &maxA, &timeoutMS, &worker, &r.Result,
			&lastErr, &r.Errors, &created, &r.StartedAt, &r.FinishedAt, &okey, &ukey, &ckey, &meta, &r.Progress, &lastID, &lastFin, &count); err != nil {
			return nil, 0, err
		}
		if count != nil {
			n = int(*count)
		}
		if lastID != nil && last == nil {
			last = &ListCursor{ID: *lastID}
			if lastFin != nil {
				last.FinishedAt = *lastFin
			}
		}
		if id == nil {
			continue // nothing matched
		}
		r.ID, r.Type, r.State, r.Worker, r.LastError = *id, *typ, *state, *worker, *lastErr
		r.OrderingKey, r.UniqueKey, r.ConcurrencyKey = *okey, *ukey, *ckey
		r.Priority, r.Attempt, r.MaxAttempts = int(*prio), int(*att), int(*maxA)
		r.Timeout = time.Duration(*timeoutMS) * time.Millisecond
		r.RunAt, r.CreatedAt = *runAt, *created
		if err := json.Unmarshal(tags, &r.Tags); err != nil {
			return nil, 0, fmt.Errorf("decoding tags of job %s: %w", r.ID, err)
		}
		if meta != nil {
			if err := json.Unmarshal(meta, &r.Meta); err != nil {
				return nil, 0, fmt.Errorf("decoding metadata of job %s: %w", r.ID, err)
			}
		}
		res.Rows = append(res.Rows, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	res.Scanned += n
	return last, n, nil
}

// listLive walks jobs by ID, along its primary key or the index of a key
// filter. It returns where to go on, or nil when the phase is done.
func (s *Store) listLive(ctx context.Context, tx pgx.Tx, q *ListQuery, after *ListCursor, res *ListResult) (*ListCursor, error) {
	order, back, cmp := "DESC", "ASC", "<"
	if q.Oldest {
		order, back, cmp = "ASC", "DESC", ">"
	}
	a := &listArgs{}
	if after != nil && after.ID != uuid.Nil {
		a.add("id "+cmp+" $?", after.ID)
	}
	if q.UniqueKey != "" {
		a.add("unique_key = $?", q.UniqueKey)
	}
	if q.OrderingKey != "" {
		a.add("ordering_key = $?", q.OrderingKey)
	}
	if len(q.IDs) > 0 {
		a.add("id = ANY($?::uuid[])", q.IDs)
	}
	if len(q.States) > 0 && !slices.ContainsFunc(q.States, func(st string) bool { return !slices.Contains(terminalStates, st) }) {
		// Only finished jobs: those not moved yet, along their index.
		a.add("state IN ('completed', 'failed', 'cancelled')", nil)
	}
	a.args = append(a.args, q.Scan)
	read := `SELECT * FROM ` + s.jobs + ` WHERE ` + a.sql("") + ` ORDER BY id ` + order + ` LIMIT $` + strconv.Itoa(len(a.args))
	start := len(res.Rows)
	last, n, err := s.listScan(ctx, tx, q, "", read, a, "id "+back, res, "")
	if err != nil {
		return nil, err
	}
	sortRows(res.Rows[start:], q.Oldest, false)
	if n < q.Scan {
		return nil, nil
	}
	last.Finished = false
	return last, nil
}

// listFinished walks job_history by finish time and ID. It returns where to
// go on, or nil when the phase is done.
func (s *Store) listFinished(ctx context.Context, tx pgx.Tx, q *ListQuery, after *ListCursor, res *ListResult) (*ListCursor, error) {
	order, back, cmp := "DESC", "ASC", "<"
	if q.Oldest {
		order, back, cmp = "ASC", "DESC", ">"
	}
	keyOrder := "finished_at " + order + ", id " + order
	lastOrder := "finished_at " + back + ", id " + back
	position := func(a *listArgs) {
		if after != nil {
			a.args = append(a.args, after.FinishedAt, after.ID)
			n := len(a.args)
			a.where = append(a.where, fmt.Sprintf("(finished_at, id) %s ($%d::timestamptz, $%d::uuid)", cmp, n-1, n))
		}
	}
	start := len(res.Rows)
	defer func() { sortRows(res.Rows[start:], q.Oldest, true) }()
	onlyFailed := len(q.States) > 0 && !slices.Contains(q.States, "completed")
	if onlyFailed || len(q.IDs) > 0 || q.UniqueKey != "" || q.OrderingKey != "" {
		// By ID (one lookup of the BRIN index each: it cannot take a
		// list), along the index of a key, or along the index of failed
		// and cancelled jobs.
		a := &listArgs{}
		from := s.history
		switch {
		case len(q.IDs) > 0:
			a.args = append(a.args, q.IDs)
			from = `(SELECT h.* FROM unnest($1::uuid[]) AS u(id) CROSS JOIN LATERAL (SELECT * FROM ` + s.history + ` x WHERE x.id = u.id) h) h`
		case q.UniqueKey != "":
			a.add("unique_key = $?", q.UniqueKey)
		case q.OrderingKey != "":
			a.add("ordering_key = $?", q.OrderingKey)
		default:
			a.add("state IN ('failed', 'cancelled')", nil)
		}
		position(a)
		a.args = append(a.args, q.Scan)
		read := `SELECT * FROM ` + from + ` WHERE ` + a.sql("") + ` ORDER BY ` + keyOrder + ` LIMIT $` + strconv.Itoa(len(a.args))
		last, n, err := s.listScan(ctx, tx, q, "", read, a, lastOrder, res, "")
		if err != nil || n < q.Scan {
			return nil, err
		}
		last.Finished = true
		return last, nil
	}
	// Windows of finish time, from the cursor (or the walk's start) to the
	// walk's end: nothing finished before the longest retention, nor after
	// now (a margin for clocks). The counters of finished jobs (written
	// with every row that enters job_history) say how many rows each
	// stretch of time holds: each window is cut to hold about the budget,
	// and empty stretches cost nothing.
	now := time.Now()
	floor, ceil := now.Add(-91*24*time.Hour), now.Add(time.Hour)
	if !q.FinishedFrom.IsZero() && q.FinishedFrom.After(floor) {
		floor = q.FinishedFrom
	}
	if !q.FinishedTo.IsZero() && q.FinishedTo.Before(ceil) {
		ceil = q.FinishedTo
	}
	cur := ceil
	if q.Oldest {
		cur = floor
	}
	if after != nil && !after.FinishedAt.IsZero() && after.FinishedAt.Year() < 9999 {
		cur = after.FinishedAt
	}
	buckets, err := s.finishedBuckets(ctx, tx, floor, ceil)
	if err != nil {
		return nil, err
	}
	// The counters say how many jobs finished in each minute, not when in
	// it: a window cut in proportion may hold nothing (the jobs of the
	// minute finished in a few seconds of it, elsewhere) or far more than
	// its share (those few seconds). So a window that comes back with
	// under a quarter of its share makes the next one's share four times
	// as large, and each window is read with a cap on the rows it may hold
	// (windowCap budgets): over the cap, it is left unread, and the
	// windows after it take at most half of what remains of it, by the
	// counters (or, where they count under one job, by time), until one
	// fits. An empty stretch costs a few statements, not one per budget's
	// share of time, and no statement reads more than the cap, but for a
	// window shorter than minCappedWindow (it cannot be narrowed much
	// further: a finish writes its whole batch at one time) and the last
	// statement of a page that has not moved on.
	budget := q.Scan
	share := float64(budget) // jobs the next window holds by the counters
	bisect := false          // a window over the cap is being narrowed
	var overJobs float64     // then: the jobs the counters know of in what remains of it
	var over time.Duration   // and its length
	moved := false           // a window was read whole on this page
	for i := 0; budget > q.Scan/10 && i < maxWindows; i++ {
		if bisect {
			share = min(share, overJobs/2)
		}
		wlo, whi, rest := window(buckets, cur, floor, ceil, share, q.Oldest)
		if bisect && overJobs < 1 {
			if q.Oldest && whi.Sub(cur) > over/2 {
				whi, rest = cur.Add(over/2), true
			} else if !q.Oldest && cur.Sub(wlo) > over/2 {
				wlo, rest = cur.Add(-over/2), true
			}
		}
		a := &listArgs{}
		a.add("finished_at >= $?", wlo)
		a.add("finished_at <= $?", whi)
		position(a)
		// A window is counted first, up to the cap, and read only if it
		// holds no more (the count reads no more rows than the cap, and
		// far less of each than the read and its sort).
		capped := whi.Sub(wlo) >= minCappedWindow && (moved || i < maxWindows-1)
		where := a.sql("")
		with, counted := "", ""
		if capped {
			a.args = append(a.args, windowCap*q.Scan+1)
			with = `c AS (SELECT count(*) AS n FROM (SELECT 1 FROM ` + s.history + ` WHERE ` + where + ` LIMIT $` + strconv.Itoa(len(a.args)) + `) w)`
			counted = `(SELECT n FROM c)`
			where += ` AND (SELECT n FROM c) <= ` + strconv.Itoa(windowCap*q.Scan)
		}
		a.args = append(a.args, budget)
		read := `SELECT * FROM ` + s.history + ` WHERE ` + where + ` ORDER BY ` + keyOrder + ` LIMIT $` + strconv.Itoa(len(a.args))
		last, held, err := s.listScan(ctx, tx, q, with, read, a, lastOrder, res, counted)
		if err != nil {
			return nil, err
		}
		if capped && held > windowCap*q.Scan {
			// Over the cap: not read.
			bisect, overJobs, over = true, countedIn(buckets, wlo, whi), whi.Sub(wlo)
			continue
		}
		if held >= budget {
			// The window held the budget or more: go on from the last
			// row read.
			last.Finished = true
			return last, nil
		}
		// The window is read whole, bounds included: go on past it.
		moved = true
		if bisect {
			overJobs, over = max(overJobs-countedIn(buckets, wlo, whi), 0), max(over-whi.Sub(wlo), 0)
		}
		if q.Oldest {
			cur = whi
			after = &ListCursor{Finished: true, FinishedAt: cur, ID: uuid.Max}
		} else {
			cur = wlo
			after = &ListCursor{Finished: true, FinishedAt: cur, ID: uuid.Nil}
		}
		if !rest {
			return nil, nil // the counters know of nothing further
		}
		budget -= held
		if float64(held) < share/4 {
			share *= 4
		} else {
			share = float64(budget)
		}
		if len(res.Rows)-start > q.Limit {
			break
		}
	}
	return after, nil
}

// Bounds of the windows of finish time that List reads (listFinished).
const (
	// windowCap: a window holding more than this many budgets
	// (ListQuery.Scan) is left unread.
	windowCap = 4
	// minCappedWindow: a window shorter than this is read whole.
	minCappedWindow = time.Millisecond
	// maxWindows: the most window statements in one page; a page that
	// runs out of them ends short, with a cursor. Every page moves on:
	// its last statement reads its window whole if no window before it
	// was.
	maxWindows = 32
)

// timeBucket is a stretch of finish time and how many jobs finished in it.
type timeBucket struct {
	from, to time.Time
	n        int64
}

// finishedBuckets reads the counters of finished jobs between from and to,
// by time: of the jobs in job_history (those deleted at completion,
// counted as 'discarded', are not there).
func (s *Store) finishedBuckets(ctx context.Context, tx pgx.Tx, from, to time.Time) ([]timeBucket, error) {
	rows, err := tx.Query(ctx, `SELECT bucket, bucket + interval '1 minute', sum(n)::bigint FROM `+
		pgx.Identifier{s.schema, "job_counts"}.Sanitize()+` WHERE bucket >= $1::timestamptz - interval '1 minute' AND bucket < $2::timestamptz AND state <> 'discarded' GROUP BY bucket
UNION ALL
SELECT bucket, bucket + interval '1 hour', sum(n)::bigint FROM `+pgx.Identifier{s.schema, "job_counts_hourly"}.Sanitize()+`
WHERE bucket >= $1::timestamptz - interval '1 hour' AND bucket < $2::timestamptz AND state <> 'discarded' GROUP BY bucket
ORDER BY 1`, Mode, from, to)
	if err != nil {
		return nil, err
	}
	var out []timeBucket
	var b timeBucket
	_, err = pgx.ForEachRow(rows, []any{&b.from, &b.to, &b.n}, func() error {
		out = append(out, b)
		return nil
	})
	return out, err
}

// window returns the next window of finish time to read from cur, holding
// about budget jobs by the counters (at least one bucket's worth, cut
// within a bucket in proportion), and whether the counters know of jobs
// beyond it.
func window(buckets []timeBucket, cur, floor, ceil time.Time, budget float64, oldest bool) (lo, hi time.Time, more bool) {
	var acc float64
	if !oldest {
		for i := len(buckets) - 1; i >= 0; i-- {
			b := buckets[i]
			if !b.from.Before(cur) {
				continue
			}
			to := minTime(b.to, cur)
			part := float64(b.n) * to.Sub(b.from).Seconds() / b.to.Sub(b.from).Seconds()
			if acc+part >= budget && part > 0 {
				frac := (budget - acc) / part
				lo = to.Add(-time.Duration(frac * float64(to.Sub(b.from))))
				return maxTime(lo, floor), cur, true
			}
			acc += part
		}
		return floor, cur, false
	}
	for _, b := range buckets {
		if !b.to.After(cur) {
			continue
		}
		from := maxTime(b.from, cur)
		part := float64(b.n) * b.to.Sub(from).Seconds() / b.to.Sub(b.from).Seconds()
		if acc+part >= budget && part > 0 {
			frac := (budget - acc) / part
			hi = from.Add(time.Duration(frac * float64(b.to.Sub(from))))
			return cur, minTime(hi, ceil), true
		}
		acc += part
	}
	return cur, ceil, false
}

// countedIn returns how many finished jobs the counters know of between lo
// and hi (in proportion for buckets partly within).
func countedIn(buckets []timeBucket, lo, hi time.Time) float64 {
	var jobs float64
	for _, b := range buckets {
		from, to := maxTime(b.from, lo), minTime(b.to, hi)
		if b.n > 0 && to.After(from) {
			jobs += float64(b.n) * to.Sub(from).Seconds() / b.to.Sub(b.from).Seconds()
		}
	}
	return jobs
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// sortRows orders rows the walk's way: by ID, or by finish time and ID.
func sortRows(rows []Row, oldest, finished bool) {
	slices.SortFunc(rows, func(a, b Row) int {
		c := 0
		if finished && a.FinishedAt != nil && b.FinishedAt != nil {
			c = a.FinishedAt.Compare(*b.FinishedAt)
		}
		if c == 0 {
			c = strings.Compare(string(a.ID[:]), string(b.ID[:]))
		}
		if oldest {
			return c
		}
		return -c
	})
}
