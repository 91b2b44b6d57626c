#!/usr/bin/env node
// graphile-worker's side of the backlog benchmark. bench/cmd/bench
// (sys_graphile.go) starts one of these per phase and drives it over a line
// protocol; the jobs themselves are inserted by the Go side with
// graphile-worker's SQL functions (add_jobs / add_job).
//
// argv[2] is a JSON object: {schema, poolSize, worker, byText}, where worker
// holds graphile-worker's preset.worker options (concurrentJobs, localQueue,
// completeJobBatchDelay, …; the Go side owns the values and prints them in its
// notes). The connection comes from the standard PG* environment variables
// (node-postgres reads them), so no password appears on the command line.
//
// Protocol. Each line on stdin is a command; each command gets exactly one
// reply line on stdout, "ok[ <value>]" or "err <message>", in order:
//
//   migrate                         run graphile-worker's migrations into the schema
//   start <domains> <per> <report>  start workers (see start below); report=1:
//                                   each handler start prints an event line
//   stop                            stop all workers gracefully
//   now                             ok <wall-clock µs since the epoch> (clock check)
//   stats                           ok <statements sent so far>
//   texts                           ok <JSON {statement text: count}> (byText only)
//   reset-texts                     forget the counts by text
//
// Event lines, interleaved with replies: "job <seq> <µs since the epoch>",
// the wall-clock time at which the handler of the job with payload
// {"seq": n} started. End of stdin stops the workers and exits.
"use strict";

const { performance } = require("node:perf_hooks");
const readline = require("node:readline");
const pg = require("pg");
const { Logger, parseCronItems, run, runMigrations } = require("graphile-worker");

// stdout carries the protocol alone: anything logged through console goes to
// stderr.
console.log = console.info = console.debug = console.error;
// The parent stops us through the protocol (or by closing stdin); a Ctrl-C
// meant for it must not kill us halfway through returning jobs.
process.on("SIGINT", () => {});

const cfg = JSON.parse(process.argv[2] || "{}");
const write = (line) => process.stdout.write(line + "\n");

// Warnings and errors go to stderr; info and debug are dropped, and so is the
// warning that the pool is smaller than concurrentJobs: the harness gives
// every system the same pool size on purpose, and with the local queue and
// batched completions the handlers never wait for a client (a handful of
// clients are busy at once).
const logger = new Logger(() => (level, message) => {
  if (message.startsWith("WARNING: having maxPoolSize")) return;
  if (level === "error" || level === "warning") {
    process.stderr.write(`graphile-worker ${level}: ${message}\n`);
  }
});

// Client-side statement count: every query call on every client of our
// pools (graphile-worker sends everything through pool clients).
let statements = 0;
let texts = new Map();
function count(args) {
  statements++;
  if (cfg.byText) {
    const text = typeof args[0] === "string" ? args[0] : args[0]?.text ?? "?";
    let key = text.split(/\s+/).filter(Boolean).join(" ");
    if (key.length > 70) key = key.slice(0, 70) + "…";
    texts.set(key, (texts.get(key) ?? 0) + 1);
  }
}

// makePool returns a pg.Pool (graphile-worker's pgPool option) whose clients
// count their queries. Idle clients stay open, as in the Go side's pgxpool.
function makePool(max) {
  const pool = new pg.Pool({ max, idleTimeoutMillis: 0 });
  pool.on("error", (e) => logger.error(`idle client: ${e.message}`));
  pool.on("connect", (client) => {
    client.on("error", (e) => logger.error(`client: ${e.message}`));
    const query = client.query;
    client.query = function (...args) {
      count(args);
      return query.apply(this, args);
    };
  });
  return pool;
}

// The options from the Go side, in the schema of this phase, optionally with
// another concurrency.
function preset(concurrency) {
  const worker = { ...cfg.worker, schema: cfg.schema };
  if (concurrency > 0) worker.concurrentJobs = concurrency;
  return { worker };
}

const now = () => Math.round((performance.timeOrigin + performance.now()) * 1000);

let pool = null; // shared by the runners of one start
let runners = [];

// start runs `domains` runners (at least one), each with `per` concurrent
// jobs (0: cfg.worker.concurrentJobs) and a task of its own: "bench" for a single
// runner, "idle_00", "idle_01", … for several (the idle workload's domains).
// Every runner has its own local queue and keeps one client of the shared
// pool checked out for LISTEN, so the pool gets cfg.poolSize clients plus
// one per runner.
async function start(domains, per, report) {
  if (pool) throw new Error("already started");
  const handler = report
    ? (payload) => write(`job ${payload.seq} ${now()}`)
    : () => {};
  const n = Math.max(domains, 1);
  pool = makePool(cfg.poolSize + n);
  for (let i = 0; i < n; i++) {
    const task = n === 1 ? "bench" : `idle_${String(i).padStart(2, "0")}`;
    const runner = await run({
      pgPool: pool,
      logger,
      noHandleSignals: true,
      taskList: { [task]: handler },
      parsedCronItems: parseCronItems([]),
      preset: preset(per),
    });
    runner.promise.catch((e) => logger.error(`runner ${task} ended: ${e}`));
    runners.push(runner);
  }
}

// stop shuts the runners down gracefully (jobs left in a local queue go back
// to the table, batched completions are flushed), then ends their pool.
async function stop() {
  const [rs, p] = [runners, pool];
  [runners, pool] = [[], null];
  try {
    await Promise.all(rs.map((r) => r.stop()));
  } finally {
    await p?.end();
  }
}

async function migrate() {
  const p = makePool(cfg.poolSize);
  try {
    await runMigrations({ pgPool: p, logger, preset: preset(0) });
  } finally {
    await p.end();
  }
}

const commands = {
  migrate,
  start: (domains, per, report) => start(Number(domains), Number(per), report === "1"),
  stop,
  now: () => String(now()),
  stats: () => String(statements),
  texts: () => JSON.stringify(Object.fromEntries(texts)),
  "reset-texts": () => void (texts = new Map()),
};

// Commands run one at a time, in the order they came.
let queue = Promise.resolve();
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const [name, ...args] = line.trim().split(/\s+/);
  queue = queue.then(async () => {
    const cmd = commands[name];
    if (!cmd) return write(`err unknown command ${JSON.stringify(name)}`);
    try {
      const v = await cmd(...args);
      write(v === undefined ? "ok" : `ok ${v}`);
    } catch (e) {
      write(`err ${String(e?.message ?? e).replace(/\s+/g, " ")}`);
    }
  });
});
rl.on("close", () => {
  queue
    .then(stop)
    .catch((e) => logger.error(`stopping: ${e}`))
    .finally(() => process.exit(0));
});
