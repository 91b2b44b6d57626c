package backlog

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults that callers may compare against or pass on (the package doc's
// "Limits and defaults" lists every default; each option's doc states its
// own).
const (
	// DefaultSchema is the schema of a Queue without WithSchema, and of
	// the backlog command without --schema.
	DefaultSchema = "backlog"
	// DefaultMaxAttempts is a job's MaxAttempts when not set.
	DefaultMaxAttempts = 25
	// DefaultPriority is a job's Priority when not set.
	DefaultPriority = 0
)

// The other defaults, stated in the package doc and in each option's doc.
const (
	defaultLease          = 30 * time.Second
	defaultPollInterval   = 30 * time.Second
	defaultPollJitter     = 3 * time.Second
	defaultNotifyInterval = time.Duration(0)
	defaultSweepInterval  = 5 * time.Second
	defaultConcurrency    = 100
	defaultPrefetch       = 1000
	defaultGracePeriod    = 10 * time.Second
	defaultCleanInterval  = time.Minute
	defaultKeepCompleted  = 24 * time.Hour
	defaultKeepFailed     = 7 * 24 * time.Hour
)

// Option configures a Queue (see New). The With… functions return them.
type Option interface{ applyQueue(*config) }

type queueOption func(*config)

func (f queueOption) applyQueue(c *config) { f(c) }

type config struct {
	schema         string
	logger         *slog.Logger
	lease          time.Duration
	workerID       string
	pollInterval   time.Duration
	pollJitter     time.Duration
	pollOnly       bool
	listenConn     func(context.Context) (*pgx.Conn, error)
	readPool       *pgxpool.Pool
	readPoolSet    bool // WithReadPool was given (a nil pool is refused)
	notifyInterval time.Duration
	sweepInterval  time.Duration
	backoff        Backoff
	cleanInterval  time.Duration
	keepCompleted  time.Duration
	keepFailed     time.Duration
	// discard: completed jobs nobody needs kept are deleted at completion
	// (WithDiscardCompleted): of every type (discardAll), or of these.
	discardAll bool
	discard    map[string]bool
	// vacuumDead, vacuumLive: the dead rows of the jobs table past which
	// the maintenance loop vacuums it, and the live ones it must hold (0:
	// their defaults; tests lower them).
	vacuumDead, vacuumLive int64
	hooks                  Hooks
	clock                  func() time.Time // wall clock; tests skew it
}

// validate checks a Queue's configuration.
func (cfg *config) validate() error {
	switch {
	case !schemaRE.MatchString(cfg.schema):
		return invalid("schema", "%q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 48 bytes)", cfg.schema)
	case cfg.logger == nil:
		return invalid("logger", "must not be nil")
	case cfg.lease < time.Second:
		return invalid("lease", "%s is shorter than 1s", cfg.lease)
	case cfg.pollInterval <= 0:
		return invalid("poll interval", "must be positive, got %s", cfg.pollInterval)
	case cfg.pollJitter < 0:
		return invalid("poll jitter", "must not be negative, got %s", cfg.pollJitter)
	case cfg.notifyInterval < 0:
		return invalid("notify interval", "must not be negative, got %s", cfg.notifyInterval)
	case cfg.sweepInterval <= 0:
		return invalid("sweep interval", "must be positive, got %s", cfg.sweepInterval)
	case cfg.cleanInterval <= 0:
		return invalid("clean interval", "must be positive, got %s", cfg.cleanInterval)
	case cfg.keepCompleted <= 0 || cfg.keepFailed <= 0:
		return invalid("retention", "must be positive, got %s and %s", cfg.keepCompleted, cfg.keepFailed)
	case cfg.keepCompleted > maxRetention || cfg.keepFailed > maxRetention:
		return invalid("retention", "must be at most 90 days, got %s and %s", cfg.keepCompleted, cfg.keepFailed)
	case cfg.clock == nil:
		return invalid("clock", "must not be nil")
	case cfg.readPoolSet && cfg.readPool == nil:
		return invalid("read pool", "must not be nil (leave WithReadPool out to read from the primary pool)")
	}
	if err := validateText("worker id", cfg.workerID, maxWorkerIDBytes, true); err != nil {
		return err
	}
	for t := range cfg.discard {
		var ie *InputError
		if err := validateType(t); errors.As(err, &ie) {
			return invalid("discard completed", "type %q: %s", t, ie.Reason)
		}
	}
	return cfg.backoff.validate()
}

func defaultConfig() config {
	return config{
		schema:         DefaultSchema,
		logger:         slog.Default(),
		lease:          defaultLease,
		pollInterval:   defaultPollInterval,
		pollJitter:     defaultPollJitter,
		notifyInterval: defaultNotifyInterval,
		sweepInterval:  defaultSweepInterval,
		backoff:        DefaultBackoff,
		cleanInterval:  defaultCleanInterval,
		keepCompleted:  defaultKeepCompleted,
		keepFailed:     defaultKeepFailed,
		clock:          time.Now,
	}
}

// WithSchema sets the PostgreSQL schema holding backlog's tables. It must be
// a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 48 bytes). The NOTIFY
// channel is named after it, so queues in different schemas never wake each
// other. Defaults to "backlog".
func WithSchema(name string) Option { return queueOption(func(c *config) { c.schema = name }) }

// WithLogger sets the structured logger. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option { return queueOption(func(c *config) { c.logger = l }) }

// WithLease sets how long a claim holds a job without a heartbeat. One
// heartbeat per Queue renews every held lease each lease/3; a job whose
// worker died is claimable again once its lease has expired and the sweep
// has run. Must be at least 1s. Defaults to 30 seconds.
func WithLease(d time.Duration) Option { return queueOption(func(c *config) { c.lease = d }) }

// WithWorkerID names this process in the jobs it holds (jobs.worker) and in
// logs. Defaults to "hostname:pid:random".
func WithWorkerID(id string) Option { return queueOption(func(c *config) { c.workerID = id }) }

// WithPollInterval sets the backup poll: how often an idle domain queries
// the database although no notification arrived (notifications can be lost
// while the listener reconnects; jobs inserted with raw SQL send none).
// A failed claim is retried with a backoff bounded by 5 seconds, or by
// this interval when it is shorter. Defaults to 30 seconds.
func WithPollInterval(d time.Duration) Option {
	return queueOption(func(c *config) { c.pollInterval = d })
}

// WithPollJitter adds a random delay in [0, d) to each backup poll so that
// many processes do not poll in step. Defaults to 3 seconds.
func WithPollJitter(d time.Duration) Option { return queueOption(func(c *config) { c.pollJitter = d }) }

// WithPollOnly turns LISTEN off: idle workers find new jobs through the
// backup poll and the run_at timers only, and this process's own enqueues
// wake its workers directly. For PgBouncer in transaction pooling mode when
// no direct connection is available for LISTEN. Defaults to off.
func WithPollOnly() Option { return queueOption(func(c *config) { c.pollOnly = true }) }

// WithListenConn sets how the listener gets its dedicated connection, e.g. a
// direct connection to PostgreSQL when the pool goes through PgBouncer. The
// listener closes the connection when done with it. Defaults to a
// connection taken out of the Queue's pool (pgxpool Acquire + Hijack).
func WithListenConn(f func(context.Context) (*pgx.Conn, error)) Option {
	return queueOption(func(c *config) { c.listenConn = f })
}

// WithReadPool sends the operator's reads to pool, typically a hot
// standby of the primary that New's pool connects to: Job, List, Graph,
// Stats (but for its oldest-open-transaction check, which is about the
// primary), Throughput, Latency, Processes, Schedules, Limits and Paused,
// and through them the dashboard (backlogui) and the backlog command's
// read commands. A read whose context comes from ReadPrimary goes to the
// primary instead: use it where a read decides or confirms a write (the
// dashboard counts the jobs of a bulk action and shows the limit an edit
// replaces that way). Everything else stays on New's pool: enqueues,
// claims, the heartbeat, outcomes, the listener, Wait (which must see a
// job's outcome the moment it is written), Cancel, Retry, Delete, their
// …Where forms, SetLimit, Pause, migrations and the maintenance loops.
// ReadPoolStatus tells how far behind the read pool is.
//
// Reads from a standby are as old as its replay lag (docs/read-replicas.md):
// a job just enqueued may be missing from List and Job (ErrNotFound), a
// finished job may still show as running, Stats may count jobs already
// claimed as available. There is no fallback to the primary when the
// read pool's server is down (its reads fail): list the primary as a
// second host with target_session_attrs=prefer-standby for one. A pool
// that connects to a primary works too (e.g. a separate pool with
// fewer connections, to bound the operator's load); its reads are then
// never stale. The Queue never closes pool; a nil pool is an *InputError.
// Defaults to none: every read runs on New's pool.
func WithReadPool(pool *pgxpool.Pool) Option {
	return queueOption(func(c *config) { c.readPool, c.readPoolSet = pool, true })
}

// WithNotifyInterval spaces the NOTIFY transactions this process sends for
// jobs it enqueued (Enqueue, EnqueueMany, periodic jobs) at least this far
// apart; jobs enqueued in between are announced together, one posting per
// (type, tags), by a trailing NOTIFY at the end of the interval. Whatever
// the interval, only one such transaction is in flight at a time, and it
// carries everything committed while the previous one was in flight, so
// the number of NOTIFYs adapts to the load by itself. EnqueueTx always
// notifies inside the caller's transaction. Defaults to 0 (measured here:
// pickup p50 2.8 ms at 1,000 jobs/s against 4.0 ms with 2 ms, and no loss of
// enqueue throughput).
func WithNotifyInterval(d time.Duration) Option {
	return queueOption(func(c *config) { c.notifyInterval = d })
}

// WithSweepInterval sets the longest time between two looks of this
// process for expired leases (jobs of crashed workers), which it makes
// available again. Besides, the sweep runs just after the earliest lease of
// a running job expires. The interval is jittered by up to 20%. Defaults to
// 5 seconds.
func WithSweepInterval(d time.Duration) Option {
	return queueOption(func(c *config) { c.sweepInterval = d })
}

// maxRetention is the longest retention WithRetention accepts (90 days):
// job_history has a partition for every day of it ahead, and a lookup of a
// finished job by ID probes each.
const maxRetention = 90 * 24 * time.Hour

// WithRetention sets how long finished jobs are kept in job_history before
// the cleaner drops them: completed ones for completed, failed and
// cancelled ones for failed. job_history is partitioned by expiry, one
// partition a UTC day, and dropped a partition at a time, so a job is kept
// at least its retention and at most a day longer; a change applies to jobs
// that finish afterwards. periodic_runs rows are kept as long as failed
// jobs, except each schedule's latest, which is always kept. Each must be
// positive and at most 90 days. Defaults to 24 hours and 7 days.
func WithRetention(completed, failed time.Duration) Option {
	return queueOption(func(c *config) { c.keepCompleted, c.keepFailed = completed, failed })
}

// WithDiscardCompleted deletes the completed jobs of the given types (of
// every type when none is given) that nobody needs kept, at completion,
// instead of moving them to job_history, as graphile-worker does with
// every job: finishing such a job then writes one row less, which is what
// a large backlog of short jobs spends most of its time on. A completed
// job is kept all the same when its handler set a result (SetResult), when
// a Wait had marked it before it completed, or when other jobs depend
// on it (DependsOn, a later job of its ordering key): their results and
// outcomes are read from job_history. A job whose outcome had to wait for
// its row (a transaction of yours held it) is written in place and kept
// as usual. Failed and cancelled jobs are always kept. The per-minute
// counters (Stats, Throughput, the dashboard) count deleted jobs too; Job,
// List, Wait and the dashboard no longer find them once completed (a
// Wait that comes later returns ErrNotFound), and a job enqueued later
// with DependsOn on one is refused as naming an unknown prerequisite:
// enqueue dependents together with their prerequisites (one EnqueueMany),
// or leave such types out. Several calls add up. Defaults to none: every
// finished job is kept for its retention (WithRetention).
func WithDiscardCompleted(types ...string) Option {
	return queueOption(func(c *config) {
		if len(types) == 0 {
			c.discardAll = true
			return
		}
		if c.discard == nil {
			c.discard = map[string]bool{}
		}
		for _, t := range types {
			c.discard[t] = true
		}
	})
}

// discards reports whether completed jobs of type typ may be deleted at
// completion (WithDiscardCompleted).
func (cfg *config) discards(typ string) bool { return cfg.discardAll || cfg.discard[typ] }

// WithCleanInterval sets how often a Work process runs the cleaner (jittered
// by up to 20 %). Defaults to 1 minute.
func WithCleanInterval(d time.Duration) Option {
	return queueOption(func(c *config) { c.cleanInterval = d })
}

// WithHooks installs metrics and tracing callbacks. Defaults to none.
func WithHooks(h Hooks) Option { return queueOption(func(c *config) { c.hooks = h }) }

// WithRetryBackoff sets the Queue-wide retry backoff; Work and Mux
// registrations can override it per job type with RetryBackoff. Defaults to
// DefaultBackoff.
func WithRetryBackoff(b Backoff) Option { return queueOption(func(c *config) { c.backoff = b }) }

// EnqueueOption configures one job at enqueue time: Tags, Priority, RunAt,
// Delay, MaxAttempts, Timeout, DependsOn, OrderingKey, UniqueKey,
// ConcurrencyKey, Metadata, and, for
// periodic jobs only, CatchUp.
type EnqueueOption interface{ applyEnqueue(*enqueueConfig) }

type enqueueConfig struct {
	tags        Tags
	priority    int
	runAt       *time.Time
	delay       time.Duration
	maxAttempts int
	timeout     time.Duration
	dependsOn   []uuid.UUID
	orderingKey string
	uniqueKey   string
	concKey     string
	meta        map[string]string
	catchUp     int // periodic jobs only
}

type enqueueFunc func(*enqueueConfig)

func (f enqueueFunc) applyEnqueue(c *enqueueConfig) { f(c) }

// Tags are a job's routing labels: a job runs only on a worker whose
// WorkerTags contain every one of the job's tags with the same value. An
// untagged job runs on any worker. Defaults to none.
type Tags map[string]string

func (t Tags) applyEnqueue(c *enqueueConfig) {
	if c.tags == nil {
		c.tags = Tags{}
	}
	for k, v := range t {
		c.tags[k] = v
	}
}

// Priority sets the job's priority from MinPriority (0, runs first) to
// MaxPriority (100). Defaults to 0.
func Priority(p int) EnqueueOption { return enqueueFunc(func(c *enqueueConfig) { c.priority = p }) }

// RunAt makes the job available no earlier than t. Defaults to now.
func RunAt(t time.Time) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.runAt = &t })
}

