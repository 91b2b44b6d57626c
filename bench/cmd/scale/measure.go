package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/bench/internal/pgcpu"
)

// result is one run with n worker processes.
type result struct {
	burnRate, burnCPU  float64 // jobs/s; PostgreSQL µs per job
	burnStmts          float64 // the workers' statements per job
	loadRate, loadCPU  float64 // jobs/s done at the offered rate; µs per job
	waitP50, waitP99   float64 // ms from due to start under fixed load
	idleConns          int     // the workers' connections when idle
	loadConns          int     // the most seen under fixed load
	idleStmts, idleCPU float64 // statements/s per process; PostgreSQL ms/s
	cpuKnown           bool
}

func (r result) String() string {
	return fmt.Sprintf("burn %.0f jobs/s (%.1f µs/job, %.3f statements/job) · load %.0f jobs/s (%.1f µs/job, wait p50 %.1f p99 %.1f ms) · conns idle %d, load %d · idle %.2f stmts/s/process, %.2f ms/s PG CPU",
		r.burnRate, r.burnCPU, r.burnStmts, r.loadRate, r.loadCPU, r.waitP50, r.waitP99, r.idleConns, r.loadConns, r.idleStmts, r.idleCPU)
}

// worker is one worker process.
type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// statements asks the process its statement count.
func (w *worker) statements() (int64, error) {
	if _, err := io.WriteString(w.in, "?\n"); err != nil {
		return 0, err
	}
	line, err := w.out.ReadString('\n')
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(line), 10, 64)
}

// run is one measurement's database side: the monitor connection (left
// out of the CPU sums), the producer's pool and Queue.
type run struct {
	cfg    *config
	schema string
	mon    *pgx.Conn
	pool   *pgxpool.Pool
	q      *backlog.Queue
	local  bool
}

func measure(ctx context.Context, cfg *config, n int) (res result, err error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	r := &run{cfg: cfg, schema: "scale_" + hex.EncodeToString(b)}
	if r.mon, err = pgx.Connect(ctx, cfg.dbURL); err != nil {
		return res, err
	}
	defer r.mon.Close(context.WithoutCancel(ctx))
	var pid int
	if err := r.mon.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return res, err
	}
	r.local = pgcpu.Visible(pid)
	res.cpuKnown = r.local
	if r.pool, err = pgxpool.New(ctx, cfg.dbURL); err != nil {
		return res, err
	}
	defer r.pool.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if r.q, err = backlog.New(ctx, r.pool, backlog.WithSchema(r.schema), backlog.WithLogger(quiet)); err != nil {
		return res, err
	}
	defer func() {
		_ = r.q.Close()
		if _, derr := r.mon.Exec(context.WithoutCancel(ctx), `DROP SCHEMA `+pgx.Identifier{r.schema}.Sanitize()+` CASCADE`); derr != nil {
			logf("warning: dropping schema %s: %v", r.schema, derr)
		}
	}()
	if err := r.q.Migrate(ctx); err != nil {
		return res, err
	}
	if cfg.limit > 0 {
		for _, t := range []string{burnType, loadType} {
			if err := r.q.SetLimit(ctx, t, backlog.Limit{Concurrency: cfg.limit}); err != nil {
				return res, err
			}
		}
	}

	workers, err := startWorkers(ctx, r.schema, n)
	defer stopWorkers(workers)
	if err != nil {
		return res, err
	}
	if err := r.waitProcesses(ctx, n); err != nil {
		return res, err
	}
	if err := pause(ctx, cfg.settle); err != nil {
		return res, err
	}
	if err := r.idle(ctx, workers, &res); err != nil {
		return res, fmt.Errorf("idle: %w", err)
	}
	if err := r.burnDown(ctx, workers, &res); err != nil {
		return res, fmt.Errorf("burn-down: %w", err)
	}
	if err := r.fixedLoad(ctx, &res); err != nil {
		return res, fmt.Errorf("fixed load: %w", err)
	}
	return res, nil
}

func startWorkers(ctx context.Context, schema string, n int) ([]*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var ws []*worker
	for range n {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), childEnv+"=1", schemaEnv+"="+schema)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return ws, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return ws, err
		}
		if err := cmd.Start(); err != nil {
			return ws, err
		}
		ws = append(ws, &worker{cmd: cmd, in: in, out: bufio.NewReader(out)})
	}
	return ws, nil
}

// stopWorkers closes each process's stdin (it stops its Work call and
// closes its Queue and pool) and waits for them.
func stopWorkers(ws []*worker) {
	for _, w := range ws {
		_ = w.in.Close()
	}
	for _, w := range ws {
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = w.cmd.Process.Kill()
			<-done
		}
	}
}

