package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The process registry (migration 8): one row per process running Work,
// refreshed by its heartbeat. A process is dead once its heartbeat is
// older than DeadAfterLeases of its own leases.

// DeadAfterLeases is how many of its own leases a process may go without a
// heartbeat before it counts as dead (it beats every lease/3).
const DeadAfterLeases = 3

type procSQL struct {
	register, beat, extendBeat, extendBeatProgress, unregister, list, clean string
}

func (s *Store) buildProcesses() {
	p := &s.procs
	t := pgx.Identifier{s.schema, "processes"}.Sanitize()
	dead := func(row string) string {
		return row + `.heartbeat_at < now() - ` + strconv.Itoa(DeadAfterLeases) + ` * ` + row + `.lease_ms * interval '1 millisecond'`
	}
	// The row as a whole. Another live instance's row under the same worker
	// ID is left alone (no row returned); a dead one's is taken over.
	p.register = `INSERT INTO ` + t + ` AS p (worker, instance, host, pid, started_at, heartbeat_at, lease_ms, works, running, leased)
VALUES ($1::text, $2::text, $3::text, $4::integer, COALESCE($5::timestamptz, now()), now(), $6::bigint, $7::jsonb, $8::integer, $9::integer)
ON CONFLICT (worker) DO UPDATE SET instance = EXCLUDED.instance, host = EXCLUDED.host, pid = EXCLUDED.pid,
	started_at = CASE WHEN p.instance = EXCLUDED.instance THEN p.started_at ELSE EXCLUDED.started_at END,
	heartbeat_at = now(), lease_ms = EXCLUDED.lease_ms, works = EXCLUDED.works, running = EXCLUDED.running, leased = EXCLUDED.leased
WHERE p.instance = EXCLUDED.instance OR ` + dead("p") + `
RETURNING p.started_at`
	// The heartbeat of a registered row: never waits for a lock (a row
	// someone holds is skipped, and written alone afterwards), because it
	// rides along with the renewal of leases.
	beat := func(n int) string {
		arg := func(i int, typ string) string { return "$" + strconv.Itoa(n+i) + "::" + typ }
		return `UPDATE ` + t + ` p SET heartbeat_at = now(), works = ` + arg(2, "jsonb") + `, running = ` + arg(3, "integer") +
			`, leased = ` + arg(4, "integer") + `
	FROM (SELECT worker FROM ` + t + ` WHERE worker = ` + arg(0, "text") + ` AND instance = ` + arg(1, "text") + `
	      FOR NO KEY UPDATE SKIP LOCKED) o
	WHERE p.worker = o.worker
	RETURNING 1`
	}
	p.beat = beat(1)
	// The lease renewal (extend) with the heartbeat in the same statement:
	// a data-modifying WITH item runs whether or not the query reads it;
	// the last row (a NULL id) says that the heartbeat was written. The
	// heartbeat's parameters follow the renewal's.
	ext := s.fin.extend
	if !strings.HasPrefix(ext, "WITH ") {
		panic("store: the lease renewal statement no longer starts with WITH; rebuild extendBeat")
	}
	withBeat := func(ext string) string {
		return `WITH beat AS (` + beat(maxParam(ext)+1) + `), ` + strings.TrimPrefix(ext, "WITH ") + `
UNION ALL
SELECT NULL, false, false FROM beat`
	}
	p.extendBeat = withBeat(ext)
	p.extendBeatProgress = withBeat(s.fin.extendProgress)
	p.unregister = `DELETE FROM ` + t + ` WHERE worker = $1 AND instance = $2`
	p.list = `SELECT worker, host, pid, started_at, heartbeat_at, lease_ms, works, running, leased FROM ` + t + ` p
WHERE NOT (` + dead("p") + `)
ORDER BY started_at, worker`
	p.clean = `DELETE FROM ` + t + ` p WHERE ` + dead("p")
}

var paramRE = regexp.MustCompile(`\$([0-9]+)`)

// maxParam returns the highest $n in a statement.
func maxParam(sql string) int {
	n := 0
	for _, m := range paramRE.FindAllStringSubmatch(sql, -1) {
		v, _ := strconv.Atoi(m[1])
		n = max(n, v)
	}
	return n
}