// Delay makes the job available d after the database's now() at insert.
// Must not be negative. Defaults to 0.
func Delay(d time.Duration) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.delay = d })
}

// MaxAttempts sets how many times the job may run before it fails: from 1
// to 1,000,000. Defaults to 25 (DefaultMaxAttempts).
func MaxAttempts(n int) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.maxAttempts = n })
}

// Timeout cancels the handler's context (cause ErrJobTimeout) d after an
// attempt starts; the attempt then counts as failed and is retried. Must
// not be negative; 0 means no timeout. Defaults to 0.
func Timeout(d time.Duration) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.timeout = d })
}

// DependsOn keeps the job blocked until every listed job has completed; it
// then becomes available. If one of them fails or is cancelled, this job is
// cancelled (with a reason naming it), and so are its own dependents. The
// IDs may name earlier jobs or members of the same EnqueueMany batch (set
// JobSpec.ID). Unknown IDs and cycles are rejected and nothing is written.
// Defaults to none.
func DependsOn(ids ...uuid.UUID) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.dependsOn = append(c.dependsOn, ids...) })
}

// OrderingKey makes jobs with the same key run one at a time, in enqueue
// order: a job waits until its predecessor with the key has completed,
// failed or been cancelled (a retrying predecessor keeps it waiting).
// Different keys never wait for each other. At most 255 bytes, no NUL.
// Defaults to none.
func OrderingKey(key string) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.orderingKey = key })
}

