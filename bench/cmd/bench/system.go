package main

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// jobHook is called for the start of every handler with the job's sequence
// number (from its args) and the moment the handler started: time.Now() in
// the handler for the Go systems, a wall-clock time reported by the child
// process for graphile-worker. nil means a no-op handler.
type jobHook func(seq int64, started time.Time)

// workSpec says how to run workers for one phase.
type workSpec struct {
	domains   int     // 0 or 1: one queue; more: that many job types / queues (idle layout)
	perDomain int     // workers per domain; 0: the system's default
	hook      jobHook // nil: no-op handler
}

// system is one contender: backlog, River (two settings), the raw-SQL floor
// or graphile-worker. An instance lives for one phase in one fresh schema.
type system interface {
	// Open creates the system's own pool and client. No workers run yet.
	Open(ctx context.Context) error
	// Migrate creates the system's tables in its schema.
	Migrate(ctx context.Context) error
	// BulkInsert inserts n no-op jobs, carrying seq from..from+n-1, with the
	// system's bulk insert (calls of at most insertChunk jobs).
	BulkInsert(ctx context.Context, from int64, n int) error
	// Insert inserts one job carrying seq with the system's single-row insert.
	Insert(ctx context.Context, seq int64) error
	// Start starts workers; they run until Stop.
	Start(ctx context.Context, spec workSpec) error
	// Stop stops the workers, waiting at most until ctx ends.
	Stop(ctx context.Context) error
	// Close closes the client and the pool (waiting at most until ctx ends).
	Close(ctx context.Context)
	// Pool is the system's pool (nil before Open).
	Pool() *pgxpool.Pool
	// Counter counts the statements the pool sends.
	Counter() *stmtCounter
	// Tables tells the monitor where the jobs are.
	Tables() jobTables
}

// jobTables holds the monitor's queries on a system's job table.
type jobTables struct {
	table     string // the job table, schema-qualified and quoted (for ANALYZE)
	pending   string // one row, one bool: is any job still waiting or running?
	completed string // one row, one count: jobs completed so far
	ready     string // one row, one count: jobs waiting to run (the queue depth)
}

