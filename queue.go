// Package backlog is an embeddable job queue backed by PostgreSQL.
//
// A Queue wraps the application's own *pgxpool.Pool. Jobs are rows in one
// table (schema "backlog" by default, created by Queue.Migrate). Enqueue
// inserts them, alone or inside the caller's transaction (EnqueueTx), and
// Work runs them with a Handler in as many processes as needed: PostgreSQL
// is the only coordinator.
//
// Concurrency: a Queue is safe for concurrent use by many goroutines. A
// process normally holds one Queue and may call Work several times (for
// different job types or worker tags); all calls share one acquirer, one
// LISTEN connection, one heartbeat loop and one completer.
//
// Guarantees: delivery is at least once. A claimed job is held under a lease
// that the Queue renews while the handler runs; if the process dies, the
// lease expires and the job runs again elsewhere, so handlers must be
// idempotent. Each attempt's outcome is written once, fenced by the lease
// token, so a worker that lost its lease can never overwrite a newer attempt.
package backlog

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/migrations"
)

var schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

// Queue is a job queue in one PostgreSQL schema. Create it with New.
type Queue struct {
	pool  *pgxpool.Pool
	cfg   config
	log   *slog.Logger
	store *store.Store
	notif *notifier

	bgCtx    context.Context // background loops run under it; Close cancels it
	bgCancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	closing  chan struct{} // closed by Close: Work calls stop
	works    sync.WaitGroup
	started  bool // background machinery for Work is running
	acq      *acquirer
	leases   *leases
	comp     *completer
	listen   *listener
	bg       sync.WaitGroup // heartbeat, sweeper, listener
	compDone chan struct{}
	compStop context.CancelFunc
	waiters  waiters
	sched    *scheduler
}

// New returns a Queue over pool. It validates the options and starts
// nothing: the background machinery (listener, heartbeat, completer, sweep)
// starts with the first Work call. The Queue never closes pool. ctx is
// reserved for future use (checks against the database) and may be
// context.Background().
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Queue, error) {
	_ = ctx
	if pool == nil {
		return nil, invalid("pool", "must not be nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case !schemaRE.MatchString(cfg.schema):
		return nil, invalid("schema", "%q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 48 bytes)", cfg.schema)
	case cfg.logger == nil:
		return nil, invalid("logger", "must not be nil")
	case cfg.lease < time.Second:
		return nil, invalid("lease", "%s is shorter than 1s", cfg.lease)
	case cfg.pollInterval <= 0:
		return nil, invalid("poll interval", "must be positive, got %s", cfg.pollInterval)
	case cfg.pollJitter < 0:
		return nil, invalid("poll jitter", "must not be negative, got %s", cfg.pollJitter)
	case cfg.notifyInterval < 0:
		return nil, invalid("notify interval", "must not be negative, got %s", cfg.notifyInterval)
	case cfg.sweepInterval <= 0:
		return nil, invalid("sweep interval", "must be positive, got %s", cfg.sweepInterval)
	case cfg.cleanInterval <= 0:
		return nil, invalid("clean interval", "must be positive, got %s", cfg.cleanInterval)
	case cfg.keepCompleted <= 0 || cfg.keepFailed <= 0:
		return nil, invalid("retention", "must be positive, got %s and %s", cfg.keepCompleted, cfg.keepFailed)
	case cfg.clock == nil:
		return nil, invalid("clock", "must not be nil")
	}
	if err := cfg.backoff.validate(); err != nil {
		return nil, err
	}
	if cfg.workerID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = crand.Read(b[:])
		cfg.workerID = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	q := &Queue{pool: pool, cfg: cfg, log: cfg.logger, store: store.New(pool, cfg.schema), closing: make(chan struct{})}
	q.bgCtx, q.bgCancel = context.WithCancel(context.Background())
	if !cfg.pollOnly {
		q.notif = newNotifier(cfg.notifyInterval, q.log, q.sendPostings)
	}
	return q, nil
}

// Schema returns the queue's schema name.
func (q *Queue) Schema() string { return q.cfg.schema }

// WorkerID returns the name this process writes into the jobs it holds.
func (q *Queue) WorkerID() string { return q.cfg.workerID }

// Migrate creates or upgrades the queue's schema with the embedded
// migrations. It is idempotent and safe to call from many processes at once
// (they serialise on an advisory lock).
func (q *Queue) Migrate(ctx context.Context) error {
	ms, err := migrate.Load(migrations.FS)
	if err != nil {
		return err
	}
	applied, err := migrate.Up(ctx, q.pool, q.cfg.schema, ms)
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		q.log.Info("backlog: migrated schema", "schema", q.cfg.schema, "versions", applied)
	}
	return nil
}

// Job returns a job's record, or ErrNotFound.
func (q *Queue) Job(ctx context.Context, id uuid.UUID) (*JobInfo, error) {
	r, err := q.store.Get(ctx, q.pool, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, classify(fmt.Errorf("reading job %s: %w", id, err))
	}
	info := &JobInfo{ID: r.ID, Type: r.Type, Args: r.Args, Tags: r.Tags, State: State(r.State), Priority: r.Priority,
		Attempt: r.Attempt, MaxAttempts: r.MaxAttempts, Timeout: r.Timeout, Worker: r.Worker, Result: r.Result,
		LastError: r.LastError, CreatedAt: r.CreatedAt, RunAt: r.RunAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt}
	if len(r.Errors) > 0 {
		if err := json.Unmarshal(r.Errors, &info.Errors); err != nil {
			return nil, fmt.Errorf("decoding errors of job %s: %w", id, err)
		}
	}
	return info, nil
}

