package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/backlogq/backlog"
)

// limitJSON is a type's limits as --json prints them: 0 is no limit.
type limitJSON struct {
	Type           string    `json:"type"`
	Concurrency    int       `json:"concurrency"`
	KeyConcurrency int       `json:"key_concurrency"`
	Rate           int       `json:"rate"`
	PerSeconds     float64   `json:"per_seconds"`
	Burst          int       `json:"burst"`
	RatePerKey     bool      `json:"rate_per_key"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func limitView(l backlog.TypeLimit) limitJSON {
	return limitJSON{Type: l.Type, Concurrency: l.Concurrency, KeyConcurrency: l.KeyConcurrency, Rate: l.Rate,
		PerSeconds: seconds(l.Per), Burst: l.Burst, RatePerKey: l.RatePerKey, UpdatedAt: l.UpdatedAt}
}

// printLimits prints limits as a table, or as a JSON array.
func (a *app) printLimits(cmd *cobra.Command, ls []backlog.TypeLimit) error {
	out := cmd.OutOrStdout()
	if a.json {
		v := make([]limitJSON, len(ls))
		for i, l := range ls {
			v[i] = limitView(l)
		}
		return writeJSON(out, v)
	}
	t := newTable(out, "TYPE", "CONCURRENCY", "KEY CONCURRENCY", "RATE", "BURST", "RATE PER KEY", "UPDATED")
	for _, l := range ls {
		rate, burst, perKey := "-", "-", "-"
		if l.Rate > 0 {
			rate, burst, perKey = rateText(l.Rate, l.Per), fmt.Sprint(l.Burst), "no"
			if l.RatePerKey {
				perKey = "yes"
			}
		}
		t.row(l.Type, orNone(l.Concurrency), orNone(l.KeyConcurrency), rate, burst, perKey, l.UpdatedAt)
	}
	return t.flush()
}

// orNone prints 0 (no limit) as "-".
func orNone(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// rateText prints a rate as --rate takes it: 100/1s, 5/1m, 1/1h30m.
func rateText(n int, per time.Duration) string {
	s := per.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return fmt.Sprintf("%d/%s", n, s)
}

// parseRate reads --rate: N/DURATION (100/1s, 5/1m; 10/s is 10/1s).
func parseRate(s string) (int, time.Duration, error) {
	bad := usagef("--rate %q: want N/DURATION, a whole number of starts per Go duration, e.g. 100/1s or 5/1m", s)
	ns, ds, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, 0, bad
	}
	n, err := strconv.Atoi(strings.TrimSpace(ns))
	if err != nil {
		return 0, 0, bad
	}
	if n < 1 {
		return 0, 0, usagef("--rate %q: N must be at least 1 (to remove a rate, set the limit again without --rate)", s)
	}
	ds = strings.TrimSpace(ds)
	if ds != "" && (ds[0] < '0' || ds[0] > '9') && ds[0] != '.' {
		ds = "1" + ds // 10/s
	}
	per, err := time.ParseDuration(ds)
	if err != nil {
		return 0, 0, bad
	}
	return n, per, nil
}

func (a *app) limitsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "limits",
		Short: "List the flow-control limits of job types",
		Long: `List the job types with flow-control limits: at most CONCURRENCY jobs of
the type running at once across all processes, KEY CONCURRENCY per
concurrency key, and RATE starts per period (a token bucket allowing
BURST starts at once after a quiet spell), for the whole type or, with
RATE PER KEY, for each key. "-" is no limit.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			ls, err := q.Limits(cmd.Context())
			if err != nil {
				return err
			}
			return a.printLimits(cmd, ls)
		},
	}
}

func (a *app) limitCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limit",
		Short: "Set or remove the flow-control limits of a job type",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("limit: give a subcommand: set or remove")
		},
	}
	cmd.AddCommand(a.limitSetCommand(), a.limitRemoveCommand())
	return cmd
}

func (a *app) limitSetCommand() *cobra.Command {
	var l backlog.Limit
	var rate string
	cmd := &cobra.Command{
		Use:   "set TYPE",
		Short: "Set a job type's limits, replacing all those it had",
		Long: `Set the flow-control limits of a job type, for every process working the
schema at once. It replaces ALL the type's limits: a limit not given is
removed (set --concurrency 5 on a type with a rate, and the rate is gone).
Give at least one of --concurrency, --key-concurrency and --rate.

--concurrency bounds the type's jobs running at once, --key-concurrency
those of each concurrency key (enqueue --concurrency-key). --rate N/DURATION
(100/1s, 5/1m) bounds starts: one every DURATION/N, with bursts of up to
--burst starts after a quiet spell (default: the starts of 100ms, at least
1); with --per-key, for each key. Running jobs keep running when a limit is
lowered. It prints the limits as stored.`,
		Example: `  backlog limit set export --concurrency 10 --key-concurrency 2
  backlog limit set charge --rate 100/1s --burst 20
  backlog limit set payout --rate 5/1m --per-key`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			fl := cmd.Flags()
			if !fl.Changed("concurrency") && !fl.Changed("key-concurrency") && !fl.Changed("rate") {
				return usagef("limit set: give --concurrency, --key-concurrency or --rate (`backlog limit remove %s` removes the limits)", argv[0])
			}
			if fl.Changed("rate") {
				var err error
				if l.Rate, l.Per, err = parseRate(rate); err != nil {
					return err
				}
			} else if fl.Changed("burst") || l.RatePerKey {
				return usagef("limit set: --burst and --per-key need --rate")
			}
			q, err := a.queue(cmd.Context())
			if err != nil {
				return err
			}
			if err := q.SetLimit(cmd.Context(), argv[0], l); err != nil {
				var ie *backlog.InputError
				if errors.As(err, &ie) && ie.Field == "per" {
					return fmt.Errorf("--rate %s: %w", rate, err) // the library's "per" is the flag's DURATION
				}
				return err
			}
			ls, err := q.Limits(cmd.Context())
			if err != nil {
				return err
			}
			for _, tl := range ls {
				if tl.Type == argv[0] {
					if a.json {
						return writeJSON(cmd.OutOrStdout(), limitView(tl))
					}
					return a.printLimits(cmd, []backlog.TypeLimit{tl})
				}
			}
			return fmt.Errorf("the limits of %s were set, then removed by someone else", argv[0])
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&l.Concurrency, "concurrency", 0, "at most N jobs of the type running at once, across all processes")
	fl.IntVar(&l.KeyConcurrency, "key-concurrency", 0, "at most N jobs of each concurrency key running at once")
	fl.StringVar(&rate, "rate", "", "at most N job starts per DURATION, as N/DURATION (100/1s, 5/1m)")
	fl.IntVar(&l.Burst, "burst", 0, "starts the rate allows at once after a quiet spell, at most N (default: the starts of 100ms, at least 1)")
	fl.BoolVar(&l.RatePerKey, "per-key", false, "apply the rate to each concurrency key instead of the whole type")
	return cmd
}

func (a *app) limitRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "remove TYPE",
		Short: "Remove the limits of a job type: its waiting jobs start at once",
		Long: `Remove every flow-control limit of a job type, for every process at once:
its waiting jobs are claimed as fast as workers take them. Removing the
limits of a type that has none does nothing.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			q, err := a.queue(cmd.Context())
			if err != nil {
				return err
			}
			if err := q.RemoveLimit(cmd.Context(), argv[0]); err != nil {
				return err
			}
			if a.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"removed": argv[0]})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed the limits of %s\n", argv[0])
			return nil
		},
	}
}
