package backlog

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/complete"
	"github.com/backlogq/backlog/internal/store"
)

// claimer is the acquirer's access to the database: it runs the claim
// statement, gives every claimed job its lease handle before anyone sees
// it, and gives back jobs that no worker took. It holds back claims while
// the completer holds as many outcomes as it may.
type claimer struct {
	store  *store.Store
	leases *leases
	comp   *complete.Completer
	lease  time.Duration
	worker string
}

// claimResult is what one claim took.
type claimResult struct {
	jobs []*claimed
	// skipped: when fewer than k jobs were taken, due jobs of the domain
	// exist that were locked by another transaction. The domain must not
	// park on them: it queries again shortly.
	skipped bool
	// limited: a limit (flow control) held back jobs of the domain.
	limited store.Limited
	// next, when a rate limit held jobs back: when it allows the next
	// start.
	next time.Duration
}

// claim takes up to k due jobs of the domain under fresh leases. A claim
// that takes longer than a lease is abandoned: its jobs would be expired by
// the time it returned.
func (c *claimer) claim(ctx context.Context, d *domainSpec, k, now int) (claimResult, error) {
	if err := c.comp.Admit(ctx); err != nil {
		return claimResult{}, err
	}
	sentAt := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.lease)
	defer cancel()
	res, err := c.store.Claim(ctx, d.types, d.tagsJ, k, now, c.lease, c.worker)
	if err != nil {
		return claimResult{}, fmt.Errorf("claiming jobs: %w", err)
	}
	ids := make([]uuid.UUID, len(res.Jobs))
	tokens := make([]uuid.UUID, len(res.Jobs))
	types := make([]string, len(res.Jobs))
	for i, r := range res.Jobs {
		ids[i], tokens[i], types[i] = r.ID, r.Token, r.Type
	}
	held := c.leases.add(ids, tokens, types, sentAt)
	jobs := make([]*claimed, len(res.Jobs))
	for i, r := range res.Jobs {
		jobs[i] = &claimed{Claimed: r, lease: held[i]}
	}
	next := res.Next
	next -= min(rateLead, next/4)
	return claimResult{jobs: jobs, skipped: res.Skipped, limited: res.Limited, next: next}, nil
}

// rateLead: a rate limit's next start is given in whole milliseconds,
// rounded up, and a claim reaches the database some time after its timer
// fires (more on a busy machine); the timer is armed up to this much early
// (at most a quarter of the wait) so that the starts of a rate do not
// drift later by both. A claim that comes early finds no start allowed
// and is told to wait the rest.
const rateLead = 2 * time.Millisecond

// holdBack stops the jobs of types handed to workers whose handlers have
// not begun (leases.holdBack).
func (c *claimer) holdBack(types []string) { c.leases.holdBack(types) }

// flowChanges returns the flow epoch and the types paused or whose limits
// were tightened after epoch since.
func (c *claimer) flowChanges(ctx context.Context, since int64) (int64, []string, error) {
	return c.store.FlowChanges(ctx, since)
}

// release gives jobs back at once, keeping their place (run_at), without
// spending the attempt.
func (c *claimer) release(jobs []*claimed) {
	for _, j := range jobs {
		c.comp.Submit(j.outcome(releaseOf(j), nil))
	}
}

// releaseOf is the write that gives a claimed job back.
func releaseOf(j *claimed) store.Finish {
	return store.Release(j.ID, j.Token)
}
