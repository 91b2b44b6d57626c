package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

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
	// Slot: the job holds a slot of a concurrency limit, which its finish
	// frees.
	Slot bool
	// Conc: the slot is one of a concurrency limit (Limit.Concurrency,
	// not only a key limit): once the job's handler has ended, its
	// process's claims may leave it out of the count (Claim's ended).
	Conc bool
	// Standby: the job was taken beyond its concurrency limit and holds
	// no slot (ClaimEach's standby): it may run only in the slot of an
	// ended handler of its type in the same process, and until then its
	// process passes its token with its ended jobs'.
	Standby bool
	// Meta is the job's metadata (nil when it has none).
	Meta map[string]string
	// Prereqs are the job's prerequisites that completed before it could
	// run (nil: it has none).
	Prereqs []uuid.UUID

	rawTags []byte // the tags' JSON, until decoded
	rawMeta []byte // the metadata's JSON, until decoded
}

// ClaimResult is what one claim statement took.
type ClaimResult struct {
	Jobs []Claimed
	// Skipped reports, when fewer than k jobs were taken, that due jobs
	// exist which the claim skipped because they were locked.
	Skipped bool
	// Limited: a limit held jobs back from this claim. LimitedDemand: only
	// jobs beyond those wanted now were held back (a limited type is not
	// prefetched); LimitedWait: jobs callers wait for were held back.
	Limited Limited
	// Next, when a rate limit held jobs back: when it allows the next
	// start (0: wait for a freed slot instead).
	Next time.Duration
	// Saturated: a concurrency limit left no slot beyond the claim's
	// callers' (it binds). The caller's next claims pass the tokens of its
	// jobs whose handlers end meanwhile (Claim's ended).
	Saturated bool
}

// Limited says whether, and how, limits held back jobs from a claim.
type Limited int

// The values of Limited.
const (
	LimitedNone   Limited = 0
	LimitedDemand Limited = 1
	LimitedWait   Limited = 2
)

// Claim locks up to k due jobs of the given types whose tags are a subset of
// workerTags and leases them to worker for lease; now of them are wanted
// at once (the rest would fill a prefetch buffer, which limited types do
// not get). ended are the lease tokens of jobs of the caller's whose
// handlers have ended and whose outcomes are not written yet: they hold
// no slot of a concurrency limit (nil: none; key limits count them).
// Pass them after a claim that came back Saturated.
//
// A claim is one statement in a transaction of its own, at READ COMMITTED:
// claims of a type take turns on its claim lock, and each must read on a
// snapshot taken after the lock, which sees the previous claim's jobs as
// taken. When the pool's sessions default to a stricter isolation
// (default_transaction_isolation), the claim runs in an explicit READ
// COMMITTED transaction (two more round trips); at REPEATABLE READ, a
// claim that waited for another would meet that claim's jobs on its older
// snapshot and fail with a serialization error.
func (s *Store) Claim(ctx context.Context, types []string, workerTags json.RawMessage, k, now int, lease time.Duration, worker string, ended [][16]byte) (ClaimResult, error) {
	jobs := make([]Claimed, 0, k)
	res, err := s.ClaimEach(ctx, types, workerTags, k, now, lease, worker, ended, 0, func(c *Claimed) { jobs = append(jobs, *c) })
	if err != nil {
		return ClaimResult{}, err
	}
	res.Jobs = jobs
	return res, nil
}

