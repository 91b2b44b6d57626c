package backlog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog/internal/claim"
	"github.com/backlogq/backlog/internal/complete"
	"github.com/backlogq/backlog/internal/maintain"
	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/outage"
	"github.com/backlogq/backlog/internal/periodic"
	"github.com/backlogq/backlog/internal/pgerr"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/registry"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/waiters"
	"github.com/backlogq/backlog/migrations"
)

// Queue is a job queue in one PostgreSQL schema. Create it with New.
type Queue struct {
	pool  *pgxpool.Pool
	cfg   config
	log   *slog.Logger
	store *store.Store
	// reads serves the operator's reads (WithReadPool): the read pool's
	// store, or store itself without one. Reads go through readsFor,
	// which honours ReadPrimary.
	reads *store.Store
	// faults coalesces the background loops' database errors into
	// outages (one log line when one begins, one when it ends).
	faults *outage.Tracker

	// The services, in start order (Close stops them in reverse).
	announce announcer
	listen   *listener // nil in poll-only mode
	procs    *registry.Registry
	leases   *leases
	comp     *complete.Completer
	claim    *claim.Claimer[*heldLease] // the acquirer's claims (and the test runs')
	acq      *acquirer
	maint    *maintain.Service
	sched    *periodic.Scheduler

	waiters  waiters.Set
	migrated atomic.Bool // the schema was found migrated

	mu      sync.Mutex
	closed  bool
	closing chan struct{} // closed by Close: Work calls stop
	works   sync.WaitGroup
}

// New returns a Queue over pool. The Queue never closes pool. ctx is not
// used yet (New makes no query); it may be context.Background().
//
// New validates the options and starts nothing. Background services start
// when first needed and run until Close:
//   - Work starts the listener (LISTEN connection, unless WithPollOnly),
//     the heartbeat, the completer and the maintenance loop (expired-lease
//     sweep, cleaner).
//   - Enqueue and friends may start the notifier's sender goroutine, which
//     announces committed jobs and exits when it has nothing to send.
//   - Every and Cron start the scheduler.
//   - Wait starts the listener, to hear completion notices.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Queue, error) {
	_ = ctx
	if pool == nil {
		return nil, invalid("pool", "must not be nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalid("options", "nil option")
		}
		o.applyQueue(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.workerID == "" {
		host, _ := os.Hostname()
		cfg.workerID = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), randomHex(4))
	}
	q := &Queue{pool: pool, cfg: cfg, log: cfg.logger, store: store.New(pool, cfg.schema), closing: make(chan struct{})}
	q.store.SetRetention(cfg.keepCompleted, cfg.keepFailed)
	q.reads = q.store
	if cfg.readPool != nil {
		q.reads = store.New(cfg.readPool, cfg.schema)
	}
	log := cfg.logger
	q.faults = outage.New(log)
	q.procs = registry.New(q.store, log, q.faults, cfg.workerID, randomHex(8), cfg.lease)
	q.leases = newLeases(q.store, log, q.faults, cfg.lease, q.procs)
	// Every part is built complete, each from those built before it. One
	// edge runs against that order: the maintenance service and the
	// completer announce (q.committed) through the announcer, which is
	// built last, from the acquirer, which claims through the claimer,
	// which gives jobs back through the completer. q.committed forwards to
	// q.announce, which is set before New returns, so before anything can
	// be announced.
	q.maint = maintain.New(q.store, maintain.Config{PollInterval: cfg.pollInterval, SweepInterval: cfg.sweepInterval,
		CleanInterval: cfg.cleanInterval, KeepFailed: cfg.keepFailed, Retention: maxRetention, VacuumDead: cfg.vacuumDead, VacuumLive: cfg.vacuumLive},
		log, q.faults, q.committed)
	q.comp = complete.New(q.store, complete.Config{Lease: cfg.lease, Announce: q.committed,
		InPlace: q.maint.RetireSoon, Moved: q.maint.FinishedSome}, log, q.faults)
	q.claim = claim.New(q.store, q.leases, q.comp, cfg.lease, cfg.workerID)
	q.acq = newAcquirer(claimSource{cl: q.claim, leases: q.leases}, log, q.faults, cfg.pollInterval, cfg.pollJitter, q.maint.Scheduled)
	if cfg.pollOnly {
		q.announce = newLocalAnnouncer(q.acq, q.store, log, q.faults)
	} else {
		notif := newNotifier(cfg.notifyInterval, log, q.faults, q.store)
		src := randomHex(4)
		q.announce = &notifyAnnouncer{store: q.store, notif: notif, acq: q.acq, src: src}
		q.listen = newListener(cfg.listenConn, q.pool, q.store.Channel(), src, q.acq, q.leases.cancel, q.waiters.Wake, log, q.faults)
	}
	q.sched = periodic.New(q.store, q.pool, periodic.Config{Clock: cfg.clock, Announce: q.committed}, log, q.faults)
	return q, nil
}

