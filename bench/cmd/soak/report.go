package main

import (
	"encoding/csv"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/backlogq/backlog"
)

// backlog's defaults, as its package doc ("Limits and defaults") states
// them: the soak's Work call sets none, and the report names them.
const (
	backlogConcurrency = 100
	backlogPrefetch    = 1000
	backlogLease       = 30 * time.Second
)

func describeVacuum(info *runInfo, cfg *config) string {
	av := info.av
	switch info.vacuumMode {
	case "emulate":
		nap := av.naptime
		if cfg.naptime > 0 {
			nap = cfg.naptime
		}
		return fmt.Sprintf("EMULATED autovacuum (the soak's own VACUUM). The server runs with autovacuum = %s, "+
			"which no session, ALTER DATABASE … SET or table storage parameter (autovacuum_enabled) can override: with it off the launcher does not run at all. "+
			"So every %s (autovacuum_naptime: %s) the soak reads pg_stat_user_tables for the phase's tables and, one table after the other on one connection, runs "+
			"VACUUM when n_dead_tup > %g + %g × reltuples or n_ins_since_vacuum > %g + %g × reltuples, ANALYZE when n_mod_since_analyze > %g + %g × reltuples "+
			"(the server's autovacuum_* thresholds and scale factors, PostgreSQL 15's rule), both together as VACUUM (ANALYZE) when both are due; "+
			"with SKIP_LOCKED and throttled like autovacuum (vacuum_cost_delay %gms, vacuum_cost_limit %d). "+
			"Unlike autovacuum, it is a client backend: its pg_stat_activity row has a backend_xmin while it works, so the queue's oldest-transaction check can see it (application backlog-soak-vacuum), and it counts in vacuum_count, not autovacuum_count.",
			av.raw["autovacuum"], fmtDur(nap), fmtDur(av.naptime), av.vacThresh, av.vacScale, av.insThresh, av.insScale, av.anlThresh, av.anlScale, av.costDelay, av.costLimit)
	case "server":
		return fmt.Sprintf("the server's REAL autovacuum, turned on for this run with ALTER SYSTEM SET autovacuum = on and pg_reload_conf() (it was %s; the launcher was seen running before the first phase). "+
			"Its settings: naptime %s, vacuum at %g + %g × reltuples dead rows (or %g + %g × reltuples inserts), analyze at %g + %g × reltuples changes, cost delay %gms, limit %d. "+
			"autovacuum is server-wide: it also visited other databases of the server meanwhile. The previous setting: %s.",
			info.serverAV.prev, fmtDur(av.naptime), av.vacThresh, av.vacScale, av.insThresh, av.insScale, av.anlThresh, av.anlScale, av.costDelay, av.costLimit, restoredText(info.serverAV))
	case "server-already-on":
		return fmt.Sprintf("the server's own autovacuum (autovacuum = on already; naptime %s), untouched.", fmtDur(av.naptime))
	default:
		return "NONE: -autovacuum none, and the server's autovacuum is " + av.raw["autovacuum"] + ": nothing vacuumed the tables (a control run)."
	}
}

func restoredText(s *serverAV) string {
	if s == nil || s.restored == "" {
		return "restored at the end of the run (deferred, also on SIGINT/SIGTERM)"
	}
	return s.restored
}