// UniqueKey allows at most one live (blocked, available or running) job
// with the key: enqueueing another returns the existing job's ID, and
// InsertMany reports it as a duplicate. Once the job has finished the key
// is free again. At most 255 bytes, no NUL. Defaults to none.
func UniqueKey(key string) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.uniqueKey = key })
}

// ConcurrencyKey puts the job in a group for flow control (SetLimit): a
// tenant, a customer, an account. A limit's KeyConcurrency and a per-key
// Rate bound each key's jobs, and claims take keys in turn (round-robin
// within a priority), so one key with many waiting jobs does not hold up
// the others. Jobs without a key form one group of their own. Unlike
// OrderingKey it imposes no order. At most 255 bytes, no NUL. Defaults to
// none.
func ConcurrencyKey(key string) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) { c.concKey = key })
}

// Metadata attaches string pairs to the job that are not its input: trace
// context (the W3C traceparent of the request that enqueued it, which is
// what the otelbacklog module writes through the Enqueuing hook), who
// asked for it, a request ID. Handlers read them in Job.Metadata, and
// Queue.Job and List return them. Several Metadata options merge, a later
// value winning for the same key; they win over what the Enqueuing hook
// returns. Keys must not be empty; keys and values must be valid UTF-8
// without NUL bytes, and their JSON encoding at most MaxMetadataBytes
// (4,096 bytes).
// Defaults to none (the job's column is NULL).
func Metadata(m map[string]string) EnqueueOption {
	return enqueueFunc(func(c *enqueueConfig) {
		if len(m) == 0 {
			return
		}
		if c.meta == nil {
			c.meta = make(map[string]string, len(m))
		}
		for k, v := range m {
			c.meta[k] = v
		}
	})
}

