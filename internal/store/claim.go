package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
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
	rows, err := s.pool.Query(ctx, s.sql.claim, Mode, types, workerTags, k, lease.Milliseconds(), worker)
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