func render(cfg *config, info *runInfo, results []*phaseResult) string {
	var b strings.Builder
	mode := "full"
	if cfg.quick {
		mode = "quick"
	}
	fmt.Fprintf(&b, "# backlog soak test (%s)\n\n", mode)
	fmt.Fprintf(&b, "- Run at %s; Go %s, %d CPUs; load average at start %s, at the end %s\n", info.started.UTC().Format(time.RFC3339), info.goVer, info.cpus, info.loadStart, info.loadEnd)
	fmt.Fprintf(&b, "- Server: %s\n", info.version)
	var s []string
	for _, kv := range info.settings {
		s = append(s, kv[0]+"="+kv[1])
	}
	fmt.Fprintf(&b, "- Settings (at the start): %s\n", strings.Join(s, ", "))
	if info.ownDB {
		fmt.Fprintf(&b, "- Database: %q, created for this run and dropped after it (the oldest-transaction reading is per database, so other databases' sessions stay out of it)\n", info.dbName)
	} else {
		fmt.Fprintf(&b, "- Database: %q (shared: its other sessions can be the oldest transaction)\n", info.dbName)
	}
	fmt.Fprintf(&b, "- backlog: %s\n", info.backlog)
	fmt.Fprintf(&b, "- Workload: %s jobs/s enqueued by %d producer goroutines sharing one schedule (EnqueueMany of %d every %s; a batch that goes out late is sent at once, so the rate holds while they can catch up); "+
		"`Work(ctx, h)` with every option at its default (concurrency %d, prefetch %d, lease %s) and a no-op handler; one Queue and one pgxpool (MaxConns %d) for producers and workers; a fresh schema per phase; %s per phase.\n",
		fmtInt(cfg.rate), cfg.producers, cfg.batch, cfg.interval(), backlogConcurrency, backlogPrefetch, backlogLease, cfg.pool, cfg.duration)
	fmt.Fprintf(&b, "- Vacuum: %s\n", info.vacuumText)
	fmt.Fprintf(&b, "- Sampled every %s: completed jobs (the Finished hook, outcome completed: the handler returned and the outcome is on its way to the database), enqueued jobs (EnqueueMany returned), "+
		"queue depth (`count(*)` of available rows in jobs), sizes (pg_relation_size of jobs and of each index, pg_total_relation_size), n_dead_tup and vacuum counts of jobs (pg_stat_user_tables), "+
		"claim latency (the Finished hook's QueueLatency: run_at → claim on the database clock), enqueue→start latency (the producer's clock before EnqueueMany → the Started hook), "+
		"the oldest transaction (the queue's own `Stats().OldestTransaction`; the time each Stats call took is recorded), "+
		"and the queue's log (a slog handler counting warnings; the old-transaction warning is %q…).\n", cfg.every, oldTxMessage)
	for _, n := range info.notes {
		fmt.Fprintf(&b, "- Note: %s\n", n)
	}
	if info.interruptedPhase != "" {
		fmt.Fprintf(&b, "- **Interrupted** during phase %s: its numbers stop there and its checks have no verdict.\n", info.interruptedPhase)
	}
	for _, r := range results {
		b.WriteString("\n")
		renderPhase(&b, cfg, r)
	}
	return b.String()
}

