// Command hotdesign measures where finished jobs should live, in raw SQL on
// backlog's own schema and claim function: each design burns down the same
// pre-inserted jobs with claims of up to -batch jobs and one finish
// statement per claim on -conns connections, then retires the finished rows
// the way the design would (the cleaner's batched DELETE and a VACUUM, or a
// DROP of partitions). It prints jobs/s, WAL bytes and server and client
// CPU per job for both parts.
//
//	cd bench && ../scripts/with-db.sh go run ./cmd/hotdesign [-jobs N] [-runs N]
//
// Designs:
//   - update: today's, finished rows updated to completed and kept in jobs.
//   - move: finished rows deleted from jobs and inserted into a history
//     table in the same statement (one index, on id).
//   - move-part: the same into a history table partitioned by expiry (one
//     partition a day, index on id in each).
//   - move-part-brin: the same with a BRIN index on id instead of a btree.
//   - finish-fn: backlog's own finish() (the statement its completer
//     sends): the move into job_history with fencing, counters, notices
//     and the dependents' check.
//   - finish-fn-discard: the same finish() with every completion sent as
//     'discarded' (WithDiscardCompleted): the fencing, counters and
//     dependents' check, nothing kept.
//   - delete-locked: the same, each row locked first (FOR UPDATE SKIP
//     LOCKED, as finish() locks it): what that lock costs.
//   - delete: finished rows deleted, nothing kept.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/backlogq/backlog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	nJobs  = flag.Int("jobs", 100_000, "jobs per run")
	batch  = flag.Int("batch", 1000, "jobs per claim")
	conns  = flag.Int("conns", 2, "connections claiming and finishing")
	runs   = flag.Int("runs", 3, "runs per design (alternating); medians are printed")
	only   = flag.String("only", "update,move,move-part,move-part-brin,finish-fn,finish-fn-discard,delete-locked,delete", "designs")
	schema = "hotdesign"
)

type design struct {
	name   string
	setup  string // extra DDL after the migration
	finish string // $1 ids, $2 tokens
	retire func(ctx context.Context, c *pgx.Conn) error
	// retryBusy: finish returns the IDs of rows another transaction held
	// (status 1), written again as backlog's completer does.
	retryBusy bool
}

const cols = `id, type, args, tags, state, priority, run_at, attempt, max_attempts, timeout_ms, worker,
	ordering_key, unique_key, blocked_by, cancel_requested, result, last_error, errors, created_at, started_at, finished_at`

