package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// How dead job rows get vacuumed during the soak.
//
// autovacuum is a server-wide setting (PGC_SIGHUP): neither a session, nor
// ALTER DATABASE … SET, nor a table's autovacuum_enabled storage parameter
// can turn it on; with autovacuum = off the launcher does not run at all
// (except to prevent transaction ID wraparound). So the soak either uses the
// server's autovacuum when it is on, turns it on with ALTER SYSTEM for the
// run (-autovacuum server, superuser; restored at the end), or runs VACUUM
// itself by autovacuum's rules (emulate).

// avSettings are the server's autovacuum settings that the emulation
// follows, in pg_settings' base units.
type avSettings struct {
	naptime                     time.Duration
	vacThresh, vacScale         float64
	insThresh, insScale         float64
	anlThresh, anlScale         float64
	costDelay                   float64 // ms
	costLimit                   int
	raw                         map[string]string
	autovacuumOn, trackCountsOn bool
}

var avNames = []string{"autovacuum", "track_counts", "autovacuum_naptime",
	"autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
	"autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
	"autovacuum_analyze_threshold", "autovacuum_analyze_scale_factor",
	"autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit", "vacuum_cost_limit"}

func readAVSettings(ctx context.Context, conn *pgx.Conn) (*avSettings, error) {
	rows, err := conn.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name = ANY($1)`, avNames)
	if err != nil {
		return nil, err
	}
	kv, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var p [2]string
		err := r.Scan(&p[0], &p[1])
		return p, err
	})
	if err != nil {
		return nil, err
	}
	s := &avSettings{raw: map[string]string{}}
	for _, p := range kv {
		s.raw[p[0]] = p[1]
	}
	num := func(n string) float64 {
		f, err := strconv.ParseFloat(s.raw[n], 64)
		if err != nil {
			return 0
		}
		return f
	}
	s.autovacuumOn, s.trackCountsOn = s.raw["autovacuum"] == "on", s.raw["track_counts"] == "on"
	s.naptime = time.Duration(num("autovacuum_naptime")) * time.Second
	s.vacThresh, s.vacScale = num("autovacuum_vacuum_threshold"), num("autovacuum_vacuum_scale_factor")
	s.insThresh, s.insScale = num("autovacuum_vacuum_insert_threshold"), num("autovacuum_vacuum_insert_scale_factor")
	s.anlThresh, s.anlScale = num("autovacuum_analyze_threshold"), num("autovacuum_analyze_scale_factor")
	s.costDelay = num("autovacuum_vacuum_cost_delay")
	s.costLimit = int(num("autovacuum_vacuum_cost_limit"))
	if s.costLimit <= 0 {
		s.costLimit = int(num("vacuum_cost_limit"))
	}
	return s, nil
}

// vacuumRun is one VACUUM or ANALYZE the emulation ran.
type vacuumRun struct {
	at    time.Time
	table string
	what  string // VACUUM, VACUUM (ANALYZE), ANALYZE
	why   string
	dur   time.Duration
	err   error
}

// vacuumer is the emulation: every naptime it reads pg_stat_user_tables
// for the phase's schema and runs, on one connection and one table after
// the other, the VACUUM and ANALYZE that autovacuum's rules (PostgreSQL 15,
// relation_needs_vacanalyze) call for, throttled like autovacuum (its cost
// delay and limit) and with SKIP_LOCKED, as autovacuum skips a table it
// cannot lock.
type vacuumer struct {
	env    *env
	schema string
	s      *avSettings
	nap    time.Duration

	mu   sync.Mutex
	runs []vacuumRun
	errs []string
}

func (v *vacuumer) run(ctx context.Context) {
	conn, err := v.env.connect(ctx, "backlog-soak-vacuum")
	if err != nil {
		v.fail(fmt.Sprintf("vacuum connection: %v", err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET vacuum_cost_delay = '%gms'; SET vacuum_cost_limit = %d", v.s.costDelay, v.s.costLimit)); err != nil {
		v.fail(fmt.Sprintf("setting the cost delay: %v", err))
		return
	}
	next := time.Now().Add(v.nap)
	for {
		if !sleepUntil(ctx, next) {
			return
		}
		start := time.Now()
		v.pass(ctx, conn)
		// autovacuum would start another worker after a naptime if this
		// one were still busy; one worker here: the next check waits.
		next = start.Add(v.nap)
	}
}

func (v *vacuumer) fail(msg string) {
	logf("vacuum emulation: %s", msg)
	v.mu.Lock()
	v.errs = append(v.errs, msg)
	v.mu.Unlock()
}

type vacCandidate struct {
	table                   string
	reltuples               float64
	dead, ins, modsAnalyzed int64
}

func (v *vacuumer) pass(ctx context.Context, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', s.schemaname, s.relname), c.reltuples,
		s.n_dead_tup, s.n_ins_since_vacuum, s.n_mod_since_analyze
		FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
		WHERE s.schemaname = $1 AND c.relkind = 'r' ORDER BY s.relname`, v.schema)
	if err != nil {
		if ctx.Err() == nil {
			v.fail(fmt.Sprintf("reading pg_stat_user_tables: %v", err))
		}
		return
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (vacCandidate, error) {
		var c vacCandidate
		err := r.Scan(&c.table, &c.reltuples, &c.dead, &c.ins, &c.modsAnalyzed)
		return c, err
	})
	if err != nil {
		if ctx.Err() == nil {
			v.fail(fmt.Sprintf("reading pg_stat_user_tables: %v", err))
		}
		return
	}
	for _, c := range cands {
		rt := max(c.reltuples, 0) // never vacuumed: -1, taken as 0
		vacT := v.s.vacThresh + v.s.vacScale*rt
		insT := v.s.insThresh + v.s.insScale*rt
		anlT := v.s.anlThresh + v.s.anlScale*rt
		doVac := float64(c.dead) > vacT || (v.s.insThresh >= 0 && float64(c.ins) > insT)
		doAnl := float64(c.modsAnalyzed) > anlT
		var sql, what string
		switch {
		case doVac && doAnl:
			sql, what = "VACUUM (SKIP_LOCKED, ANALYZE) "+c.table, "VACUUM (ANALYZE)"
		case doVac:
			sql, what = "VACUUM (SKIP_LOCKED) "+c.table, "VACUUM"
		case doAnl:
			sql, what = "ANALYZE (SKIP_LOCKED) "+c.table, "ANALYZE"
		default:
			continue
		}
		why := fmt.Sprintf("dead %d > %.0f: %t, inserted %d > %.0f: %t, changed %d > %.0f: %t (reltuples %.0f)",
			c.dead, vacT, float64(c.dead) > vacT, c.ins, insT, float64(c.ins) > insT, c.modsAnalyzed, anlT, doAnl, rt)
		t0 := time.Now()
		_, err := conn.Exec(ctx, sql)
		if ctx.Err() != nil {
			return
		}
		r := vacuumRun{at: t0, table: c.table, what: what, why: why, dur: time.Since(t0), err: err}
		if err != nil {
			logf("vacuum emulation: %s %s: %v", what, c.table, err)
		}
		v.mu.Lock()
		v.runs = append(v.runs, r)
		v.mu.Unlock()
	}
}