// WorkOption configures one Work call: Concurrency, Prefetch, WorkerTags,
// Types, GracePeriod and RetryBackoff.
type WorkOption interface{ applyWork(*workConfig) }

type workConfig struct {
	concurrency int
	prefetch    int
	tags        WorkerTags
	types       []string
	grace       time.Duration
	backoff     *Backoff
}

type workFunc func(*workConfig)

func (f workFunc) applyWork(c *workConfig) { f(c) }

// Concurrency sets how many jobs a Work call runs at once: the number of
// its worker goroutines, each running one handler at a time. Idle workers
// hold no database connection and cost a few kilobytes each. How many jobs
// one claim takes is not bounded by it (see Prefetch). Must be at least 1.
// Defaults to 100.
func Concurrency(n int) WorkOption { return workFunc(func(c *workConfig) { c.concurrency = n }) }

// Prefetch sets the most jobs a Work call's domain claims ahead of its
// handlers, so that a worker finds its next job at once while the next
// claim is in flight. The buffer follows demand: about what the workers
// take during two claims, so slow handlers keep next to nothing back from
// other processes, and quick ones get claims of hundreds of jobs.
// Prefetched jobs are leased like running ones (their timeouts start with
// their handlers) and are given back when the last Work call of their
// domain returns, or when no worker took one for a second or two while
// every worker is busy (long handlers after quick ones), so that other
// processes' idle workers can run them. Work calls with the same types
// and tags share a domain and its buffer, which then holds at most the
// largest of their Prefetch values. 0 turns it off: a claim takes as many
// jobs as workers wait.
// Defaults to 1,000.
func Prefetch(n int) WorkOption { return workFunc(func(c *workConfig) { c.prefetch = n }) }