// ClaimEach is Claim handing each job to add as it is read, in the
// order of Claim's Jobs, instead of collecting them (ClaimResult.Jobs is
// nil): the caller keeps what it needs without a second copy. *c is
// valid only during the call. On an error the caller drops what add was
// handed: the claim may have committed (an error reading its rows) or
// not, and jobs it took are handed out again once their leases expire.
//
// standby asks for up to that many standby jobs beyond the k (migration
// 0029), taken only of a type whose concurrency limit this claim leaves
// without a free slot (and which has no key limit, rate or keyed jobs);
// they come last, marked Claimed.Standby. Pass it only after a claim that
// came back Saturated, with the tokens of the caller's standby jobs in
// ended.
func (s *Store) ClaimEach(ctx context.Context, types []string, workerTags json.RawMessage, k, now int, lease time.Duration, worker string, ended [][16]byte, standby int, add func(c *Claimed)) (ClaimResult, error) {
	args := []any{Mode, types, workerTags, k, now, lease.Milliseconds(), worker, uuidArray(ended), standby}
	strict, err := s.strictSessions(ctx)
	if err != nil {
		return ClaimResult{}, err
	}
	if !strict {
		rows, err := s.pool.Query(ctx, s.sql.claim, args...)
		if err != nil {
			return ClaimResult{}, err
		}
		return readClaim(rows, add)
	}
	tx, err := s.pool.BeginTx(ctx, readCommittedTx)
	if err != nil {
		return ClaimResult{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // after the commit: does nothing
	rows, err := tx.Query(ctx, s.sql.claim, args...)
	if err != nil {
		return ClaimResult{}, err
	}
	res, err := readClaim(rows, add)
	if err != nil {
		return ClaimResult{}, err
	}
	return res, tx.Commit(ctx)
}

// strictSessions reports whether the pool's sessions default to an
// isolation above READ COMMITTED, asking the database once (again after
// an error).
func (s *Store) strictSessions(ctx context.Context) (bool, error) {
	s.isoMu.Lock()
	defer s.isoMu.Unlock()
	if !s.isoKnown {
		var iso string
		if err := s.pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&iso); err != nil {
			return false, err
		}
		s.isoKnown, s.isoStrict = true, iso != "read committed" && iso != "read uncommitted"
	}
	return s.isoStrict, nil
}

// readClaim reads the rows of the claim function, hands each job to add,
// and closes them.
func readClaim(rows pgx.Rows, add func(c *Claimed)) (ClaimResult, error) {
	var res ClaimResult
	defer rows.Close()
	// Binary columns, but for text (the same bytes either way) and jsonb
	// (pgx asks for it as text: the JSON itself).
	binary := true
	var jsonText [claimColumns]bool
	for i, f := range rows.FieldDescriptions() {
		switch {
		case f.Format == pgx.BinaryFormatCode || i == 1:
		case i == 2 || i == 3 || i == 16:
			jsonText[i] = true
		default:
			binary = false
		}
	}
	c := new(Claimed) // one for every row: add copies what it keeps
	for rows.Next() {
		*c = Claimed{}
		var ok bool
		var err error
		if binary {
			ok, err = decodeClaimed(rows.RawValues(), &jsonText, c, &res)
		} else {
			ok, err = scanClaimed(rows, c, &res)
		}
		if err != nil {
			return res, err
		}
		if !ok {
			continue // the row that only carries skipped
		}
		if len(c.rawTags) > 0 && string(c.rawTags) != "{}" { // most jobs are untagged: skip the decoder
			if err := json.Unmarshal(c.rawTags, &c.Tags); err != nil {
				return res, fmt.Errorf("decoding tags of job %s: %w", c.ID, err)
			}
		}
		if c.rawMeta != nil { // NULL for jobs without metadata
			if err := json.Unmarshal(c.rawMeta, &c.Meta); err != nil {
				return res, fmt.Errorf("decoding metadata of job %s: %w", c.ID, err)
			}
		}
		c.rawTags, c.rawMeta = nil, nil
		add(c)
	}
	return res, rows.Err()
}

// claimColumns is how many columns the claim function returns: column
// 16 is the metadata (migration 0011), 17 the prerequisites (0012), 18
// conc and 19 saturated (0028), 20 standby (0029).
const claimColumns = 21

// pgEpoch is PostgreSQL's timestamp epoch, in Unix microseconds.
const pgEpoch = 946684800 * 1_000_000

// decodeClaimed decodes one row of the claim function from its binary
// columns (a claim returns up to thousands of rows: scanning them through
// pgx's reflection cost a dozen allocations each). It reports false for the
// row that only carries skipped.
func decodeClaimed(v [][]byte, jsonText *[claimColumns]bool, c *Claimed, res *ClaimResult) (bool, error) {
	if len(v) != claimColumns {
		return false, fmt.Errorf("claim returned %d columns, want %d", len(v), claimColumns)
	}
	be := binary.BigEndian
	if v[13] != nil {
		res.Skipped = len(v[13]) == 1 && v[13][0] != 0
	}
	if len(v[12]) == 8 {
		res.Next = time.Duration(int64(be.Uint64(v[12]))) * time.Millisecond
	}
	if len(v[14]) == 2 {
		res.Limited = Limited(int16(be.Uint16(v[14])))
	}
	if len(v[19]) == 1 {
		res.Saturated = v[19][0] != 0
	}
	if v[0] == nil {
		return false, nil
	}
	c.Slot = len(v[15]) == 1 && v[15][0] != 0
	c.Conc = len(v[18]) == 1 && v[18][0] != 0
	c.Standby = len(v[20]) == 1 && v[20][0] != 0
	fixed := []struct {
		i, n int
	}{{0, 16}, {4, 4}, {5, 4}, {6, 2}, {7, 8}, {8, 16}, {9, 8}, {10, 8}, {11, 8}}
	for _, f := range fixed {
		if len(v[f.i]) != f.n {
			return false, fmt.Errorf("claim: column %d is %d bytes, want %d", f.i, len(v[f.i]), f.n)
		}
	}
	// The row's buffer is reused: the JSON is copied.
	jsonb := func(i int) ([]byte, error) {
		b := v[i]
		if !jsonText[i] {
			if len(b) == 0 || b[0] != 1 {
				return nil, fmt.Errorf("claim: unknown jsonb format")
			}
			b = b[1:]
		}
		if string(b) == "{}" {
			return nil, nil
		}
		return append([]byte(nil), b...), nil
	}
	var err error
	copy(c.ID[:], v[0])
	c.Type = string(v[1])
	if c.Args, err = jsonb(2); err != nil {
		return false, err
	}
	if c.Args == nil {
		c.Args = json.RawMessage(`{}`)
	}
	if c.rawTags, err = jsonb(3); err != nil {
		return false, err
	}
	if v[16] != nil {
		if c.rawMeta, err = jsonb(16); err != nil {
			return false, err
		}
	}
	c.Attempt = int(int32(be.Uint32(v[4])))
	c.MaxAttempts = int(int32(be.Uint32(v[5])))
	c.Priority = int(int16(be.Uint16(v[6])))
	c.Timeout = time.Duration(int64(be.Uint64(v[7]))) * time.Millisecond
	copy(c.Token[:], v[8])
	c.CreatedAt = time.UnixMicro(int64(be.Uint64(v[9])) + pgEpoch)
	c.RunAt = time.UnixMicro(int64(be.Uint64(v[10])) + pgEpoch)
	c.Waited = time.Duration(int64(be.Uint64(v[11]))) * time.Microsecond
	if v[17] != nil {
		if c.Prereqs, err = decodeUUIDArray(v[17]); err != nil {
			return false, err
		}
		c.Prereqs = dropRepeats(c.Prereqs)
	}
	return true, nil
}

// decodeUUIDArray decodes a one-dimensional uuid[] in binary format
// (prereqs: only jobs with dependencies have one).
func decodeUUIDArray(b []byte) ([]uuid.UUID, error) {
	be := binary.BigEndian
	if len(b) < 12 {
		return nil, fmt.Errorf("claim: short uuid[] (%d bytes)", len(b))
	}
	ndim := int32(be.Uint32(b))
	if ndim == 0 {
		return []uuid.UUID{}, nil
	}
	if ndim != 1 || len(b) < 20 {
		return nil, fmt.Errorf("claim: uuid[] of %d dimensions", ndim)
	}
	n := int(int32(be.Uint32(b[12:])))
	b = b[20:]
	if n < 0 || len(b) != n*20 {
		return nil, fmt.Errorf("claim: uuid[] of %d elements in %d bytes", n, len(b))
	}
	out := make([]uuid.UUID, n)
	for i := range out {
		if int32(be.Uint32(b)) != 16 {
			return nil, fmt.Errorf("claim: uuid[] element %d is not 16 bytes", i)
		}
		copy(out[i][:], b[4:20])
		b = b[20:]
	}
	return out, nil
}

// scanClaimed scans one row of the claim function through pgx, for a
// connection that returned text columns.
func scanClaimed(rows pgx.Rows, c *Claimed, res *ClaimResult) (bool, error) {
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
		limited         *int16
		slot            *bool
		meta            []byte
		prereqs         [][16]byte
		conc, saturated *bool
		standby         *bool
	)
	if err := rows.Scan(&id, &typ, &args, &tags, &attempt, &maxAtt, &prio, &timeoutMS, &token, &created, &runAt,
		&waitedUS, &nextMS, &skipped, &limited, &slot, &meta, &prereqs, &conc, &saturated, &standby); err != nil {
		return false, err
	}
	if skipped != nil {
		res.Skipped = *skipped
	}
	if nextMS != nil {
		res.Next = time.Duration(*nextMS) * time.Millisecond
	}
	if limited != nil {
		res.Limited = Limited(*limited)
	}
	if saturated != nil {
		res.Saturated = *saturated
	}
	if id == nil {
		return false, nil
	}
	*c = Claimed{ID: *id, Type: *typ, Args: args, Attempt: int(*attempt), MaxAttempts: int(*maxAtt),
		Priority: int(*prio), Timeout: time.Duration(*timeoutMS) * time.Millisecond, Token: *token,
		CreatedAt: *created, RunAt: *runAt, Waited: time.Duration(*waitedUS) * time.Microsecond, rawTags: tags,
		Slot: slot != nil && *slot, Conc: conc != nil && *conc, Standby: standby != nil && *standby, rawMeta: meta}
	if prereqs != nil {
		c.Prereqs = make([]uuid.UUID, len(prereqs))
		for i, p := range prereqs {
			c.Prereqs[i] = p
		}
		c.Prereqs = dropRepeats(c.Prereqs)
	}
	return true, nil
}

// dropRepeats removes repeated IDs, keeping the first of each. A job
// enqueued by this version lists its prerequisites from the start; a
// process of version 13 releasing it appends those that completed again
// (during a rolling upgrade to migration 0018).
func dropRepeats(ids []uuid.UUID) []uuid.UUID {
	if len(ids) < 2 {
		return ids
	}
	seen := make(map[uuid.UUID]struct{}, len(ids))
	var out []uuid.UUID // nil until a repeat is found
	for i, id := range ids {
		if _, dup := seen[id]; dup {
			if out == nil {
				out = slices.Clone(ids[:i])
			}
			continue
		}
		seen[id] = struct{}{}
		if out != nil {
			out = append(out, id)
		}
	}
	if out == nil {
		return ids
	}
	return out
}
