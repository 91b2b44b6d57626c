package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/backlogq/backlog"
)

// errReported is a failure already reported on stderr: exit 1, print
// nothing more.
var errReported = errors.New("failed (reported above)")

// action is retry, cancel or delete: of jobs by ID, or of the jobs a
// filter selects.
type action struct {
	name, past string
	// def are the states a filter selects when it names none, allowed
	// those it may name (as the library's …Where functions have them).
	def, allowed []backlog.State
	one          func(ctx context.Context, q *backlog.Queue, id uuid.UUID) (string, error)
	where        func(q *backlog.Queue, ctx context.Context, f backlog.Filter) (int, error)
}

var (
	live     = []backlog.State{backlog.StateBlocked, backlog.StateScheduled, backlog.StateAvailable, backlog.StateRunning}
	finished = []backlog.State{backlog.StateCompleted, backlog.StateFailed, backlog.StateCancelled}
	notRun   = []backlog.State{backlog.StateBlocked, backlog.StateScheduled, backlog.StateAvailable,
		backlog.StateCompleted, backlog.StateFailed, backlog.StateCancelled}

	retryAction = action{name: "retry", past: "retried",
		def: []backlog.State{backlog.StateFailed, backlog.StateCancelled}, allowed: finished,
		one: func(ctx context.Context, q *backlog.Queue, id uuid.UUID) (string, error) {
			s, err := q.Retry(ctx, id)
			return string(s), err
		},
		where: (*backlog.Queue).RetryWhere}
	cancelAction = action{name: "cancel", past: "cancelled", def: live, allowed: live,
		one: func(ctx context.Context, q *backlog.Queue, id uuid.UUID) (string, error) {
			s, err := q.Cancel(ctx, id)
			return string(s), err
		},
		where: (*backlog.Queue).CancelWhere}
	deleteAction = action{name: "delete", past: "deleted", def: notRun, allowed: notRun,
		one: func(ctx context.Context, q *backlog.Queue, id uuid.UUID) (string, error) {
			return "deleted", q.Delete(ctx, id)
		},
		where: (*backlog.Queue).DeleteWhere}
)

func (a *app) retryCommand() *cobra.Command {
	return a.actionCommand(retryAction, "Run finished jobs again (by ID or filter)",
		"Retry runs finished jobs again. By filter, it takes failed and cancelled jobs unless --state says otherwise.")
}

func (a *app) cancelCommand() *cobra.Command {
	return a.actionCommand(cancelAction, "Cancel live jobs (by ID or filter)",
		"Cancel cancels waiting jobs and asks running ones to stop. By filter, it takes every live state unless --state says otherwise.")
}

func (a *app) deleteCommand() *cobra.Command {
	return a.actionCommand(deleteAction, "Delete jobs that are not running (by ID or filter)",
		"Delete removes jobs, cancelling live ones first. By filter, it takes every state but running unless --state says otherwise.")
}

func (a *app) actionCommand(act action, short, long string) *cobra.Command {
	var ff filterFlags
	var yes, dryRun, all bool
	cmd := &cobra.Command{
		Use:   act.name + " [ID...]",
		Short: short,
		Long: long + `

With job IDs, it acts on each of them. Without, it acts on the jobs the
filter flags select (--all for no filter): it first counts them, and acts
only with --yes; --dry-run prints the count only.`,
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			if len(argv) > 0 {
				if ff.set() || all || dryRun {
					return usagef("%s: give job IDs or filter flags, not both", act.name)
				}
				ids, err := parseIDs(argv)
				if err != nil {
					return err
				}
				q, err := a.queue(ctx)
				if err != nil {
					return err
				}
				return a.actByID(cmd, q, act, ids)
			}
			if !ff.set() && !all {
				return usagef("%s: give job IDs, filter flags (e.g. --state failed --type email) or --all", act.name)
			}
			if yes && dryRun {
				return usagef("%s: --yes and --dry-run contradict each other", act.name)
			}
			f, err := ff.filter()
			if err != nil {
				return err
			}
			for _, s := range f.States {
				if !slices.Contains(act.allowed, s) && slices.Contains(slices.Concat(live, finished), s) {
					return usagef("%s: cannot %s %s jobs (only %s)", act.name, act.name, s, stateList(act.allowed))
				}
			}
			q, err := a.queue(ctx)
			if err != nil {
				return err
			}
			counted := f
			if len(counted.States) == 0 {
				counted.States = act.def
			}
			n, err := count(ctx, q, counted)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !yes {
				if a.json {
					if err := writeJSON(out, map[string]any{"matched": n, "dry_run": true}); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(out, "%d job(s) match (%s)\n", n, stateList(counted.States))
				}
				if dryRun || n == 0 {
					return nil
				}
				return usagef("%s: add --yes to %s the %d job(s), or --dry-run to only count them", act.name, act.name, n)
			}
			if !a.json {
				fmt.Fprintf(out, "%d job(s) match (%s)\n", n, stateList(counted.States))
			}
			done, err := act.where(q, ctx, f)
			if err != nil {
				if done > 0 {
					fmt.Fprintf(out, "%s %d job(s) before the error\n", act.past, done)
				}
				return err
			}
			if a.json {
				return writeJSON(out, map[string]any{"matched": n, act.past: done})
			}
			fmt.Fprintf(out, "%s %d job(s)\n", act.past, done)
			return nil
		},
	}
	ff.register(cmd.Flags())
	cmd.Flags().BoolVar(&yes, "yes", false, "act on the jobs the filter selects")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count the jobs the filter selects")
	cmd.Flags().BoolVar(&all, "all", false, "select every job (in the action's default states) when no filter flag is given")
	return cmd
}

// actByID acts on each job; a job that fails is reported and the others
// go on.
func (a *app) actByID(cmd *cobra.Command, q *backlog.Queue, act action, ids []uuid.UUID) error {
	type result struct {
		ID    uuid.UUID `json:"id"`
		State string    `json:"state,omitempty"`
		Error string    `json:"error,omitempty"`
	}
	var results []result
	failed := 0
	for _, id := range ids {
		state, err := act.one(cmd.Context(), q, id)
		r := result{ID: id, State: state}
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return err
			}
			failed++
			r.State, r.Error = "", oneLine(err.Error())
			if !a.json {
				fmt.Fprintf(a.stderr, "backlog: %s\n", r.Error)
			}
		}
		results = append(results, r)
	}
	out := cmd.OutOrStdout()
	if a.json {
		if err := writeJSON(out, results); err != nil {
			return err
		}
	} else {
		t := newTable(out, "ID", "STATE")
		for _, r := range results {
			if r.Error == "" {
				t.row(r.ID, r.State)
			}
		}
		if len(results) > failed {
			if err := t.flush(); err != nil {
				return err
			}
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d job(s) not %s: %w", failed, len(ids), act.past, errReported)
	}
	return nil
}

// count counts the jobs f selects, a page at a time.
func count(ctx context.Context, q *backlog.Queue, f backlog.Filter) (int, error) {
	n := 0
	opts := backlog.ListOptions{Limit: backlog.MaxListLimit, Oldest: true}
	for {
		page, err := q.List(ctx, f, opts)
		if err != nil {
			return n, fmt.Errorf("counting the jobs: %w", err)
		}
		n += len(page.Jobs)
		if page.Next == "" {
			return n, nil
		}
		opts.Cursor = page.Next
	}
}

func stateList(states []backlog.State) string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}
