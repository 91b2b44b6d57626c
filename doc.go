// Package backlog is an embeddable job queue backed by PostgreSQL.
//
// A [Queue] wraps the application's own [*pgxpool.Pool]. Jobs are rows in
// one table while they live (schema "backlog" by default, created by
// [Queue.Migrate]) and move to a history table, partitioned by expiry, once
// they finish.
// [Queue.Enqueue] inserts them, alone or inside the caller's transaction
// ([Queue.EnqueueTx]: a pgx.Tx or a database/sql one, see [Tx]), and
// [Queue.Work] runs them with a [Handler] in as many processes as needed:
// PostgreSQL is the only coordinator.
//
// # Concurrency
//
// A Queue is safe for concurrent use by any number of goroutines. A process
// normally holds one Queue and may call Work several times, for different
// job types or worker tags; all calls share one acquirer, one LISTEN
// connection, one heartbeat and one completer, so a process costs the
// database the same few background queries however many Work calls it
// runs. Many processes may work one schema at once.
//
// Work blocks like [net/http.Server.Serve]: cancelling its context stops it
// gracefully. [Queue.Close] stops every Work call and background service
// and is idempotent; after it, every method returns [ErrClosed]. A Queue
// never closes the pool.
//
// Handlers run concurrently, each in its own goroutine with its own
// context, and receive their [Job] as an argument, never through the
// context.
//
// # Delivery
//
// Delivery is at least once. A claimed job is held under a lease that the
// Queue renews while the handler runs; if the process dies, the lease
// expires and the job runs again elsewhere, so handlers must be idempotent.
// Each attempt's outcome is written once, fenced by the lease token, so a
// worker that lost its lease can never overwrite a newer attempt. Outcomes
// are written in batches, and a batch that fails because of one job's row
// is split until that job is alone: one job never costs another its
// outcome.
//
// # Enqueueing
//
// A job has a type (which selects the handler), JSON args and options:
// [Tags] for routing, [Priority], [RunAt] or [Delay], [MaxAttempts],
// [Timeout], [DependsOn] (run after other jobs completed), [OrderingKey]
// (one at a time, in order, per key) and [UniqueKey] (at most one live job
// per key). [Queue.EnqueueMany] inserts a batch in one statement. Bad input
// returns an [*InputError] naming the field, and nothing is written.
// Programs not written in Go enqueue with the SQL function enqueue() in the
// queue's schema, which validates, writes and announces a job the same way
// ([Enqueue from SQL]).
//
// # Typed jobs
//
// In Go, a job type is best declared once, by an args type whose
// [JobArgs.Kind] names it and which may declare its default options
// ([JobArgsWithOptions]). [Queue.EnqueueArgs], [Queue.EnqueueArgsTx] and
// [Spec] (for batches) take its values; [HandleArgs] registers a handler
// that gets them decoded. Typed jobs are rows like any other: SQL, other
// languages and the string API produce jobs a typed handler works. The
// guide is docs/typed-jobs.md.
//
// # Working
//
// A [Mux] routes jobs to handlers by type; [HandleArgs] (typed jobs) and
// [HandleJSON] decode args into a typed value. A handler returns nil to complete the job (optionally with a
// result, [Job.SetResult]), an error to retry it with backoff, [Permanent]
// to fail it at once, or [Snooze] to run it again later without spending an
// attempt. Panics are recovered and retried.
//
// # Observing and controlling
//
// [Queue.Job] reads a job's record, [Queue.Wait] waits for it to finish
// ([JobInfo.Err] tells whether it completed), [Queue.Cancel] cancels it,
// [Queue.Graph] shows the jobs around it (prerequisites and dependents,
// pending or finished, with their states), and [Queue.Stats] counts jobs.
// [Queue.Every] and [Queue.Cron] enqueue periodic jobs, exactly once per
// plan across all processes.
// [Queue.Processes] lists the live worker processes and their Work calls,
// and [Queue.Schedules] the registered schedules with their last and next
// plans, from any process. [Hooks] feed metrics and tracing.
//
// # Flow control
//
// [Queue.SetLimit] bounds a job type across every process: how many of its
// jobs run at once, how many per [ConcurrencyKey] (a tenant, a customer),
// and how many start per period (a token bucket, for the type or per key).
// The claim statement enforces limits in the database, under a per-type
// lock, so they are never exceeded, and a change applies to every process
// at once. Jobs with concurrency keys are claimed round-robin across keys,
// so one key's backlog does not hold up the others.
//
// # Guides
//
// The repository's README.md is the front door (a quickstart, a
// comparison with other queues, the headline benchmarks); its docs
// directory has one guide per topic:
//
//   - [API tour]: enqueue, work, outcomes, cancel, periodic jobs,
//     operating on jobs and types, hooks, errors, progress
//   - [DAGs and results]: [DependsOn], and reading prerequisites' results
//   - [Ordering and unique keys]: [OrderingKey] and [UniqueKey]
//   - [Flow control]: [Queue.SetLimit], fairness across keys
//   - [Enqueue from SQL]: the enqueue() function
//   - [database/sql]: [Queue.EnqueueTx] with database/sql, sqlx, GORM, Bun
//   - [Testing your code]: package backlogtest
//   - [OpenTelemetry]: module otelbacklog
//   - [Configuration]: every option with its default
//   - [Operations and upgrades]: migrations, PgBouncer, long transactions
//   - [Compatibility]: what a release may change; deprecation; migrations
//     and rolling upgrades
//   - [CLI], [Dashboard], [Guarantees and how it works], [Fault tolerance],
//     [Benchmarks], and the [CHANGELOG]
//
// # Limits and defaults
//
// Every limit on input and every default, in one place; each option's doc
// states its own default too. Input over a limit is refused with an
// [*InputError] naming the field, and nothing is written. The few a caller
// may need in code are exported (named in brackets).
//
// Jobs:
//
//   - type, and a schedule's name: 1 to 200 bytes
//   - tags: at most 32, each key and value at most 200 bytes, their JSON
//     encoding at most 4,096 bytes (the same for [WorkerTags])
//   - ordering, unique and concurrency keys: at most 255 bytes
//   - args: at most 1 MiB encoded ([MaxArgsBytes])
//   - result: at most 64 KiB encoded ([MaxResultBytes])
//   - progress: at most 4 KiB encoded ([MaxProgressBytes])
//   - metadata: at most 4,096 bytes as JSON ([MaxMetadataBytes])
//   - [Priority]: 0, first, to 100, last ([MinPriority], [MaxPriority]);
//     defaults to 0 ([DefaultPriority])
//   - [MaxAttempts]: 1 to 1,000,000; defaults to 25 ([DefaultMaxAttempts])
//   - [DependsOn]: at most 1,000 prerequisites
//   - [RunAt]: within the years 1 to 9999; [Timeout]: 0 (none) or at least
//     1 ms, stored in whole milliseconds (rounded up)
//   - [CatchUp]: 1 to 1,000; defaults to 1
//   - jobs in one [Queue.EnqueueMany], [Queue.EnqueueManyTx] or
//     [Queue.InsertMany] call: at most 10,000 ([MaxBatchJobs])
//   - text is valid UTF-8 without NUL bytes; JSON is what PostgreSQL's
//     jsonb stores ([Configuration])
//
// The Queue ([New]):
//
//   - [WithSchema]: a plain identifier of at most 48 bytes; defaults to
//     "backlog" ([DefaultSchema])
//   - [WithLease]: at least 1 s; defaults to 30 s
//   - [WithWorkerID]: at most 200 bytes; defaults to "hostname:pid:random"
//   - [WithPollInterval]: 30 s; [WithPollJitter]: 3 s
//   - [WithNotifyInterval]: 0
//   - [WithSweepInterval]: 5 s
//   - [WithCleanInterval]: 1 minute
//   - [WithRetention]: 24 hours for completed jobs, 7 days for failed and
//     cancelled ones; each at most 90 days
//   - [WithDiscardCompleted]: none (every finished job is kept)
//   - [WithReadPool]: none (the operator's reads run on New's pool)
//   - [WithRetryBackoff]: [DefaultBackoff] (1 s, doubling, capped at 1 h,
//     ±50 % jitter)
//
// A Work call ([Queue.Work]):
//
//   - [Concurrency]: 100; [Prefetch]: 1,000; [GracePeriod]: 10 s
//
// Flow control ([Limit]):
//
//   - Concurrency, KeyConcurrency, Rate and Burst: at most 2^30
//   - Per: whole milliseconds from 1 ms to 366 days
//   - Burst: defaults to the starts of 100 ms at the rate, at least 1
//
// Reading:
//
//   - [Queue.List]: pages of 50 by default ([DefaultListLimit]), at most
//     500 ([MaxListLimit]); [Filter].IDs at most 500
//   - [Queue.Graph]: at most 100 prerequisites and 100 dependents listed,
//     and the chain of the key at most 100; more dependents counted up to
//     10,000 in each place they are found
//   - [Queue.Stats]: finished jobs of the last 24 hours ([StatsWindow]);
//     an open transaction older than [OldTransactionWarning] (1 minute) is
//     logged
//   - [Queue.Throughput]: minute counts kept for 2 hours, hour counts for
//     90 days
//
// [API tour]: https://github.com/backlogq/backlog/blob/main/docs/api-tour.md
// [DAGs and results]: https://github.com/backlogq/backlog/blob/main/docs/dags.md
// [Ordering and unique keys]: https://github.com/backlogq/backlog/blob/main/docs/ordering-and-unique-keys.md
// [Flow control]: https://github.com/backlogq/backlog/blob/main/docs/flow-control.md
// [Enqueue from SQL]: https://github.com/backlogq/backlog/blob/main/docs/sql-enqueue.md
// [database/sql]: https://github.com/backlogq/backlog/blob/main/docs/database-sql.md
// [Testing your code]: https://github.com/backlogq/backlog/blob/main/docs/testing.md
// [OpenTelemetry]: https://github.com/backlogq/backlog/blob/main/docs/opentelemetry.md
// [Configuration]: https://github.com/backlogq/backlog/blob/main/docs/configuration.md
// [Operations and upgrades]: https://github.com/backlogq/backlog/blob/main/docs/operations.md
// [Compatibility]: https://github.com/backlogq/backlog/blob/main/docs/compatibility.md
// [CLI]: https://github.com/backlogq/backlog/blob/main/docs/cli.md
// [Dashboard]: https://github.com/backlogq/backlog/blob/main/docs/dashboard-reference.md
// [Guarantees and how it works]: https://github.com/backlogq/backlog/blob/main/docs/guarantees.md
// [Fault tolerance]: https://github.com/backlogq/backlog/blob/main/docs/fault-tolerance.md
// [Benchmarks]: https://github.com/backlogq/backlog/blob/main/docs/benchmarks.md
// [CHANGELOG]: https://github.com/backlogq/backlog/blob/main/CHANGELOG.md
package backlog