// Types sets the job types a Work call claims. Required unless the handler
// is a *Mux, whose registered types are the default.
func Types(types ...string) WorkOption {
	return workFunc(func(c *workConfig) { c.types = append([]string(nil), types...) })
}

// GracePeriod is how long running handlers may go on after Work's context is
// cancelled before their own contexts are cancelled (cause ErrShutdown).
// Defaults to 10 seconds.
func GracePeriod(d time.Duration) WorkOption {
	return workFunc(func(c *workConfig) { c.grace = d })
}

// WorkerTags are the tags of a Work call's workers: they take untagged jobs
// and jobs whose tags are all among these, with the same values. Defaults to
// none (untagged jobs only).
type WorkerTags map[string]string

func (t WorkerTags) applyWork(c *workConfig) {
	if c.tags == nil {
		c.tags = WorkerTags{}
	}
	for k, v := range t {
		c.tags[k] = v
	}
}

// RetryBackoff overrides the retry backoff for the jobs of one Work call
// (as a WorkOption) or of one job type (as a HandleOption to Mux.Handle).
// Defaults to the Queue's (WithRetryBackoff, else DefaultBackoff).
func RetryBackoff(b Backoff) BackoffOption { return BackoffOption(b) }

// BackoffOption is both a WorkOption and a HandleOption; RetryBackoff
// returns it.
type BackoffOption Backoff

func (r BackoffOption) applyWork(c *workConfig) { b := Backoff(r); c.backoff = &b }
func (r BackoffOption) applyHandle(rt *route)   { b := Backoff(r); rt.backoff = &b }
