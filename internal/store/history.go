package store

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Finished jobs live in job_history, partitioned by expiry (one partition a
// UTC day); scheduled jobs wait in jobs with state scheduled until the
// promoter makes them available. The SQL is in migration 6.

type historySQL struct {
	partitions, drop, retire, promote, cleanRuns string
}

func (s *Store) buildHistory() {
	h := &s.hist
	fn := func(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }
	h.partitions = `SELECT ` + fn("history_partition") + `((now() AT TIME ZONE 'UTC')::date + $1::integer)`
	h.drop = `SELECT partitions, rows_deleted FROM ` + fn("drop_expired_history") + `($1)`
	h.retire = `SELECT ` + fn("retire") + `($1, $2, $3)`
	h.promote = `SELECT type, tags, n, more, next_ms FROM ` + fn("promote") + `($1)`
	runsT := fn("periodic_runs")
	// The latest run of each schedule is kept whatever its age: it is the
	// schedule's memory of which plan was enqueued last.
	h.cleanRuns = `WITH d AS (
	SELECT r.name, r.plan_time FROM ` + runsT + ` r
	WHERE r.created_at < now() - $1::bigint * interval '1 millisecond'
	  AND r.plan_time < (SELECT max(m.plan_time) FROM ` + runsT + ` m WHERE m.name = r.name)
	LIMIT $2::integer FOR UPDATE SKIP LOCKED
)
DELETE FROM ` + runsT + ` r USING d WHERE r.name = d.name AND r.plan_time = d.plan_time`
}

// HistoryDays is how many days of expiry partitions must exist ahead for
// the store's retention: every finished job's expiry falls in one.
func (s *Store) HistoryDays() int {
	return int(max(s.keepCompleted, s.keepFailed)/(24*time.Hour)) + 2
}

// EnsurePartitions creates the job_history partitions of today and the
// next HistoryDays days that do not exist yet, one statement each (so
// locks are held for an instant), and returns how many it made. A day
// whose locks were not to be had at once is left for the next call (and
// reported in the error); its rows meanwhile go to the default partition
// and move into the day's partition once it is made.
func (s *Store) EnsurePartitions(ctx context.Context) (int, error) {
	made := 0
	var firstErr error
	for d := 0; d <= s.HistoryDays(); d++ {
		var ok bool
		if err := s.pool.QueryRow(ctx, s.hist.partitions, Mode, d).Scan(&ok); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if ok {
			made++
		}
	}
	return made, firstErr
}

// CleanResult counts what one cleaner step removed.
type CleanResult struct {
	Partitions int // job_history day partitions dropped
	Jobs       int // expired rows deleted from the default partition
	Runs       int // periodic_runs rows deleted
}

// Clean drops the job_history partitions whose rows have all expired,
// deletes up to limit expired rows of the default partition, and up to
// limit periodic_runs rows older than keepRuns (never a schedule's latest).
func (s *Store) Clean(ctx context.Context, keepRuns time.Duration, limit int) (CleanResult, error) {
	var r CleanResult
	if err := s.pool.QueryRow(ctx, s.hist.drop, Mode, limit).Scan(&r.Partitions, &r.Jobs); err != nil {
		return r, err
	}
	tag, err := s.pool.Exec(ctx, s.hist.cleanRuns, Mode, keepRuns.Milliseconds(), limit)
	if err != nil {
		return r, err
	}
	r.Runs = int(tag.RowsAffected())
	return r, nil
}

// SummarizeHistory summarizes the page ranges of job_history's BRIN
// indexes filled since their last summary, and returns how many.
func (s *Store) SummarizeHistory(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT `+pgx.Identifier{s.schema, "summarize_history"}.Sanitize()+`()`, Mode).Scan(&n)
	return n, err
}

// Retire moves up to limit finished jobs that the graph paths wrote in
// place (finishes of jobs with dependents, the sweep, cancels) from jobs
// into job_history, and returns how many it moved.
func (s *Store) Retire(ctx context.Context, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, s.hist.retire, Mode, limit, s.keepCompleted.Milliseconds(), s.keepFailed.Milliseconds()).Scan(&n)
	return n, err
}

// Promoted is what one Promote call did.
type Promoted struct {
	Avail []Avail // one per (type, tags) made available
	Jobs  int     // how many jobs
	// More: due scheduled jobs are left (the limit was reached, or others
	// held them locked).
	More bool
	// Next is the time until the earliest future scheduled job; < 0: none.
	Next time.Duration
}

// Promote makes up to limit due scheduled jobs available.
func (s *Store) Promote(ctx context.Context, limit int) (Promoted, error) {
	p := Promoted{Next: -1}
	rows, err := s.pool.Query(ctx, s.hist.promote, Mode, limit)
	if err != nil {
		return p, err
	}
	var (
		typ    *string
		tags   []byte
		n      *int64
		more   *bool
		nextMS *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&typ, &tags, &n, &more, &nextMS}, func() error {
		if typ != nil {
			p.Avail = append(p.Avail, Avail{Type: *typ, Tags: json.RawMessage(slices.Clone(tags))})
			p.Jobs += int(*n)
			return nil
		}
		p.More = more != nil && *more
		if nextMS != nil {
			p.Next = max(0, time.Duration(*nextMS)*time.Millisecond)
		}
		return nil
	})
	return p, err
}
