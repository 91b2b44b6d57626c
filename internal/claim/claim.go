// Package claim takes due jobs from the database under fresh leases: it
// runs the claim statement, gives every claimed job its lease handle
// before anyone sees it, and builds the completer's request for a claimed
// job's outcome (a give-back included). It holds back claims while the
// completer holds as many outcomes as it may.
//
// It knows leases only as handles of type L, which the caller's registry
// (the root package's lease.go) creates: the acquirer buffers and hands
// out Jobs, the completer writes their outcomes, and only Work turns one
// into the *backlog.Job its handler sees.
package claim

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/backlogq/backlog/internal/complete"
	"github.com/backlogq/backlog/internal/store"
)

// Job is one job a claim took: the record the claim statement returned
// and the lease it is held under.
type Job[L complete.Lease] struct {
	store.Claimed
	Lease L
}

// Request is the completer's request for the job's outcome f; done, when
// set, hears whether it was written.
func (j *Job[L]) Request(f store.Finish, done func(written bool)) *complete.Request {
	return &complete.Request{F: f, Type: j.Type, Tags: j.Tags, Slot: j.Slot, Done: done, Lease: j.Lease}
}

// Release is the request that gives the job back at once, keeping its
// place (run_at), without spending the attempt.
func (j *Job[L]) Release(done func(written bool)) *complete.Request {
	return j.Request(store.Release(j.ID, j.Token), done)
}

// Leases registers the leases of freshly claimed jobs (by ID, token and
// type) and returns their handles, in the jobs' order; sentAt is when the
// claim was sent.
type Leases[L complete.Lease] interface {
	Add(jobs []*store.Claimed, sentAt time.Time) []L
	// Ended returns the lease tokens of jobs of the types that hold a
	// slot of a concurrency limit (store.Claimed.Conc), whose handlers
	// have ended and whose outcomes are not written yet, and of its
	// standby jobs (store.Claimed.Standby) not yet run (nil: none). The
	// claim that reads them calls done once its statement has ended.
	Ended(types []string) (tokens [][16]byte, done func())
}

// Result is what one claim took.
type Result[L complete.Lease] struct {
	Jobs []*Job[L]
	// Skipped: when fewer than k jobs were taken, due jobs of the domain
	// exist that were locked by another transaction. The domain must not
	// park on them: it queries again shortly.
	Skipped bool
	// Limited: a limit (flow control) held back jobs of the domain.
	Limited store.Limited
	// Next, when a rate limit held jobs back: when it allows the next
	// start.
	Next time.Duration
	// Saturated: a concurrency limit left no slot beyond the claim's
	// callers' (store.ClaimResult.Saturated).
	Saturated bool
}

// Claimer takes jobs for one Queue.
type Claimer[L complete.Lease] struct {
	store  *store.Store
	leases Leases[L]
	comp   *complete.Completer
	lease  time.Duration
	worker string
}

// New returns the claimer of a Queue whose jobs are leased for lease by
// worker, registered in leases, their outcomes written by comp.
func New[L complete.Lease](st *store.Store, leases Leases[L], comp *complete.Completer, lease time.Duration, worker string) *Claimer[L] {
	return &Claimer[L]{store: st, leases: leases, comp: comp, lease: lease, worker: worker}
}

// Claim takes up to k due jobs of the types whose tags fit tags (a JSON
// object) under fresh leases, now of them for callers waiting now (the
// rest fill a prefetch buffer). A claim that takes longer than a lease is
// abandoned: its jobs would be expired by the time it returned.
// saturated says that the domain's last claim found a concurrency limit
// binding (Result.Saturated): the claim then does not count the jobs whose
// handlers have ended against the limit (Leases.Ended); their outcomes'
// write would otherwise hold those slots. standby (with saturated) asks
// for up to that many standby jobs beyond the k (store.ClaimEach).
func (c *Claimer[L]) Claim(ctx context.Context, types []string, tags json.RawMessage, k, now int, saturated bool, standby int) (Result[L], error) {
	if err := c.comp.Admit(ctx); err != nil {
		return Result[L]{}, err
	}
	sentAt := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.lease)
	defer cancel()
	// Each job is read into the Job that carries it (one copy), and its
	// lease registered before anyone sees it.
	var jobs []*Job[L]
	var claimed []*store.Claimed
	var ended [][16]byte
	if saturated {
		var done func()
		ended, done = c.leases.Ended(types)
		defer done()
	} else {
		standby = 0
	}
	res, err := c.store.ClaimEach(ctx, types, tags, k, now, c.lease, c.worker, ended, standby, func(r *store.Claimed) {
		if jobs == nil {
			jobs, claimed = make([]*Job[L], 0, k), make([]*store.Claimed, 0, k)
		}
		j := &Job[L]{Claimed: *r}
		jobs, claimed = append(jobs, j), append(claimed, &j.Claimed)
	})
	if err != nil {
		return Result[L]{}, fmt.Errorf("claiming jobs: %w", err)
	}
	for i, l := range c.leases.Add(claimed, sentAt) {
		jobs[i].Lease = l
	}
	next := res.Next
	next -= min(rateLead, next/4)
	return Result[L]{Jobs: jobs, Skipped: res.Skipped, Limited: res.Limited, Next: next, Saturated: res.Saturated}, nil
}

// rateLead: a rate limit's next start is given in whole milliseconds,
// rounded up, and a claim reaches the database some time after its timer
// fires (more on a busy machine); the timer is armed up to this much early
// (at most a quarter of the wait) so that the starts of a rate do not
// drift later by both. A claim that comes early finds no start allowed
// and is told to wait the rest.
const rateLead = 2 * time.Millisecond

// Release gives jobs back at once, keeping their place (run_at), without
// spending the attempt.
func (c *Claimer[L]) Release(jobs []*Job[L]) {
	for _, j := range jobs {
		c.comp.Submit(j.Release(nil))
	}
}

// FlowChanges returns the flow epoch and the types paused or whose limits
// were tightened after epoch since.
func (c *Claimer[L]) FlowChanges(ctx context.Context, since int64) (int64, []string, error) {
	return c.store.FlowChanges(ctx, since)
}