// services lists the Queue's services in start order; Close stops them in
// reverse, so that nothing a service needs stops before it (the process
// registry deletes its row once the heartbeat, which writes it, has
// stopped). The others start their goroutines on demand.
func (q *Queue) services() []service {
	out := []service{q.announce}
	if q.listen != nil {
		out = append(out, q.listen)
	}
	return append(out, stopFunc(q.procs.Stop), q.leases, stopFunc(q.comp.Stop), q.acq, stopFunc(q.maint.Stop), stopFunc(q.sched.Stop))
}

// startLocked starts the loops a caller needs (their start functions) (q.mu held, the Queue not
// closed): every one but the scheduler for Work; the listener for Wait;
// the scheduler for Every and Cron.
func (q *Queue) startLocked(starts ...func()) {
	for _, start := range starts {
		start()
	}
}

// Schema returns the queue's schema name.
func (q *Queue) Schema() string { return q.cfg.schema }

// WorkerID returns the name this process writes into the jobs it holds.
func (q *Queue) WorkerID() string { return q.cfg.workerID }

// Migrate creates or upgrades the queue's schema with the embedded
// migrations, all in one transaction. It is idempotent and safe to call
// from many processes at once (they serialise on an advisory lock, which
// the files `backlog migrate sql` exports for goose and golang-migrate
// take too). A schema those files migrated is recognised: Migrate applies
// only the migrations its version lacks, never one already applied.
//
// The transaction sets its own timeouts, whatever the pool's: no
// statement timeout (ctx bounds the migration) and, for the locks the
// migrations take on the queue's tables, a lock timeout of 2 seconds, so
// that a long transaction holding one never stalls the queue behind a
// waiting migration for longer. After a lock timeout (or a deadlock) the
// transaction rolls back and is made again after a pause (100 ms,
// doubling up to 5 s), for up to a minute; then Migrate returns the lock
// error.
func (q *Queue) Migrate(ctx context.Context) error {
	if q.isClosed() {
		return ErrClosed
	}
	ms, err := migrate.Load(migrations.FS)
	if err != nil {
		return err
	}
	applied, err := migrate.Up(ctx, q.pool, q.cfg.schema, ms)
	if err != nil {
		return classify(err)
	}
	if len(applied) > 0 {
		q.cfg.logger.Info("backlog: migrated schema", "schema", q.cfg.schema, "versions", applied)
	}
	q.migrated.Store(true)
	return nil
}

// ErrNotMigrated is returned (wrapped) when the queue's schema does not
// exist or is older than this version of backlog: run Queue.Migrate (or
// `backlog migrate up`, with --schema NAME for a schema other than the
// default) first.
var ErrNotMigrated = errors.New("backlog: schema not migrated")