func (v *vacuumer) snapshot() ([]vacuumRun, []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]vacuumRun(nil), v.runs...), append([]string(nil), v.errs...)
}

// serverAV turns the server's autovacuum on with ALTER SYSTEM for the run
// and puts the previous setting back.
type serverAV struct {
	url      string
	prev     string // the value before
	fromAuto bool   // the value before came from postgresql.auto.conf (ALTER SYSTEM)
	once     sync.Once
	restored string // what restore did
}

// enableServerAV turns autovacuum on server-wide. It returns nil and no
// error when it was on already.
func enableServerAV(ctx context.Context, url string) (*serverAV, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s := &serverAV{url: url}
	var src string
	if err := conn.QueryRow(ctx, `SELECT setting, COALESCE(sourcefile, '') FROM pg_settings WHERE name = 'autovacuum'`).Scan(&s.prev, &src); err != nil {
		return nil, err
	}
	if s.prev == "on" {
		return nil, nil
	}
	s.fromAuto = strings.HasSuffix(src, "postgresql.auto.conf")
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET autovacuum = on"); err != nil {
		return nil, fmt.Errorf("ALTER SYSTEM SET autovacuum = on: %w", err)
	}
	logf("autovacuum: ALTER SYSTEM SET autovacuum = on (was %s); it is put back at the end. If this process is killed (SIGKILL) first, restore it by hand: %s; SELECT pg_reload_conf();", s.prev, s.restoreSQL())
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		s.restore(ctx)
		return nil, err
	}
	if err := waitSetting(ctx, url, "on", true); err != nil {
		s.restore(ctx)
		return nil, err
	}
	return s, nil
}

func (s *serverAV) restoreSQL() string {
	if s.fromAuto {
		return fmt.Sprintf("ALTER SYSTEM SET autovacuum = %s", s.prev)
	}
	return "ALTER SYSTEM RESET autovacuum"
}

// restore puts the previous setting back (once; later calls do nothing).
func (s *serverAV) restore(ctx context.Context) {
	if s == nil {
		return
	}
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.url)
		if err == nil {
			defer conn.Close(ctx)
			if _, err = conn.Exec(ctx, s.restoreSQL()); err == nil {
				_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
			}
		}
		if err == nil {
			err = waitSetting(ctx, s.url, s.prev, false)
		}
		if err != nil {
			s.restored = fmt.Sprintf("FAILED to restore autovacuum = %s (%v): run %s; SELECT pg_reload_conf(); by hand", s.prev, err, s.restoreSQL())
		} else {
			s.restored = fmt.Sprintf("restored at the end with %s and pg_reload_conf(); a new session shows autovacuum = %s again", s.restoreSQL(), s.prev)
		}
		logf("autovacuum: %s", s.restored)
	})
}

// waitSetting waits until a new session sees autovacuum = want (and, when
// launcher is set, the autovacuum launcher runs).
func waitSetting(ctx context.Context, url, want string, launcher bool) error {
	deadline := time.Now().Add(20 * time.Second)
	var got string
	var n int
	for time.Now().Before(deadline) {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT current_setting('autovacuum'),
				(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum launcher')`).Scan(&got, &n)
			conn.Close(ctx)
		}
		if err == nil && got == want && (!launcher || n > 0) {
			return nil
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("after 20 s a new session still sees autovacuum = %s (launcher processes: %d)", got, n)
}

// sleepUntil sleeps until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}