// Process is what a process writes about itself.
type Process struct {
	Worker   string
	Instance string // random per Queue
	Host     string
	PID      int
	// StartedAt is when the row was first written, as the database
	// recorded it; nil before that (the database's now() is taken).
	StartedAt *time.Time
	Lease     time.Duration
	Works     json.RawMessage // a JSON array
	Running   int
	Leased    int
}

// Register writes p's row whole and returns its started_at. ok is false
// when another live process holds the worker ID (its row is left alone).
func (s *Store) Register(ctx context.Context, p Process) (started time.Time, ok bool, err error) {
	err = s.pool.QueryRow(ctx, s.procs.register, Mode, p.Worker, p.Instance, p.Host, int32(p.PID), p.StartedAt,
		p.Lease.Milliseconds(), p.Works, int32(p.Running), int32(p.Leased)).Scan(&started)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	return started, err == nil, err
}

// Beat refreshes p's row (heartbeat, works, counts) and reports whether
// it did: false when the row is gone, another process took it over, or
// another transaction holds it.
func (s *Store) Beat(ctx context.Context, p Process) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.procs.beat, Mode, p.Worker, p.Instance, p.Works, int32(p.Running), int32(p.Leased))
	return err == nil && tag.RowsAffected() == 1, err
}

// ExtendBeat is Extend with p's heartbeat (as Beat) in the same statement;
// beat reports whether the heartbeat was written.
func (s *Store) ExtendBeat(ctx context.Context, ids, tokens []uuid.UUID, lease time.Duration, p Process) (out []Extended, beat bool, err error) {
	return s.ExtendBeatWith(ctx, ids, tokens, nil, lease, p)
}

// ExtendBeatWith is ExtendBeat writing progress too, like ExtendWith.
func (s *Store) ExtendBeatWith(ctx context.Context, ids, tokens []uuid.UUID, progress []json.RawMessage, lease time.Duration, p Process) (out []Extended, beat bool, err error) {
	args := []any{Mode, ids16(ids), ids16(tokens), lease.Milliseconds()}
	stmt := s.procs.extendBeat
	if progress != nil {
		args, stmt = append(args, progress), s.procs.extendBeatProgress
	}
	args = append(args, p.Worker, p.Instance, p.Works, int32(p.Running), int32(p.Leased))
	rows, err := s.pool.Query(ctx, stmt, args...)
	if err != nil {
		return nil, false, err
	}
	var id *[16]byte
	var e Extended
	_, err = pgx.ForEachRow(rows, []any{&id, &e.CancelRequested, &e.Renewed}, func() error {
		if id == nil {
			beat = true
			return nil
		}
		e.ID = *id
		out = append(out, e)
		return nil
	})
	return out, beat, err
}

// Unregister deletes the process's row (unless another process took it
// over).
func (s *Store) Unregister(ctx context.Context, worker, instance string) error {
	_, err := s.pool.Exec(ctx, s.procs.unregister, Mode, worker, instance)
	return err
}

// ProcessRow is a live process as listed.
type ProcessRow struct {
	Worker      string
	Host        string
	PID         int
	StartedAt   time.Time
	HeartbeatAt time.Time
	Lease       time.Duration
	Works       json.RawMessage
	Running     int
	Leased      int
}

// Processes lists the live processes (heartbeat within DeadAfterLeases of
// their leases), oldest first.
func (s *Store) Processes(ctx context.Context) ([]ProcessRow, error) {
	rows, err := s.pool.Query(ctx, s.procs.list, Mode)
	if err != nil {
		return nil, err
	}
	var out []ProcessRow
	var r ProcessRow
	var pid, running, leased int32
	var leaseMS int64
	var works []byte
	_, err = pgx.ForEachRow(rows, []any{&r.Worker, &r.Host, &pid, &r.StartedAt, &r.HeartbeatAt, &leaseMS, &works, &running, &leased},
		func() error {
			r.PID, r.Running, r.Leased = int(pid), int(running), int(leased)
			r.Lease = time.Duration(leaseMS) * time.Millisecond
			r.Works = append(json.RawMessage(nil), works...) // works' buffer is reused by the next row
			out = append(out, r)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("reading processes: %w", err)
	}
	return out, nil
}

// CleanProcesses deletes the rows of dead processes and returns how many.
func (s *Store) CleanProcesses(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, s.procs.clean, Mode)
	return int(tag.RowsAffected()), err
}