// waitProcesses waits until n processes are registered (each has started
// its Work call).
func (r *run) waitProcesses(ctx context.Context, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ps, err := r.q.Processes(ctx)
		if err != nil {
			return err
		}
		if len(ps) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d worker processes registered after 2 minutes", len(ps), n)
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// cpu samples the server processes' CPU (empty when not local).
func (r *run) cpu(ctx context.Context) (map[int]time.Duration, error) {
	if !r.local {
		return nil, nil
	}
	pids, err := pgcpu.ServerPids(ctx, r.mon)
	if err != nil {
		return nil, err
	}
	return pgcpu.Sample(pids), nil
}

// conns counts the workers' connections.
func (r *run) conns(ctx context.Context) (int, error) {
	var n int
	err := r.mon.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
		appName).Scan(&n)
	return n, err
}

// statements sums the workers' statement counts.
func statements(ws []*worker) (int64, error) {
	var sum int64
	for _, w := range ws {
		n, err := w.statements()
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

func (r *run) idle(ctx context.Context, ws []*worker, res *result) error {
	count := func() (int64, error) { return statements(ws) }
	s0, err := count()
	if err != nil {
		return err
	}
	c0, err := r.cpu(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := pause(ctx, r.cfg.idle); err != nil {
		return err
	}
	s1, err := count()
	if err != nil {
		return err
	}
	c1, err := r.cpu(ctx)
	if err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	res.idleStmts = float64(s1-s0) / float64(len(ws)) / secs
	res.idleCPU = float64(pgcpu.Between(c0, c1).Microseconds()) / 1000 / secs
	res.idleConns, err = r.conns(ctx)
	return err
}

// insert enqueues n jobs of typ, in batches.
func (r *run) insert(ctx context.Context, typ string, n int) error {
	for n > 0 {
		k := min(n, 5000)
		specs := make([]backlog.JobSpec, k)
		for i := range specs {
			specs[i] = backlog.JobSpec{Type: typ}
		}
		if _, err := r.q.EnqueueMany(ctx, specs); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (r *run) burnDown(ctx context.Context, ws []*worker, res *result) error {
	if err := r.q.Pause(ctx, burnType); err != nil {
		return err
	}
	if err := r.insert(ctx, burnType, r.cfg.jobs); err != nil {
		return err
	}
	s0, err := statements(ws)
	if err != nil {
		return err
	}
	c0, err := r.cpu(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := r.q.Resume(ctx, burnType); err != nil {
		return err
	}
	left := `SELECT EXISTS (SELECT 1 FROM ` + pgx.Identifier{r.schema, "jobs"}.Sanitize() + ` WHERE type = $1 AND state IN ('available', 'running'))`
	for {
		var any bool
		if err := r.mon.QueryRow(ctx, left, burnType).Scan(&any); err != nil {
			return err
		}
		if !any {
			break
		}
		if time.Since(t0) > r.cfg.deadline {
			return fmt.Errorf("jobs left after %s", r.cfg.deadline)
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	d := time.Since(t0)
	c1, err := r.cpu(ctx)
	if err != nil {
		return err
	}
	s1, err := statements(ws)
	if err != nil {
		return err
	}
	res.burnStmts = float64(s1-s0) / float64(r.cfg.jobs)
	res.burnRate = float64(r.cfg.jobs) / d.Seconds()
	res.burnCPU = float64(pgcpu.Between(c0, c1).Microseconds()) / float64(r.cfg.jobs)
	return nil
}

func (r *run) fixedLoad(ctx context.Context, res *result) error {
	var from, to time.Time
	if err := r.mon.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&from); err != nil {
		return err
	}
	c0, err := r.cpu(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	sent, ticks := 0, 0
	for time.Since(t0) < r.cfg.load {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if due := int(time.Since(t0).Seconds()*float64(r.cfg.rate)) - sent; due > 0 {
			if err := r.insert(ctx, loadType, due); err != nil {
				return err
			}
			sent += due
		}
		if ticks++; ticks%10 == 0 {
			n, err := r.conns(ctx)
			if err != nil {
				return err
			}
			res.loadConns = max(res.loadConns, n)
		}
	}
	if err := r.mon.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&to); err != nil {
		return err
	}
	c1, err := r.cpu(ctx)
	if err != nil {
		return err
	}
	jobs, hist := pgx.Identifier{r.schema, "jobs"}.Sanitize(), pgx.Identifier{r.schema, "job_history"}.Sanitize()
	var done int64
	if err := r.mon.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+hist+` WHERE type = $1 AND state = 'completed' AND finished_at BETWEEN $2 AND $3)
		+ (SELECT count(*) FROM `+jobs+` WHERE type = $1 AND state = 'completed' AND finished_at BETWEEN $2 AND $3)`,
		loadType, from, to).Scan(&done); err != nil {
		return err
	}
	if done == 0 {
		return errors.New("no job completed")
	}
	res.loadRate = float64(done) / to.Sub(from).Seconds()
	res.loadCPU = float64(pgcpu.Between(c0, c1).Microseconds()) / float64(done)
	return r.mon.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY w), percentile_cont(0.99) WITHIN GROUP (ORDER BY w)
		FROM (SELECT extract(epoch FROM started_at - run_at) * 1000 AS w FROM `+hist+` WHERE type = $1 AND finished_at BETWEEN $2 AND $3) x`,
		loadType, from, to).Scan(&res.waitP50, &res.waitP99)
}