// checkSchema returns ErrNotMigrated when the schema is missing or out of
// date. It asks the database until the answer is yes, then never again.
func (q *Queue) checkSchema(ctx context.Context) error {
	if q.migrated.Load() {
		return nil
	}
	ms, err := migrate.Load(migrations.FS)
	if err != nil {
		return err
	}
	have, err := migrate.Version(ctx, q.pool, q.cfg.schema)
	if err != nil {
		return classify(fmt.Errorf("checking schema %s: %w", q.cfg.schema, err))
	}
	if want := ms[len(ms)-1].Version; have < want {
		return fmt.Errorf("%w: schema %q is at version %d of %d; call Queue.Migrate (or run `%s`)",
			ErrNotMigrated, q.cfg.schema, have, want, migrateHint(q.cfg.schema))
	}
	q.migrated.Store(true)
	return nil
}

// migrateHint is the CLI command that migrates schema: it needs --schema
// for any but the default one (a schema name is a plain identifier, so it
// needs no quoting for the shell).
func migrateHint(schema string) string {
	if schema == DefaultSchema {
		return "backlog migrate up"
	}
	return "backlog --schema " + schema + " migrate up"
}

// Job returns a job's record, or ErrNotFound. With WithReadPool it reads
// the read pool (unless ctx comes from ReadPrimary): a job just enqueued
// may not be there yet.
func (q *Queue) Job(ctx context.Context, id uuid.UUID) (*JobInfo, error) {
	if q.isClosed() {
		return nil, ErrClosed
	}
	return q.jobFrom(ctx, q.readsFor(ctx), id)
}

// jobFrom reads a job through st, on st's pool: the read pool's for Job,
// the primary's for Wait.
func (q *Queue) jobFrom(ctx context.Context, st *store.Store, id uuid.UUID) (*JobInfo, error) {
	r, err := st.Get(ctx, st.Pool(), id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, q.readErr(ctx, fmt.Errorf("reading job %s: %w", id, err))
	}
	return infoOf(r)
}

// infoOf turns a row into the JobInfo callers see.
func infoOf(r store.Row) (*JobInfo, error) {
	info := &JobInfo{ID: r.ID, Type: r.Type, Args: r.Args, Tags: r.Tags, State: State(r.State), Priority: r.Priority,
		Attempt: r.Attempt, MaxAttempts: r.MaxAttempts, Timeout: r.Timeout, Worker: r.Worker, Result: r.Result, Progress: r.Progress,
		LastError: r.LastError, CreatedAt: r.CreatedAt, RunAt: r.RunAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		OrderingKey: r.OrderingKey, UniqueKey: r.UniqueKey, ConcurrencyKey: r.ConcurrencyKey, Metadata: r.Meta}
	if len(r.Errors) > 0 {
		if err := json.Unmarshal(r.Errors, &info.Errors); err != nil {
			return nil, fmt.Errorf("decoding errors of job %s: %w", r.ID, err)
		}
	}
	return info, nil
}

// readErr classifies a failed read, telling an unmigrated schema apart.
func (q *Queue) readErr(ctx context.Context, err error) error {
	if pgerr.UndefinedTable(err) {
		if serr := q.checkSchema(ctx); serr != nil {
			return serr
		}
	}
	return classify(err)
}

// beginWork registers a Work call and starts the services it needs. It
// returns false after Close.
func (q *Queue) beginWork() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.works.Add(1)
	q.startLocked(q.listen.start, q.leases.start, q.comp.Start, q.maint.Start)
	return true
}

// Close stops every Work call (as if their contexts were cancelled, with
// their grace periods), waits for them, then stops the services in reverse
// start order: the scheduler, maintenance, acquirer (claims in flight are
// released), completer (every queued outcome is written), heartbeat,
// process registry (the process's row is deleted: Processes no longer
// lists it), listener and notifier. It never closes the pool. Close is
// idempotent; later calls return at once. Do not call it from a handler or
// a hook: it waits for them to return.
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
	svcs := q.services()
	for i := len(svcs) - 1; i >= 0; i-- {
		svcs[i].stop()
	}
	return nil
}

// isClosed reports whether Close was called.
func (q *Queue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// committed announces jobs committed by the Queue's own parts (see New).
func (q *Queue) committed(ps []posting.Posting) { q.announce.committed(ps) }

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
