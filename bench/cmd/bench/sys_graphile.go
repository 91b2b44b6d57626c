package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// graphile-worker's settings: the high-throughput configuration of its own
// performance page (worker.graphile.org/docs/performance), which also uses
// concurrency 24 with a local queue of 500 and completions and failures
// batched with a delay of 0 ms. The pool is the harness's instead of its 25.
const (
	graphileConcurrency = 24  // preset.worker.concurrentJobs
	graphileLocalQueue  = 500 // preset.worker.localQueue.size
	graphileBatchDelay  = 0   // ms: preset.worker.completeJobBatchDelay and failJobBatchDelay
)

// graphileSys is graphile-worker 0.17 running in a Node child process
// (bench/graphile/worker.js, one per Open), which migrates and works; jobs
// are inserted from here with graphile-worker's SQL functions add_jobs and
// add_job, on a pgxpool of the harness's size.
type graphileSys struct {
	env     *benchEnv
	rt      *nodeRuntime
	schema  string
	counter stmtCounter // this pool's statements plus those the child counts
	pool    *pgxpool.Pool
	node    *nodeChild

	addJobs, addJob string // the insert statements, schema-qualified
}

func newGraphile(env *benchEnv, schema string, rt *nodeRuntime) *graphileSys {
	s := &graphileSys{env: env, rt: rt, schema: schema}
	q := pgx.Identifier{schema}.Sanitize()
	// graphile-worker's own addJobs sends its specs the same way (one JSON
	// array through json_populate_recordset); only the count comes back.
	s.addJobs = fmt.Sprintf(`SELECT count(*) FROM %[1]s.add_jobs(ARRAY(SELECT json_populate_recordset(NULL::%[1]s.job_spec, $1::json)))`, q)
	s.addJob = fmt.Sprintf(`SELECT id FROM %s.add_job($1, $2::json)`, q)
	s.counter.remote = s
	return s
}

// graphileOptions is worker.js's configuration (its argv[2]).
type graphileOptions struct {
	Schema   string         `json:"schema"`
	PoolSize int32          `json:"poolSize"` // pg.Pool max, plus one per runner for its LISTEN connection
	Worker   map[string]any `json:"worker"`   // preset.worker options
	ByText   bool           `json:"byText"`   // count statements by text (-sqlstats)
}

// graphileWorkerOptions returns the preset.worker options every runner gets.
func graphileWorkerOptions() map[string]any {
	return map[string]any{
		"concurrentJobs":        graphileConcurrency,
		"localQueue":            map[string]any{"size": graphileLocalQueue},
		"completeJobBatchDelay": graphileBatchDelay,
		"failJobBatchDelay":     graphileBatchDelay,
	}
}

func (s *graphileSys) Open(ctx context.Context) error {
	pool, err := s.env.newPool(ctx, &s.counter)
	if err != nil {
		return err
	}
	arg, err := json.Marshal(graphileOptions{Schema: s.schema, PoolSize: s.env.cfg.poolConns,
		Worker: graphileWorkerOptions(), ByText: s.env.cfg.sqlStats})
	if err != nil {
		pool.Close()
		return err
	}
	node, err := startNode(s.rt, string(arg), s.childEnv())
	if err != nil {
		pool.Close()
		return err
	}
	s.pool, s.node = pool, node
	return nil
}

// childEnv is this process's environment with the connection to the
// benchmark database in node-postgres's PG* variables (which it reads by
// itself) instead of any DATABASE_URL or PG* settings of ours.
func (s *graphileSys) childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "GRAPHILE_") {
			env = append(env, kv)
		}
	}
	cc := s.env.poolBase.ConnConfig
	return append(env, "PGHOST="+cc.Host, "PGPORT="+strconv.Itoa(int(cc.Port)), "PGUSER="+cc.User,
		"PGPASSWORD="+cc.Password, "PGDATABASE="+cc.Database, "PGSSLMODE="+sslMode(cc.TLSConfig))
}

// sslMode translates pgx's TLS configuration into node-postgres's PGSSLMODE.
func sslMode(c *tls.Config) string {
	switch {
	case c == nil:
		return "disable"
	case c.InsecureSkipVerify:
		return "no-verify"
	default:
		return "verify-full"
	}
}

// Migrate runs graphile-worker's own migrations (in the child), which create
// the schema.
func (s *graphileSys) Migrate(ctx context.Context) error {
	_, err := s.node.call(ctx, "migrate")
	return err
}