// startLocked starts the machinery Work needs, once.
func (q *Queue) startLocked() {
	if q.started {
		return
	}
	q.started = true
	q.leases = newLeases(q.store, q.log, q.cfg.lease)
	var localPost func([]posting)
	if q.cfg.pollOnly {
		localPost = q.postLocal
	}
	// A write that cannot land (database down, a row held by a long
	// transaction) is retried for several leases before it is given up.
	q.comp = newCompleter(q.store, q.leases, q.log, localPost, 4*q.cfg.lease)
	compCtx, compStop := context.WithCancel(context.Background())
	q.compStop, q.compDone = compStop, make(chan struct{})
	go func() {
		defer close(q.compDone)
		q.comp.run(compCtx)
	}()
	q.bg.Go(func() { q.leases.run(q.bgCtx) })
	q.bg.Go(func() { q.maintain(q.bgCtx) })
	q.startListenerLocked()
}

// startListenerLocked creates the acquirer and, unless in poll-only mode,
// starts the listener, once. Work and Wait need them.
func (q *Queue) startListenerLocked() {
	if q.acq != nil {
		return
	}
	q.acq = newAcquirer(q, q.log, q.cfg.pollInterval, q.cfg.pollJitter)
	if q.cfg.pollOnly {
		return
	}
	connect := q.cfg.listenConn
	if connect == nil {
		connect = func(ctx context.Context) (*pgx.Conn, error) {
			c, err := q.pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return c.Hijack(), nil
		}
	}
	q.listen = &listener{connect: connect, channel: q.store.Channel, acq: q.acq, log: q.log, idle: 30 * time.Second,
		onDone: q.waiters.wake,
		onCancel: func(id uuid.UUID) {
			q.mu.Lock()
			ls := q.leases
			q.mu.Unlock()
			if ls != nil {
				ls.cancel(id)
			}
		}}
	q.bg.Go(func() { q.listen.run(q.bgCtx) })
}

// claim implements acquirerStore: it runs the claim statement and registers
// the leases before anyone sees the jobs. A claim that takes longer than a
// lease is abandoned: its jobs would be expired by the time it returned.
func (q *Queue) claim(ctx context.Context, d *domainSpec, k int) (claimResult, error) {
	sentAt := time.Now()
	ctx, cancel := context.WithTimeout(ctx, q.cfg.lease)
	defer cancel()
	res, err := q.store.Claim(ctx, d.types, d.tagsJ, k, q.cfg.lease, q.cfg.workerID)
	if err != nil {
		return claimResult{}, fmt.Errorf("claiming jobs: %w", err)
	}
	jobs := make([]*Job, len(res.Jobs))
	for i, r := range res.Jobs {
		jobs[i] = &Job{ID: r.ID, Type: r.Type, Args: r.Args, Tags: r.Tags, Attempt: r.Attempt,
			MaxAttempts: r.MaxAttempts, Priority: r.Priority, Timeout: r.Timeout, CreatedAt: r.CreatedAt,
			RunAt: r.RunAt, token: r.Token, waited: r.Waited}
	}
	q.leases.add(jobs, sentAt)
	return claimResult{jobs: jobs, next: res.Next, skipped: res.Skipped}, nil
}

// release implements acquirerStore: the jobs go back to available at once,
// keeping their place (run_at), without spending the attempt.
func (q *Queue) release(jobs []*Job) {
	for _, j := range jobs {
		q.comp.submit(finishReq{job: j, f: store.Finish{ID: j.ID, Token: j.token, State: string(StateAvailable),
			AttemptDelta: -1, Delay: -1}})
	}
}

// sendPostings sends NOTIFY postings outside any writing transaction.
func (q *Queue) sendPostings(ctx context.Context, ps []posting) error {
	return q.store.Notify(ctx, encodePostings(ps))
}

// postLocal wakes this process's own domains (poll-only mode, where no
// NOTIFY comes back).
func (q *Queue) postLocal(ps []posting) {
	q.mu.Lock()
	acq := q.acq
	q.mu.Unlock()
	if acq == nil {
		return
	}
	for _, p := range ps {
		acq.post(p)
	}
}

// Close stops every Work call (as if their contexts were cancelled, with
// their grace periods), waits for them, writes the outcomes still queued,
// and stops the listener, heartbeat and sweep. It never closes the pool.
// Close is idempotent; later calls return at once. Do not call it from a
// handler or a hook: it waits for them to return.
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	close(q.closing)
	q.mu.Unlock()

	q.works.Wait()
	q.notif.close()
	q.mu.Lock()
	started, acq := q.started, q.acq
	q.mu.Unlock()
	if acq != nil {
		acq.close()
	}
	if started {
		q.compStop()
		<-q.compDone
	}
	q.bgCancel()
	q.bg.Wait()
	return nil
}