// stateTables are the queries for a job table with a state column whose
// values include 'available', 'running' and 'completed' (backlog, River).
// Each EXISTS matches one of the table's indexes, so pending stays cheap at
// any size.
func stateTables(table string) jobTables {
	return jobTables{
		table: table,
		pending: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s WHERE state = 'available')
		OR EXISTS (SELECT 1 FROM %[1]s WHERE state = 'running')`, table),
		completed: fmt.Sprintf(`SELECT count(*) FROM %s WHERE state = 'completed'`, table),
		ready:     fmt.Sprintf(`SELECT count(*) FROM %s WHERE state = 'available'`, table),
	}
}

// kind is a column of the table: how to build a system and which workloads
// it takes part in.
type kind struct {
	key       string // for -only
	label     string // column header
	note      string // printed under the table
	workloads map[string]bool
	new       func(env *benchEnv, schema string) system
	// prepare, if set, runs once before the workloads and returns what to
	// add to the note (versions); an error skips the column (its cells say
	// "skipped", the notes say why).
	prepare func(ctx context.Context) (string, error)
	skip    string // why the column is skipped; empty: it runs
}

// backlog's defaults, as its package doc ("Limits and defaults") states
// them: the "backlog default" column runs with them (it sets none), the
// raw SQL floor leases for as long, and the notes name them.
const (
	backlogConcurrency    = 100
	backlogNotifyInterval = time.Duration(0)
	backlogLease          = 30 * time.Second
)

func allKinds(cfg *config) []kind {
	all := map[string]bool{"burndown": true, "large": true, "offered": true, "latency": true, "idle": true, "flow": true, "history": true}
	rt := &nodeRuntime{}
	return []kind{
		{key: "backlog", label: "backlog default", workloads: all,
			note: fmt.Sprintf("backlog: backlog.New(ctx, pool, backlog.WithSchema(s)) and Work(ctx, h, backlog.Types(%q)); every other setting at its default (Concurrency %d, LISTEN/NOTIFY, notify interval %s, lease %s).",
				benchType, backlogConcurrency, backlogNotifyInterval, backlogLease),
			new: func(e *benchEnv, s string) system { return newBacklog(e, s, false) }},
		{key: "backlog-discard", label: "backlog discard", workloads: map[string]bool{"burndown": true, "large": true, "offered": true, "latency": true, "idle": true},
			note: "backlog discard: as backlog default, with backlog.WithDiscardCompleted(): a completed job nobody needs kept (no result, no Wait, no dependents; every benchmark job) is deleted at completion instead of moved to job_history, as graphile-worker does with every job.",
			new:  func(e *benchEnv, s string) system { return newBacklog(e, s, true) }},
		{key: "river", label: "River default", workloads: allBut(all, "large"), // its 200,000-job burn-down already times out
			note: fmt.Sprintf("River default: one queue with MaxWorkers %d (River requires a number; 100 is the value its docs use), FetchCooldown %s and FetchPollInterval %s (its defaults). Both River columns run in their own schema through Config.Schema and rivermigrate's Config.Schema (no search_path), insert with Insert / InsertManyFast, and log warnings to stderr.",
				riverDefaultWorkers, river.FetchCooldownDefault, river.FetchPollIntervalDefault),
			new: func(e *benchEnv, s string) system { return newRiver(e, s, false) }},
		{key: "river-tuned", label: "River tuned", workloads: all,
			note: fmt.Sprintf("River tuned: the settings of River's own benchmark (riverbench): FetchCooldown %s, FetchPollInterval %s, MaxWorkers %d.", riverTunedCooldown, riverTunedPoll, riverTunedWorkers),
			new:  func(e *benchEnv, s string) system { return newRiver(e, s, true) }},
		{key: "floor", label: "raw SQL floor", workloads: map[string]bool{"burndown": true, "large": true},
			note: fmt.Sprintf("raw SQL floor: backlog's own claim and finish statements (internal/store Claim and Finish, imported from the library) in a bare loop: %d goroutines, each claiming up to %d jobs and completing them with one Finish statement; no acquirer, leases, heartbeat or NOTIFY. Jobs are inserted like backlog's (EnqueueMany).", cfg.floorConns, cfg.floorBatch),
			new:  func(e *benchEnv, s string) system { return newFloor(e, s) }},
		{key: "graphile", label: "graphile-worker", workloads: all,
			prepare: func(ctx context.Context) (string, error) {
				if err := rt.prepare(ctx); err != nil {
					return "", err
				}
				return fmt.Sprintf("Versions: graphile-worker %s, pg (node-postgres) %s, Node %s.", rt.gwVersion, rt.pgVersion, rt.nodeVersion), nil
			},
			note: fmt.Sprintf("graphile-worker: the high-throughput settings of its performance page (worker.graphile.org/docs/performance): concurrentJobs %d, localQueue.size %d, completeJobBatchDelay and failJobBatchDelay %d ms; pollInterval (2 s), useNodeTime (off: one machine, one clock) and the rest at their defaults; new jobs are announced by add_job/add_jobs with NOTIFY jobs:insert, and the poll is only a fallback. One Node process (bench/graphile/worker.js: run() with a taskList, pgPool and noHandleSignals) per Open, driven over stdin/stdout; its pg.Pool has max %d (-pool) plus one client per runner, which each runner keeps checked out for LISTEN (the performance page uses 25; a burn-down here never had more than 4 clients open). Migrations by graphile-worker itself (runMigrations) into the phase's schema (its schema option); jobs inserted from Go with its add_jobs SQL function (bulk, the JSON form its own addJobs sends) and add_job (single). It deletes a completed job, so the burn-down ends when no row of _private_jobs is available or locked. Statements = the Go pool's (the inserts) plus every query call of the Node process's pg clients, counted in that process; client CPU includes the Node process (utime+stime from /proc/<pid>/stat, 10 ms ticks); pickup latency takes the handler's start as the Node process reports it (wall clock, performance.timeOrigin + performance.now(), µs), not when the harness reads the report (which would add the pipe's latency).",
				graphileConcurrency, graphileLocalQueue, graphileBatchDelay, cfg.poolConns),
			new: func(e *benchEnv, s string) system { return newGraphile(e, s, rt) }},
	}
}

// allBut returns ws without the workloads named.
func allBut(ws map[string]bool, without ...string) map[string]bool {
	out := maps.Clone(ws)
	for _, w := range without {
		delete(out, w)
	}
	return out
}