func (s *graphileSys) BulkInsert(ctx context.Context, from int64, n int) error {
	buf := make([]byte, 0, 48*min(n, insertChunk))
	for done := 0; done < n; {
		buf = append(buf[:0], '[')
		k := 0
		for ; done+k < n && k < insertChunk; k++ {
			if k > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"identifier":"`+benchType+`","payload":{"seq":`...)
			buf = strconv.AppendInt(buf, from+int64(done+k), 10)
			buf = append(buf, "}}"...)
		}
		buf = append(buf, ']')
		var got int64
		if err := s.pool.QueryRow(ctx, s.addJobs, string(buf)).Scan(&got); err != nil {
			return err
		}
		if got != int64(k) {
			return fmt.Errorf("add_jobs inserted %d of %d jobs", got, k)
		}
		done += k
	}
	return nil
}

func (s *graphileSys) Insert(ctx context.Context, seq int64) error {
	var id int64
	return s.pool.QueryRow(ctx, s.addJob, benchType, fmt.Sprintf(`{"seq":%d}`, seq)).Scan(&id)
}

// Start runs one runner with the bench task, or for the idle layout one
// runner per domain, each with its own task identifier and perDomain
// concurrent jobs (a runner's concurrency is shared by all its tasks, so
// separate runners are what gives each domain workers of its own).
func (s *graphileSys) Start(ctx context.Context, spec workSpec) error {
	s.node.onJob.Store(nil)
	report := 0
	if spec.hook != nil {
		if err := s.checkClock(ctx); err != nil {
			return err
		}
		s.node.onJob.Store(&spec.hook)
		report = 1
	}
	_, err := s.node.call(ctx, fmt.Sprintf("start %d %d %d", spec.domains, spec.perDomain, report))
	return err
}

// checkClock makes sure the child's handler start times can be compared with
// this process's clock: the time the child reports for a "now" command must
// fall between sending the command and reading the reply. It logs the worst
// miss, if any (a miss is an error in every pickup latency).
func (s *graphileSys) checkClock(ctx context.Context) error {
	var worst time.Duration
	for range 5 {
		sent := time.Now()
		v, err := s.node.call(ctx, "now")
		if err != nil {
			return err
		}
		got := time.Now()
		us, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("graphile-worker now: %q", v)
		}
		at := time.UnixMicro(us)
		worst = max(worst, sent.Sub(at), at.Sub(got))
	}
	if worst > 100*time.Microsecond {
		logf("warning: graphile-worker: the Node process's clock is off from this process's by up to %s: every pickup latency is off by as much", worst)
	}
	return nil
}

// Stop shuts the runners down gracefully: jobs still in a local queue are
// returned, batched completions are flushed, the child's pool is ended.
func (s *graphileSys) Stop(ctx context.Context) error {
	if s.node == nil {
		return nil
	}
	_, err := s.node.call(ctx, "stop")
	return err
}

func (s *graphileSys) Close(ctx context.Context) {
	if s.node != nil {
		s.node.close(ctx)
	}
	if s.pool != nil {
		boundedClose(ctx, "graphile-worker's pgxpool", s.pool.Close)
	}
}

func (s *graphileSys) Pool() *pgxpool.Pool   { return s.pool }
func (s *graphileSys) Counter() *stmtCounter { return &s.counter }

// childCPU is the Node process's CPU (0 before Open).
func (s *graphileSys) childCPU() time.Duration {
	if s.node == nil {
		return 0
	}
	return s.node.cpu()
}

// statements, statementTexts and resetStatementTexts make the child's count
// of its queries part of Counter.
func (s *graphileSys) statements() (int64, error) {
	if s.node == nil {
		return 0, nil
	}
	v, err := s.remoteCall("stats")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

func (s *graphileSys) statementTexts() (map[string]int64, error) {
	if s.node == nil {
		return nil, nil
	}
	v, err := s.remoteCall("texts")
	if err != nil {
		return nil, err
	}
	var m map[string]int64
	return m, json.Unmarshal([]byte(v), &m)
}

func (s *graphileSys) resetStatementTexts() error {
	if s.node == nil {
		return nil
	}
	_, err := s.remoteCall("reset-texts")
	return err
}

func (s *graphileSys) remoteCall(command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.node.call(ctx, command)
}

// Tables: graphile-worker deletes a job when it completes, so "no job
// available or running" is "no row that is available or locked" (a row that
// is neither has failed for good), and the completed count is the jobs ever
// inserted (the id sequence) minus the rows left. Jobs waiting in a local
// queue are locked, so the ready count leaves them out.
func (s *graphileSys) Tables() jobTables {
	t := pgx.Identifier{s.schema, "_private_jobs"}.Sanitize()
	lit := "'" + strings.ReplaceAll(t, "'", "''") + "'"
	return jobTables{
		table: t,
		pending: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s WHERE is_available)
		OR EXISTS (SELECT 1 FROM %[1]s WHERE locked_at IS NOT NULL)`, t),
		completed: fmt.Sprintf(`SELECT COALESCE(pg_sequence_last_value(pg_get_serial_sequence(%s, 'id')::regclass), 0)
		- (SELECT count(*) FROM %s)`, lit, t),
		ready: fmt.Sprintf(`SELECT count(*) FROM %s WHERE is_available`, t),
	}
}