func designs() []design {
	h := schema + ".history"
	moveFinish := func(table string) string {
		return `WITH d AS (
	DELETE FROM ` + schema + `.jobs j USING unnest($1::uuid[], $2::uuid[]) AS t(id, token)
	WHERE j.id = t.id AND j.lease_token = t.token AND j.state = 'running'
	RETURNING j.*
) INSERT INTO ` + table + ` (` + cols + `, expires_at)
SELECT id, type, args, tags, 'completed', priority, run_at, attempt, max_attempts, timeout_ms, worker,
	ordering_key, unique_key, blocked_by, cancel_requested, NULL, NULL, errors, created_at, started_at, now(), now() + interval '1 day'
FROM d`
	}
	histDDL := `CREATE TABLE %s (
	id uuid NOT NULL, type text NOT NULL, args jsonb NOT NULL, tags jsonb NOT NULL, state text NOT NULL,
	priority smallint NOT NULL, run_at timestamptz NOT NULL, attempt integer NOT NULL, max_attempts integer NOT NULL,
	timeout_ms bigint NOT NULL, worker text, ordering_key text, unique_key text, blocked_by integer NOT NULL,
	cancel_requested boolean NOT NULL, result jsonb, last_error text, errors jsonb NOT NULL,
	created_at timestamptz NOT NULL, started_at timestamptz, finished_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL)`
	return []design{
		{name: "update",
			finish: `UPDATE ` + schema + `.jobs j SET state = 'completed', result = NULL, last_error = NULL,
	lease_token = NULL, lease_expires_at = NULL, finished_at = now()
FROM unnest($1::uuid[], $2::uuid[]) AS t(id, token)
WHERE j.id = t.id AND j.lease_token = t.token AND j.state = 'running'`,
			retire: func(ctx context.Context, c *pgx.Conn) error {
				for {
					tag, err := c.Exec(ctx, `DELETE FROM `+schema+`.jobs WHERE id IN (SELECT id FROM `+schema+`.jobs
	WHERE state IN ('completed', 'failed', 'cancelled') ORDER BY finished_at LIMIT 1000 FOR UPDATE SKIP LOCKED)`)
					if err != nil {
						return err
					}
					if tag.RowsAffected() == 0 {
						break
					}
				}
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "move",
			setup:  fmt.Sprintf(histDDL, h) + `; CREATE INDEX ON ` + h + ` (id)`,
			finish: moveFinish(h),
			retire: func(ctx context.Context, c *pgx.Conn) error {
				for {
					tag, err := c.Exec(ctx, `DELETE FROM `+h+` WHERE ctid = ANY(ARRAY(SELECT ctid FROM `+h+` ORDER BY expires_at LIMIT 1000))`)
					if err != nil {
						return err
					}
					if tag.RowsAffected() == 0 {
						break
					}
				}
				if _, err := c.Exec(ctx, `VACUUM `+h); err != nil {
					return err
				}
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "move-part",
			setup: fmt.Sprintf(histDDL, h) + ` PARTITION BY RANGE (expires_at);
CREATE INDEX ON ` + h + ` (id);
CREATE TABLE ` + h + `_0 PARTITION OF ` + h + ` FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '12 hours');
CREATE TABLE ` + h + `_1 PARTITION OF ` + h + ` FOR VALUES FROM (now() + interval '12 hours') TO (now() + interval '36 hours');
CREATE TABLE ` + h + `_2 PARTITION OF ` + h + ` FOR VALUES FROM (now() + interval '36 hours') TO (now() + interval '60 hours')`,
			finish: moveFinish(h),
			retire: func(ctx context.Context, c *pgx.Conn) error {
				for _, p := range []string{"_0", "_1", "_2"} {
					if _, err := c.Exec(ctx, `DROP TABLE `+h+p); err != nil {
						return err
					}
				}
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "move-part-brin",
			setup: fmt.Sprintf(histDDL, h) + ` PARTITION BY RANGE (expires_at);
CREATE INDEX ON ` + h + ` USING brin (id) WITH (pages_per_range = 16);
CREATE TABLE ` + h + `_0 PARTITION OF ` + h + ` FOR VALUES FROM (now() - interval '1 day') TO (now() + interval '12 hours');
CREATE TABLE ` + h + `_1 PARTITION OF ` + h + ` FOR VALUES FROM (now() + interval '12 hours') TO (now() + interval '36 hours');
CREATE TABLE ` + h + `_2 PARTITION OF ` + h + ` FOR VALUES FROM (now() + interval '36 hours') TO (now() + interval '60 hours')`,
			finish: moveFinish(h),
			retire: func(ctx context.Context, c *pgx.Conn) error {
				for _, p := range []string{"_0", "_1", "_2"} {
					if _, err := c.Exec(ctx, `DROP TABLE `+h+p); err != nil {
						return err
					}
				}
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "finish-fn",
			// backlog's own finish() (what the completer calls): the move
			// with its fencing, counters, notices and dependents' check.
			// Called with the arguments the completer sends for a batch
			// of completions (version 25: progress and outcomes NULL).
			retryBusy: true,
			finish: `SELECT id, status FROM ` + schema + `.finish($1::uuid[], $2::uuid[],
	array_fill('completed'::text, ARRAY[cardinality($1::uuid[])]), array_fill(0::bigint, ARRAY[cardinality($1::uuid[])]),
	array_fill(0, ARRAY[cardinality($1::uuid[])]), array_fill(NULL::jsonb, ARRAY[cardinality($1::uuid[])]),
	array_fill(NULL::text, ARRAY[cardinality($1::uuid[])]), '{}'::uuid[], 'hotdesign', 86400000, 604800000, 10,
	NULL::jsonb[], NULL::text[])
WHERE status = 1`,
			retire: func(ctx context.Context, c *pgx.Conn) error {
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "finish-fn-discard",
			// The same with every completion sent as 'discarded'
			// (WithDiscardCompleted, migration 21): nothing kept.
			retryBusy: true,
			finish: `SELECT id, status FROM ` + schema + `.finish($1::uuid[], $2::uuid[],
	array_fill('discarded'::text, ARRAY[cardinality($1::uuid[])]), array_fill(0::bigint, ARRAY[cardinality($1::uuid[])]),
	array_fill(0, ARRAY[cardinality($1::uuid[])]), array_fill(NULL::jsonb, ARRAY[cardinality($1::uuid[])]),
	array_fill(NULL::text, ARRAY[cardinality($1::uuid[])]), '{}'::uuid[], 'hotdesign', 86400000, 604800000, 10,
	NULL::jsonb[], NULL::text[])
WHERE status = 1`,
			retire: func(ctx context.Context, c *pgx.Conn) error {
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "delete-locked",
			// delete, with each row locked first (FOR UPDATE SKIP LOCKED,
			// as finish() takes it so that a row another transaction holds
			// is skipped, not waited for): what the lock costs.
			// Rows skipped (held by another transaction) are returned
			// and written again, as finish()'s busy ones are.
			retryBusy: true,
			finish: `WITH l AS (
	SELECT x.id FROM unnest($1::uuid[], $2::uuid[]) AS t(id, token)
	CROSS JOIN LATERAL (SELECT f.id FROM ` + schema + `.jobs f WHERE f.id = t.id AND f.lease_token = t.token
	                    LIMIT 1 FOR UPDATE SKIP LOCKED) x
), d AS (
	DELETE FROM ` + schema + `.jobs j USING l WHERE j.id = l.id AND j.state = 'running' RETURNING j.id
)
SELECT x.id, 1::smallint FROM (SELECT unnest($1::uuid[]) EXCEPT SELECT id FROM l) AS x(id)`,
			retire: func(ctx context.Context, c *pgx.Conn) error {
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
		{name: "delete",
			finish: `DELETE FROM ` + schema + `.jobs j USING unnest($1::uuid[], $2::uuid[]) AS t(id, token)
WHERE j.id = t.id AND j.lease_token = t.token AND j.state = 'running'`,
			retire: func(ctx context.Context, c *pgx.Conn) error {
				_, err := c.Exec(ctx, `VACUUM `+schema+`.jobs`)
				return err
			}},
	}
}

type cost struct {
	secs, wal, server, client float64 // per job, except secs
}

func main() {
	flag.Parse()
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("DATABASE_URL is not set (run through scripts/with-db.sh)")
	}
	want := strings.Split(*only, ",")
	var ds []design
	for _, d := range designs() {
		if slices.Contains(want, d.name) {
			ds = append(ds, d)
		}
	}
	results := map[string][][2]cost{}
	for r := 0; r < *runs; r++ {
		for _, d := range ds {
			burn, retire, err := runOne(ctx, url, d)
			if err != nil {
				log.Fatalf("%s: %v", d.name, err)
			}
			log.Printf("run %d %-9s burn-down %6.0f jobs/s  WAL %4.0f B/job  server %5.1f µs/job  client %5.1f µs/job | retire %6.0f jobs/s  WAL %4.0f B/job  server %5.1f µs/job",
				r+1, d.name, float64(*nJobs)/burn.secs, burn.wal, burn.server, burn.client, float64(*nJobs)/retire.secs, retire.wal, retire.server)
			results[d.name] = append(results[d.name], [2]cost{burn, retire})
		}
	}
	fmt.Printf("\n%d jobs, claims of %d on %d connections, medians of %d runs\n\n", *nJobs, *batch, *conns, *runs)
	fmt.Println("| design | burn-down jobs/s | WAL B/job | server µs/job | client µs/job | retire: server µs/job | retire: WAL B/job | total server µs/job |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, d := range ds {
		rs := results[d.name]
		med := func(f func(c [2]cost) float64) float64 {
			v := make([]float64, len(rs))
			for i, c := range rs {
				v[i] = f(c)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		fmt.Printf("| %s | %.0f | %.0f | %.1f | %.1f | %.1f | %.0f | %.1f |\n", d.name,
			med(func(c [2]cost) float64 { return float64(*nJobs) / c[0].secs }),
			med(func(c [2]cost) float64 { return c[0].wal }),
			med(func(c [2]cost) float64 { return c[0].server }),
			med(func(c [2]cost) float64 { return c[0].client }),
			med(func(c [2]cost) float64 { return c[1].server }),
			med(func(c [2]cost) float64 { return c[1].wal }),
			med(func(c [2]cost) float64 { return c[0].server + c[1].server }))
	}
}

func runOne(ctx context.Context, url string, d design) (burn, retire cost, err error) {
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	if _, err = admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return
	}
	cfg.MaxConns = int32(*conns + 1)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return
	}
	defer pool.Close()
	q, err := backlog.New(ctx, pool, backlog.WithSchema(schema), backlog.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return
	}
	defer q.Close()
	if err = q.Migrate(ctx); err != nil {
		return
	}
	if d.setup != "" {
		if _, err = admin.Exec(ctx, d.setup); err != nil {
			return
		}
	}
	specs := make([]backlog.JobSpec, 0, 5000)
	for i := 0; i < *nJobs; i += len(specs) {
		specs = specs[:0]
		for j := i; j < *nJobs && len(specs) < 5000; j++ {
			specs = append(specs, backlog.JobSpec{Type: "bench", Args: json.RawMessage(`{"seq":` + strconv.Itoa(j) + `}`)})
		}
		if _, err = q.EnqueueMany(ctx, specs); err != nil {
			return
		}
	}
	for _, stmt := range []string{`VACUUM ANALYZE ` + schema + `.jobs`, `CHECKPOINT`} {
		if _, err = admin.Exec(ctx, stmt); err != nil {
			return
		}
	}

	claim := `SELECT id, lease_token FROM ` + schema + `.claim($1::text[], '{}'::jsonb, $2, 30000, 'w')`
	before, err := measure(ctx, admin)
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	errs := make(chan error, *conns)
	for range *conns {
		wg.Go(func() {
			for {
				rows, err := pool.Query(ctx, claim, pgx.QueryExecModeCacheDescribe, []string{"bench"}, *batch)
				if err != nil {
					errs <- err
					return
				}
				var ids, tokens [][16]byte
				var id, tok *[16]byte
				_, err = pgx.ForEachRow(rows, []any{&id, &tok}, func() error {
					if id != nil {
						ids, tokens = append(ids, *id), append(tokens, *tok)
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				if len(ids) == 0 {
					return
				}
				for len(ids) > 0 {
					if !d.retryBusy {
						if _, err := pool.Exec(ctx, d.finish, pgx.QueryExecModeCacheDescribe, ids, tokens); err != nil {
							errs <- err
							return
						}
						break
					}
					rows, err := pool.Query(ctx, d.finish, pgx.QueryExecModeCacheDescribe, ids, tokens)
					if err != nil {
						errs <- err
						return
					}
					busy, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([16]byte, error) {
						var id [16]byte
						var st int16
						return id, r.Scan(&id, &st)
					})
					if err != nil {
						errs <- err
						return
					}
					tok := make(map[[16]byte][16]byte, len(ids))
					for i := range ids {
						tok[ids[i]] = tokens[i]
					}
					ids, tokens = busy, tokens[:0]
					for _, b := range busy {
						tokens = append(tokens, tok[b])
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err = <-errs; err != nil {
		return
	}
	mid, err := measure(ctx, admin)
	if err != nil {
		return
	}
	var left int
	if err = admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.jobs WHERE state <> 'completed'`).Scan(&left); err != nil {
		return
	}
	if left != 0 {
		err = fmt.Errorf("%d jobs not completed", left)
		return
	}
	if err = d.retire(ctx, admin); err != nil {
		return
	}
	after, err := measure(ctx, admin)
	if err != nil {
		return
	}
	_, err = admin.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`)
	return diff(before, mid), diff(mid, after), err
}

type reading struct {
	at             time.Time
	wal            int64
	server, client time.Duration
}

func measure(ctx context.Context, c *pgx.Conn) (reading, error) {
	r := reading{at: time.Now(), client: selfCPU(), server: postgresCPU()}
	err := c.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&r.wal)
	return r, err
}

func diff(a, b reading) cost {
	n := float64(*nJobs)
	return cost{secs: b.at.Sub(a.at).Seconds(), wal: float64(b.wal-a.wal) / n,
		server: float64((b.server - a.server).Microseconds()) / n, client: float64((b.client - a.client).Microseconds()) / n}
}

// postgresCPU sums the CPU time of every process named postgres.
func postgresCPU() time.Duration {
	ents, _ := os.ReadDir("/proc")
	var total time.Duration
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					total += time.Duration(ns)
				}
			}
		}
	}
	return total
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
