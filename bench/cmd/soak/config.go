package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"
)

// config holds every knob of a soak run; -quick only changes the defaults.
type config struct {
	quick     bool
	rate      float64       // jobs/s, all producers together
	duration  time.Duration // of each phase
	holdAt    time.Duration // when the REPEATABLE READ transaction begins (phase "hold")
	holdFor   time.Duration // how long it stays open
	window    time.Duration // first/last windows compared, and the "early" size mark
	phases    []string      // plain, hold
	producers int
	batch     int
	pool      int32
	every     time.Duration // sampling interval
	vacuum    string        // auto, emulate, server, none
	naptime   time.Duration // emulate: time between checks; 0: the server's autovacuum_naptime
	drain     time.Duration // at the end of a phase: how long to wait for the queue to empty
	out       string
	newDB     bool
}

var phaseNames = []string{"plain", "hold"}

var vacuumModes = []string{"auto", "emulate", "server", "none"}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "a short run for trying it: 5-minute phases, the transaction held from 1m for 2m15s, 1-minute comparison windows")
	rate := fs.Float64("rate", 5000, "jobs enqueued per second, all producers together")
	duration := fs.Duration("duration", 0, "length of each phase (default 30m, or 5m with -quick)")
	hold := fs.String("hold", "", "when and for how long phase \"hold\" keeps a REPEATABLE READ transaction open, as START+LENGTH (default 12m+5m, or 1m+2m15s with -quick)")
	window := fs.Duration("window", 0, "length of the first and last windows whose throughput is compared, and of the pre-hold reference (default 5m, or 1m with -quick)")
	phases := fs.String("phases", strings.Join(phaseNames, ","), "phases to run (comma-separated): plain (the soak alone), hold (the soak with the transaction held)")
	producers := fs.Int("producers", 4, "producer goroutines sharing the enqueue schedule")
	batch := fs.Int("batch", 50, "jobs per EnqueueMany call")
	pool := fs.Int("pool", 16, "MaxConns of the queue's pgxpool (producers and workers share it)")
	every := fs.Duration("every", 10*time.Second, "sampling interval")
	vacuum := fs.String("autovacuum", "auto", "how dead rows get vacuumed: auto (the server's autovacuum if it is on, else emulate), emulate (the soak runs VACUUM/ANALYZE by autovacuum's rules), server (ALTER SYSTEM SET autovacuum = on for the run, restored at the end; needs superuser), none")
	naptime := fs.Duration("naptime", 0, "-autovacuum emulate: time between checks (default: the server's autovacuum_naptime)")
	drain := fs.Duration("drain", time.Minute, "at the end of a phase, how long to wait for the queue to run the jobs left")
	out := fs.String("out", "results/soak.md", "also write the report to this file, and the 10-s samples next to it as CSV (empty: stdout only)")
	newDB := fs.Bool("newdb", true, "run in a dedicated database created for the run (its own transactions only, so other databases' sessions are not the oldest transaction)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c := &config{quick: *quick, rate: *rate, producers: *producers, batch: *batch, pool: int32(*pool),
		every: *every, vacuum: *vacuum, naptime: *naptime, drain: *drain, out: *out, newDB: *newDB,
		duration: 30 * time.Minute, holdAt: 12 * time.Minute, holdFor: 5 * time.Minute, window: 5 * time.Minute}
	if c.quick {
		// The warning needs the transaction to be a minute old at a cleaner
		// pass (every minute ±20 %): a hold shorter than about 2m12s may
		// end before one sees it.
		c.duration, c.holdAt, c.holdFor, c.window = 5*time.Minute, time.Minute, 2*time.Minute+15*time.Second, time.Minute
	}
	if *duration > 0 {
		c.duration = *duration
	}
	if *window > 0 {
		c.window = *window
	}
	if *hold != "" {
		at, length, ok := strings.Cut(*hold, "+")
		var err1, err2 error
		c.holdAt, err1 = time.ParseDuration(strings.TrimSpace(at))
		c.holdFor, err2 = time.ParseDuration(strings.TrimSpace(length))
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("-hold: want START+LENGTH such as 12m+5m, got %q", *hold)
		}
	}
	var err error
	if c.phases, err = parseList(*phases, phaseNames); err != nil {
		return nil, fmt.Errorf("-phases: %w", err)
	}
	switch {
	case c.rate <= 0:
		return nil, fmt.Errorf("-rate must be positive")
	case c.producers < 1 || c.batch < 1 || c.pool < 2:
		return nil, fmt.Errorf("-producers and -batch must be at least 1, -pool at least 2")
	case c.every < time.Second || time.Minute%c.every != 0:
		return nil, fmt.Errorf("-every must be at least 1s and divide a minute")
	case c.duration < 2*c.every:
		return nil, fmt.Errorf("-duration must be at least two samples (%s)", 2*c.every)
	case 2*c.window > c.duration:
		return nil, fmt.Errorf("-window %s: the first and last windows overlap in a %s phase", c.window, c.duration)
	case !slices.Contains(vacuumModes, c.vacuum):
		return nil, fmt.Errorf("-autovacuum: unknown mode %q (known: %s)", c.vacuum, strings.Join(vacuumModes, ", "))
	}
	if slices.Contains(c.phases, "hold") && (c.holdAt <= 0 || c.holdFor <= 0 || c.holdAt+c.holdFor >= c.duration) {
		return nil, fmt.Errorf("-hold %s+%s must start after 0 and end before the phase does (%s)", c.holdAt, c.holdFor, c.duration)
	}
	return c, nil
}

func parseList(s string, known []string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("unknown name %q (known: %s)", f, strings.Join(known, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	// Always in the order: plain first.
	slices.SortFunc(out, func(a, b string) int { return slices.Index(known, a) - slices.Index(known, b) })
	return out, nil
}

// interval is the time between two batches of the schedule.
func (c *config) interval() time.Duration {
	return time.Duration(float64(c.batch) / c.rate * float64(time.Second))
}