func renderPhase(b *strings.Builder, cfg *config, r *phaseResult) {
	title := fmt.Sprintf("(a) plain soak, %s at %s jobs/s", cfg.duration, fmtInt(cfg.rate))
	if r.hold {
		title = fmt.Sprintf("(b) soak with a REPEATABLE READ transaction held from %s to %s", fmtOffset(cfg.holdAt), fmtOffset(cfg.holdAt+cfg.holdFor))
	}
	fmt.Fprintf(b, "## Phase %s\n\n", title)
	w, d := cfg.window, cfg.duration

	// Throughput.
	fc := checkFlat(r.samples, w, d)
	if fc.ok {
		first, last := window(r.samples, 0, w), window(r.samples, d-w, d)
		fmt.Fprintf(b, "- **Throughput flat: %s.** Completed %s jobs/s in the first %s, %s jobs/s in the last %s (%s–%s): last ÷ first = %.3f (limit ±%.0f %%). Enqueued: %s and %s jobs/s. "+
			"At a fixed arrival rate the completed rate equals it while the queue keeps up, so the margins show in the depth and latency: queue depth at most %s and %s, worst %s claim p99 %s ms and %s ms.\n",
			passFail(fc.pass), fmtInt(fc.first), fmtDur(w), fmtInt(fc.last), fmtDur(w), fmtOffset(d-w), fmtOffset(d), fc.ratio, flatTolerance*100, fmtInt(fc.firstEnq), fmtInt(fc.lastEnq),
			fmtInt(float64(maxOf(first, func(s sample) int64 { return s.db.available }))), fmtInt(float64(maxOf(last, func(s sample) int64 { return s.db.available }))),
			fmtDur(cfg.every), fmtMS(maxDur(first, func(s sample) time.Duration { return s.claim.p99 })), fmtMS(maxDur(last, func(s sample) time.Duration { return s.claim.p99 })))
		fmt.Fprintf(b, "- The machine in the two windows: CPUs %s and %s busy (everyone's use); statements of other databases running at %d and %d of their samples. A busy machine moves these numbers as much as the queue does.\n",
			cpuText(first), cpuText(last), countOf(first, func(s sample) bool { return s.db.otherActive > 0 }), countOf(last, func(s sample) bool { return s.db.otherActive > 0 }))
	} else if fc.first == 0 {
		fmt.Fprintf(b, "- Throughput flat: no verdict (no job completed in the first %s).\n", fmtDur(w))
	} else {
		fmt.Fprintf(b, "- Throughput flat: no verdict (the phase did not run to its end).\n")
	}
	all, _ := perSecond(r.samples, completedOf)
	fmt.Fprintf(b, "- Totals: %s jobs enqueued, %s completed (%s/s over the phase), %s failed enqueue calls' jobs%s, other outcomes %s; after the producers stopped, the rest ran in %s (%d left when the wait ended).\n",
		fmtInt(float64(r.enqueued)), fmtInt(float64(r.completed)), fmtInt(all), fmtInt(float64(r.enqErrs)), firstErrText(r.firstEnqErr), outcomesText(r.outcomes), fmtDur(r.drainTook.Round(100*time.Millisecond)), r.leftover)
	if r.final.err != nil {
		fmt.Fprintf(b, "- The soak queue's Stats at the end failed: %v\n", r.final.err)
	} else if r.final.dur > 0 {
		fmt.Fprintf(b, "- The queue's Stats at the end: %s completed jobs (its counters of finished jobs; the hook counted %s).\n",
			fmtInt(float64(r.final.completed)), fmtInt(float64(r.completed)))
	}
	if r.workErr != nil {
		fmt.Fprintf(b, "- Work returned an error: %v\n", r.workErr)
	}

	// Sizes.
	rows := checkSizes(r, w)
	allBounded, anyChecked := true, false
	for _, row := range rows {
		if row.checked {
			anyChecked = true
			allBounded = allBounded && row.bounded
		}
	}
	if anyChecked {
		fmt.Fprintf(b, "- **Sizes bounded: %s** (each size of jobs at the end ≤ %.0f× its size at %s):\n\n", passFail(allBounded), sizeGrowthMax, fmtOffset(w))
	} else {
		fmt.Fprintf(b, "- Sizes bounded: no verdict (the phase did not get past %s):\n\n", fmtOffset(w))
	}
	fmt.Fprintf(b, "| relation | at %s | at %s | at the end | max | end ÷ at %s | end ÷ at %s |\n|---|---:|---:|---:|---:|---:|---:|\n", fmtOffset(w), fmtOffset(d-w), fmtOffset(w), fmtOffset(d-w))
	ratio := func(a, b int64) string {
		if b <= 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", float64(a)/float64(b))
	}
	for _, row := range rows {
		mark := ""
		if row.checked && !row.bounded {
			mark = " (over)"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s%s | %s |\n", row.name, fmtMB(row.atW), fmtMB(row.atLastW), fmtMB(row.end), fmtMB(row.max), ratio(row.end, row.atW), mark, ratio(row.end, row.atLastW))
	}
	fmt.Fprintf(b, "\nThe last column is the growth over the last %s: above 1 the relation was still growing at the end.\n\n", fmtDur(w))
	if len(r.samples) > 0 && r.completed > 0 {
		last := r.samples[len(r.samples)-1]
		fmt.Fprintf(b, "- job_history grows by about %.0f bytes per completed job (its size at the end ÷ the jobs completed by then).\n", float64(last.db.history)/float64(r.completed))
	}

	renderVacuums(b, r)
	renderOldTx(b, cfg, r)
	if r.hold {
		renderHold(b, cfg, r)
	}
	renderOtherLogs(b, r)

	// Per-minute table.
	fmt.Fprintf(b, "\n### Per minute\n\n")
	renderMinutes(b, cfg, r)
}

func renderVacuums(b *strings.Builder, r *phaseResult) {
	if len(r.samples) == 0 {
		return
	}
	last := r.samples[len(r.samples)-1].db
	fmt.Fprintf(b, "- Vacuums of jobs (pg_stat_user_tables): %d VACUUM, %d autovacuum, %d ANALYZE, %d autoanalyze; n_dead_tup at most %s.\n",
		last.vacuums-r.base.vacuums, last.autovacuums-r.base.autovacuums, last.analyzes-r.base.analyzes, last.autoanlz-r.base.autoanlz, fmtInt(float64(maxOf(r.samples, func(s sample) int64 { return s.db.dead }))))
	if len(r.vacRuns) > 0 {
		type agg struct {
			n, errs  int
			total, l time.Duration
		}
		by := map[string]*agg{}
		var names []string
		for _, v := range r.vacRuns {
			k := v.table + ": " + v.what
			a := by[k]
			if a == nil {
				a = &agg{}
				by[k] = a
				names = append(names, k)
			}
			a.n++
			a.total += v.dur
			a.l = max(a.l, v.dur)
			if v.err != nil {
				a.errs++
			}
		}
		sort.Strings(names)
		var parts []string
		for _, k := range names {
			a := by[k]
			p := fmt.Sprintf("%s ×%d (%s in all, longest %s", k, a.n, fmtDur(a.total.Round(time.Millisecond)), fmtDur(a.l.Round(time.Millisecond)))
			if a.errs > 0 {
				p += fmt.Sprintf(", %d failed", a.errs)
			}
			parts = append(parts, p+")")
		}
		fmt.Fprintf(b, "- The emulation ran: %s.\n", strings.Join(parts, "; "))
	}
	for _, e := range r.vacErrs {
		fmt.Fprintf(b, "- The emulation failed: %s\n", e)
	}
}

func renderOldTx(b *strings.Builder, cfg *config, r *phaseResult) {
	var oldTx []logEntry
	for _, e := range r.logs {
		if strings.HasPrefix(e.msg, oldTxMessage) {
			oldTx = append(oldTx, e)
		}
	}
	var maxAge time.Duration
	var who string
	for _, s := range r.samples {
		if s.oldest != nil && s.oldest.Age > maxAge {
			maxAge, who = s.oldest.Age, fmt.Sprintf("pid %d, application %q, %s", s.oldest.PID, s.oldest.Application, s.oldest.State)
		}
	}
	if maxAge > 0 {
		fmt.Fprintf(b, "- Oldest transaction in the samples (Stats().OldestTransaction): %s (%s).\n", fmtDur(maxAge.Round(time.Second)), who)
	} else {
		fmt.Fprintf(b, "- Stats().OldestTransaction: no open transaction at any sample.\n")
	}
	var vacN int
	var vacAge time.Duration
	for _, s := range r.samples {
		if s.oldest != nil && s.oldest.Application == "backlog-soak-vacuum" {
			vacN++
			vacAge = max(vacAge, s.oldest.Age)
		}
	}
	if vacN > 0 {
		fmt.Fprintf(b, "- Stats().OldestTransaction named the emulation's VACUUM session at %d of %d samples (up to %s old). A lazy VACUUM's xmin does not hold back what other sessions may clean up (PostgreSQL skips backends flagged PROC_IN_VACUUM), but the queue's check (pg_stat_activity.backend_xmin, leaving out autovacuum workers only) counts it: a manual VACUUM running longer than %s would be warned about as an old transaction.\n",
			vacN, len(r.samples), fmtDur(vacAge.Round(time.Second)), fmtDur(backlog.OldTransactionWarning))
	}
	var idleN int
	var idleAge time.Duration
	var idleWho string
	for _, s := range r.samples {
		if s.oldest != nil && s.oldest.Kind == "session" && s.oldest.State == "idle" {
			idleN++
			if s.oldest.Age > idleAge {
				idleAge, idleWho = s.oldest.Age, fmt.Sprintf("pid %d, application %q, at %s", s.oldest.PID, s.oldest.Application, fmtOffset(s.mark))
			}
		}
	}
	if idleN > 0 {
		fmt.Fprintf(b, "- Stats().OldestTransaction named a session in state \"idle\" (in no transaction block) at %d of %d samples, up to %s old (%s). Such a row is transient: an idle LISTEN session that reads incoming notifications takes a snapshot (backend_xmin) while pg_stat_activity.xact_start still shows the start of its last statement, so the age is the time since that statement (seen outside the soak too, with a LISTEN session under a NOTIFY loop); the queue's check does not leave out idle sessions.\n",
			idleN, len(r.samples), fmtDur(idleAge.Round(time.Second)), idleWho)
	}
	if len(r.samples) > 0 {
		durs := make([]time.Duration, 0, len(r.samples))
		errs := 0
		for _, s := range r.samples {
			durs = append(durs, s.statsDur)
			if s.statsErr != "" {
				errs++
			}
		}
		st := summarize(durs)
		fmt.Fprintf(b, "- Stats calls (one a sample): median %s ms, at most %s ms", fmtMS(st.p50), fmtMS(st.max))
		if errs > 0 {
			fmt.Fprintf(b, "; %d failed (the CSV has the errors)", errs)
		}
		b.WriteString(".\n")
	}
	var longest sample
	for _, s := range r.samples {
		if s.db.longest > longest.db.longest {
			longest = s
		}
	}
	if longest.db.longest > 0 {
		fmt.Fprintf(b, "- Longest-running statement of the soak queue's pool seen at a sample: %s ms at %s (%q…).\n", fmtMS(longest.db.longest), fmtOffset(longest.mark), longest.db.longestQuery)
	}
	if len(oldTx) == 0 {
		fmt.Fprintf(b, "- Old-transaction warnings logged by the queue: none.\n")
		return
	}
	fmt.Fprintf(b, "- Old-transaction warnings logged by the queue: %d:", len(oldTx))
	for i, e := range oldTx {
		if i == 8 {
			fmt.Fprintf(b, " … (%d more)", len(oldTx)-i)
			break
		}
		fmt.Fprintf(b, " at %s (%s);", fmtOffset(e.at.Sub(r.started)), e.describe())
	}
	b.WriteString("\n")
}

func renderHold(b *strings.Builder, cfg *config, r *phaseResult) {
	hi := r.holdInfo
	fmt.Fprintf(b, "\n### The held transaction\n\n")
	if hi.pid == 0 {
		fmt.Fprintf(b, "- It never began (%v).\n", hi.err)
		return
	}
	ended := "it was still open when the phase stopped"
	if hi.ended > 0 {
		ended = "committed at " + fmtOffset(hi.ended)
	}
	fmt.Fprintf(b, "- `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM jobs` (saw %d rows) in session pid %d, application backlog-soak-hold: snapshot taken at %s, %s.\n",
		hi.rows, hi.pid, fmtOffset(hi.began), ended)
	if hi.err != nil {
		fmt.Fprintf(b, "- Its error: %v\n", hi.err)
	}
	h := analyzeHold(r.samples, cfg.holdAt, cfg.holdFor, cfg.window, cfg.duration, cfg.rate)
	if !h.ok {
		fmt.Fprintf(b, "- No throughput before the hold to compare with.\n")
		return
	}
	fmt.Fprintf(b, "- **Throughput**: %s jobs/s before (%s–%s), %s jobs/s during the hold (%+.1f %%), %s jobs/s after it (%s–%s).\n",
		fmtInt(h.pre), fmtOffset(h.preFrom), fmtOffset(h.at), fmtInt(h.during), (h.during/h.pre-1)*100, fmtInt(h.after), fmtOffset(h.end), fmtOffset(cfg.duration))
	fmt.Fprintf(b, "- Slowest %s window from the hold's start on: %s jobs/s (%.0f %% of before), ending at %s.\n",
		fmtDur(cfg.every), fmtInt(h.minRate), h.minRate/h.pre*100, fmtOffset(h.minMark))
	switch {
	case !h.fell:
		fmt.Fprintf(b, "- **Recovery**: throughput never fell below 90 %% of the pre-hold level in any %s window, so there was nothing to recover.\n", fmtDur(cfg.every))
	case h.floorBack < 0:
		fmt.Fprintf(b, "- **Recovery**: throughput was NOT back at ≥ 90 %% of the pre-hold level (%d windows in a row) by the end of the phase.\n", recoveryRun)
	default:
		fmt.Fprintf(b, "- **Recovery**: back at ≥ 90 %% of the pre-hold level %s after the transaction ended (the end of the first of %d %s windows in a row at that level).\n",
			fmtDur(h.floorBack), recoveryRun, fmtDur(cfg.every))
	}
	if h.fell {
		if h.bandBack >= 0 {
			fmt.Fprintf(b, "- Within ±10 %% of the pre-hold level again (the catch-up over) %s after it ended.\n", fmtDur(h.bandBack))
		} else {
			fmt.Fprintf(b, "- Not within ±10 %% of the pre-hold level for %d windows in a row by the end of the phase.\n", recoveryRun)
		}
	}
	depth := "never, by the end of the phase"
	if h.depthBack >= 0 {
		depth = fmtDur(h.depthBack) + " after it ended"
	}
	fmt.Fprintf(b, "- Queue depth (available): at most %s before, at most %s from the hold's start on; back to ≤ %s (the most before plus one second of arrivals) %s.\n",
		fmtInt(float64(h.preDepthMax)), fmtInt(float64(h.depthMax)), fmtInt(float64(h.depthLimit)), depth)
	fmt.Fprintf(b, "- Claim latency: worst %s p99 %s ms before, %s ms from the hold's start on.\n", fmtDur(cfg.every), fmtMS(h.preClaimP99), fmtMS(h.claimP99))
	fmt.Fprintf(b, "- jobs table: %s before, %s when the transaction ended, at most %s, %s at the end; its indexes: %s, %s, at most %s, %s at the end; n_dead_tup at most %s before, %s from the hold's start on.\n",
		fmtMB(h.preHeap), fmtMB(h.holdEndHeap), fmtMB(h.maxHeap), fmtMB(h.endHeap), fmtMB(h.preIdx), fmtMB(h.holdEndIdx), fmtMB(h.maxIdx), fmtMB(h.endIdx), fmtInt(float64(h.preDead)), fmtInt(float64(h.maxDead)))

	// When the queue noticed.
	var firstWarn *logEntry
	for i, e := range r.logs {
		if strings.HasPrefix(e.msg, oldTxMessage) && e.attrs["pid"] == strconv.Itoa(hi.pid) {
			firstWarn = &r.logs[i]
			break
		}
	}
	if firstWarn != nil {
		at := firstWarn.at.Sub(r.started)
		fmt.Fprintf(b, "- **Warning logged** first at %s, %s after the transaction began (%s).\n", fmtOffset(at), fmtDur((at - hi.began).Round(time.Second)), firstWarn.describe())
	} else {
		fmt.Fprintf(b, "- **Warning logged**: never for the held transaction (pid %d).\n", hi.pid)
	}
	var seen, old *sample
	for i, s := range r.samples {
		if s.oldest != nil && s.oldest.PID == hi.pid {
			if seen == nil {
				seen = &r.samples[i]
			}
			if old == nil && s.oldest.Age >= backlog.OldTransactionWarning {
				old = &r.samples[i]
			}
		}
	}
	if seen != nil {
		fmt.Fprintf(b, "- **Stats().OldestTransaction** named it first at the %s sample (age %s, state %q)", fmtOffset(seen.mark), fmtDur(seen.oldest.Age.Round(time.Second)), seen.oldest.State)
		if old != nil {
			fmt.Fprintf(b, "; older than OldTransactionWarning (%s) from the %s sample (age %s)", fmtDur(backlog.OldTransactionWarning), fmtOffset(old.mark), fmtDur(old.oldest.Age.Round(time.Second)))
		}
		b.WriteString(".\n")
	} else {
		fmt.Fprintf(b, "- **Stats().OldestTransaction** never named it.\n")
	}
}

func renderOtherLogs(b *strings.Builder, r *phaseResult) {
	var other []logEntry
	for _, e := range r.logs {
		if !strings.HasPrefix(e.msg, oldTxMessage) {
			other = append(other, e)
		}
	}
	if len(other) > 0 {
		fmt.Fprintf(b, "- Other warnings and errors the queue logged: %d; the first:", len(other))
		for i, e := range other {
			if i == 5 {
				break
			}
			fmt.Fprintf(b, " %s at %s %q %v;", levelName(e.level), fmtOffset(e.at.Sub(r.started)), e.msg, e.attrs)
		}
		b.WriteString("\n")
	}
	if len(r.infos) > 0 {
		var parts []string
		for m, n := range r.infos {
			parts = append(parts, fmt.Sprintf("%q ×%d", m, n))
		}
		sort.Strings(parts)
		fmt.Fprintf(b, "- Info lines the queue logged: %s.\n", strings.Join(parts, ", "))
	}
}

func renderMinutes(b *strings.Builder, cfg *config, r *phaseResult) {
	b.WriteString("| minute | completed/s | enqueued/s | depth (max) | claim p50 / p99 ms | enqueue→start p99 ms | jobs table MB | jobs indexes MB | n_dead_tup (max) | vacuums | oldest xact (max) | old-xact warnings | machine CPU busy | other DBs' statements (max) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	lat := map[int]minuteLat{}
	for _, m := range r.minutes {
		lat[m.minute] = m
	}
	prevVac := r.base.vacuums + r.base.autovacuums
	prevWarn := 0
	n := (len(r.samples) + int(time.Minute/cfg.every) - 1) / int(time.Minute/cfg.every)
	for m := 1; m <= n; m++ {
		ss := window(r.samples, time.Duration(m-1)*time.Minute, time.Duration(m)*time.Minute)
		if len(ss) == 0 {
			continue
		}
		last := ss[len(ss)-1]
		done, _ := perSecond(ss, completedOf)
		enq, _ := perSecond(ss, enqueuedOf)
		vac := last.db.vacuums + last.db.autovacuums
		var oldest time.Duration
		oldestApp := ""
		var other int
		for _, s := range ss {
			if s.oldest != nil && s.oldest.Age >= oldest {
				oldest, oldestApp = s.oldest.Age, s.oldest.Application
			}
			other = max(other, s.db.otherActive)
		}
		oldestText := "–"
		if oldestApp != "" || oldest > 0 {
			oldestText = fmt.Sprintf("%s %s", fmtDur(oldest.Round(time.Second)), shortApp(oldestApp))
		}
		label := fmt.Sprintf("%02d–%02d", m-1, m)
		if r.hold && time.Duration(m)*time.Minute > cfg.holdAt && time.Duration(m-1)*time.Minute < cfg.holdAt+cfg.holdFor {
			label += " (hold)"
		}
		l := lat[m]
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s / %s | %s | %.1f | %.1f | %s | %d | %s | %d | %s | %d |\n",
			label, fmtInt(done), fmtInt(enq), fmtInt(float64(maxOf(ss, func(s sample) int64 { return s.db.available }))),
			fmtMS(l.claim.p50), fmtMS(l.claim.p99), fmtMS(l.start.p99),
			float64(last.db.heap)/1e6, float64(last.db.indexTotal())/1e6, fmtInt(float64(maxOf(ss, func(s sample) int64 { return s.db.dead }))),
			vac-prevVac, oldestText, last.oldTxWarns-prevWarn, cpuText(ss), other)
		prevVac, prevWarn = vac, last.oldTxWarns
	}
	b.WriteString("\nSizes are at the minute's last sample; vacuums = VACUUMs of jobs that finished in the minute (vacuum_count + autovacuum_count); oldest xact = the oldest Stats().OldestTransaction age in the minute's samples and its session's application; machine CPU busy = all CPUs of the machine (/proc/stat), whoever used them; other DBs' statements = statements running in other databases of the server at a sample (shared machine).\n")
}

// samplesCSV is every sample of a phase, one line each.
func samplesCSV(r *phaseResult) string {
	var b strings.Builder
	w := csv.NewWriter(&b)
	head := strings.Split("mark_s,span_s,completed,enqueued,other_outcomes,enqueue_errors,producer_lag_ms,claim_p50_ms,claim_p99_ms,claim_max_ms,start_p50_ms,start_p99_ms,available,running,jobs_table_bytes,jobs_indexes_bytes,jobs_total_bytes,history_bytes,n_dead_tup,n_live_tup,vacuum_count,autovacuum_count,analyze_count,autoanalyze_count,oldest_pid,oldest_age_s,oldest_state,oldest_application,old_tx_warnings,other_warnings,load1,cpu_busy,other_db_active,longest_stmt_ms,longest_stmt,monitor_ms,stats_ms,errors", ",")
	for _, n := range r.indexNames {
		head = append(head, n+"_bytes")
	}
	_ = w.Write(head)
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, s := range r.samples {
		pid, age, state, app := 0, 0.0, "", ""
		if s.oldest != nil {
			pid, age, state, app = s.oldest.PID, s.oldest.Age.Seconds(), s.oldest.State, s.oldest.Application
		}
		rec := []string{
			fmt.Sprintf("%.0f", s.mark.Seconds()), fmt.Sprintf("%.3f", s.span.Seconds()), i64(s.completed), i64(s.enqueued), i64(s.other), i64(s.enqErrs),
			fmtMS(s.lag), fmtMS(s.claim.p50), fmtMS(s.claim.p99), fmtMS(s.claim.max), fmtMS(s.start.p50), fmtMS(s.start.p99),
			i64(s.db.available), i64(s.db.running), i64(s.db.heap), i64(s.db.indexTotal()), i64(s.db.total), i64(s.db.history),
			i64(s.db.dead), i64(s.db.live), i64(s.db.vacuums), i64(s.db.autovacuums), i64(s.db.analyzes), i64(s.db.autoanlz),
			strconv.Itoa(pid), fmt.Sprintf("%.1f", age), state, app, strconv.Itoa(s.oldTxWarns), strconv.Itoa(s.otherWarns),
			fmt.Sprintf("%.2f", s.load1), fmt.Sprintf("%.3f", s.cpuBusy), strconv.Itoa(s.db.otherActive),
			fmtMS(s.db.longest), s.db.longestQuery, fmtMS(s.db.dur), fmtMS(s.statsDur), strings.TrimSpace(s.db.err + " " + s.statsErr),
		}
		for i := range r.indexNames {
			v := int64(0)
			if i < len(s.db.idx) {
				v = s.db.idx[i]
			}
			rec = append(rec, i64(v))
		}
		_ = w.Write(rec)
	}
	w.Flush()
	return b.String()
}

// cpuText is the mean busy share of the machine's CPUs over samples.
func cpuText(ss []sample) string {
	var sum float64
	n := 0
	for _, s := range ss {
		if s.cpuBusy >= 0 {
			sum += s.cpuBusy
			n++
		}
	}
	if n == 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f %%", sum/float64(n)*100)
}

func countOf(ss []sample, f func(sample) bool) int {
	n := 0
	for _, s := range ss {
		if f(s) {
			n++
		}
	}
	return n
}

func maxDur(ss []sample, f func(sample) time.Duration) time.Duration {
	var m time.Duration
	for _, s := range ss {
		m = max(m, f(s))
	}
	return m
}

func maxOf(ss []sample, f func(sample) int64) int64 {
	var m int64
	for _, s := range ss {
		m = max(m, f(s))
	}
	return m
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func firstErrText(e string) string {
	if e == "" {
		return ""
	}
	return fmt.Sprintf(" (first: %s)", e)
}

func outcomesText(m map[backlog.Outcome]int64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func levelName(l slog.Level) string { return l.String() }

func shortApp(a string) string {
	switch a {
	case "":
		return ""
	case "backlog-soak-hold":
		return "(hold)"
	}
	return "(" + strings.TrimPrefix(a, "backlog-soak-") + ")"
}

func oldestText(o *backlog.OldTransaction) string {
	if o == nil {
		return "none"
	}
	return fmt.Sprintf("%s (%s)", fmtDur(o.Age.Round(time.Second)), o.Application)
}

// fmtInt prints a number rounded to an integer with thousands separators.
func fmtInt(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	n := int64(math.Round(v))
	neg := n < 0
	if neg {
		n = -n
	}
	s := strconv.FormatInt(n, 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func fmtMB(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

func fmtMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms >= 100 {
		return strconv.FormatFloat(ms, 'f', 0, 64)
	}
	return strconv.FormatFloat(ms, 'f', 1, 64)
}

// fmtOffset prints a time since a phase began as m:ss.
func fmtOffset(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d/time.Minute), int(d%time.Minute/time.Second))
}

func fmtDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
