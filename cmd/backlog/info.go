package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/backlogq/backlog"
)

// allStates in life order, for the stats columns.
var allStates = []backlog.State{backlog.StateBlocked, backlog.StateScheduled, backlog.StateAvailable, backlog.StateRunning,
	backlog.StateCompleted, backlog.StateFailed, backlog.StateCancelled}

func (a *app) statsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Show job counts by type and state, the oldest waiting job, paused types",
		Long: `Show job counts by type and state: live jobs as they are now, finished
ones over the last 24 hours; how long the oldest available job has waited,
running jobs per worker, paused types and the oldest open transaction.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			st, err := q.Stats(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if a.json {
				v := map[string]any{"by_state": st.ByState, "by_type": st.ByType,
					"oldest_available_seconds": seconds(st.OldestAvailable), "running_by_worker": st.RunningByWorker,
					"paused": nonNil(st.Paused), "oldest_transaction": nil}
				if ot := st.OldestTransaction; ot != nil {
					v["oldest_transaction"] = map[string]any{"kind": ot.Kind, "pid": ot.PID, "age_seconds": seconds(ot.Age),
						"state": ot.State, "application": ot.Application, "query": ot.Query}
				}
				return writeJSON(out, v)
			}
			header := []string{"TYPE"}
			for _, s := range allStates {
				header = append(header, strings.ToUpper(string(s)))
			}
			t := newTable(out, header...)
			types := make([]string, 0, len(st.ByType))
			for typ := range st.ByType {
				types = append(types, typ)
			}
			sort.Strings(types)
			for _, typ := range types {
				t.row(countsRow(typ, st.ByType[typ])...)
			}
			t.row(countsRow("(all)", st.ByState)...)
			if err := t.flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "\nfinished jobs are counted over the last %s\n", strings.TrimSuffix(backlog.StatsWindow.String(), "0m0s"))
			if st.ByState[backlog.StateAvailable] == 0 {
				fmt.Fprintln(out, "no available job is waiting")
			} else {
				fmt.Fprintf(out, "oldest available job waiting: %s\n", st.OldestAvailable.Round(time.Millisecond))
			}
			paused := "none"
			if len(st.Paused) > 0 {
				paused = strings.Join(st.Paused, ", ")
			}
			fmt.Fprintf(out, "paused types: %s\n", paused)
			if len(st.RunningByWorker) > 0 {
				workers := make([]string, 0, len(st.RunningByWorker))
				for w, n := range st.RunningByWorker {
					workers = append(workers, fmt.Sprintf("%s (%d)", w, n))
				}
				sort.Strings(workers)
				fmt.Fprintf(out, "running by worker: %s\n", strings.Join(workers, ", "))
			}
			if ot := st.OldestTransaction; ot != nil {
				fmt.Fprintf(out, "oldest open transaction: %s, pid %d, %s old, %s, %s: %s\n", ot.Kind, ot.PID,
					ot.Age.Round(time.Second), cell(ot.State), cell(ot.Application), truncate(ot.Query, 80))
			}
			return nil
		},
	}
}

func countsRow(name string, counts map[backlog.State]int64) []any {
	row := []any{name}
	for _, s := range allStates {
		row = append(row, counts[s])
	}
	return row
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (a *app) pauseCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "pause TYPE...",
		Short: "Stop every process from claiming jobs of these types (durable)",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, types []string) error {
			q, err := a.queue(cmd.Context())
			if err != nil {
				return err
			}
			if err := q.Pause(cmd.Context(), types...); err != nil {
				return err
			}
			return a.done(cmd, "paused", types)
		},
	}
}

func (a *app) resumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "resume TYPE...",
		Short: "Let paused types be claimed again",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, types []string) error {
			q, err := a.queue(cmd.Context())
			if err != nil {
				return err
			}
			if err := q.Resume(cmd.Context(), types...); err != nil {
				return err
			}
			return a.done(cmd, "resumed", types)
		},
	}
}

func (a *app) done(cmd *cobra.Command, what string, types []string) error {
	if a.json {
		return writeJSON(cmd.OutOrStdout(), map[string]any{what: types})
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", what, strings.Join(types, ", "))
	return nil
}

func (a *app) pausedCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "paused",
		Short: "List the paused types",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			ps, err := q.Paused(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				type paused struct {
					Type     string    `json:"type"`
					PausedAt time.Time `json:"paused_at"`
				}
				v := make([]paused, len(ps))
				for i, p := range ps {
					v[i] = paused(p)
				}
				return writeJSON(cmd.OutOrStdout(), v)
			}
			t := newTable(cmd.OutOrStdout(), "TYPE", "PAUSED AT")
			for _, p := range ps {
				t.row(p.Type, p.PausedAt)
			}
			return t.flush()
		},
	}
}

func (a *app) processesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "processes",
		Short: "List the live worker processes",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			ps, err := q.Processes(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				type work struct {
					Types       []string          `json:"types"`
					Tags        map[string]string `json:"tags,omitempty"`
					Concurrency int               `json:"concurrency"`
					Prefetch    int               `json:"prefetch"`
					Running     int               `json:"running"`
				}
				type proc struct {
					WorkerID     string    `json:"worker_id"`
					Host         string    `json:"host"`
					PID          int       `json:"pid"`
					StartedAt    time.Time `json:"started_at"`
					HeartbeatAt  time.Time `json:"heartbeat_at"`
					LeaseSeconds float64   `json:"lease_seconds"`
					Running      int       `json:"running"`
					Leased       int       `json:"leased"`
					Works        []work    `json:"works"`
				}
				v := make([]proc, len(ps))
				for i, p := range ps {
					v[i] = proc{WorkerID: p.WorkerID, Host: p.Host, PID: p.PID, StartedAt: p.StartedAt, HeartbeatAt: p.HeartbeatAt,
						LeaseSeconds: seconds(p.Lease), Running: p.Running, Leased: p.Leased, Works: make([]work, len(p.Works))}
					for j, w := range p.Works {
						v[i].Works[j] = work(w)
					}
				}
				return writeJSON(cmd.OutOrStdout(), v)
			}
			t := newTable(cmd.OutOrStdout(), "WORKER", "HOST", "PID", "STARTED", "HEARTBEAT", "RUNNING", "LEASED", "WORK (TYPES CONCURRENCY/PREFETCH)")
			for _, p := range ps {
				works := make([]string, len(p.Works))
				for i, w := range p.Works {
					works[i] = fmt.Sprintf("%s %d/%d", strings.Join(w.Types, ","), w.Concurrency, w.Prefetch)
					if len(w.Tags) > 0 {
						works[i] += " [" + tagText(w.Tags) + "]"
					}
				}
				t.row(p.WorkerID, p.Host, p.PID, p.StartedAt, p.HeartbeatAt, p.Running, p.Leased, strings.Join(works, "; "))
			}
			return t.flush()
		},
	}
}

func (a *app) schedulesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "schedules",
		Short: "List the periodic schedules (Every, Cron) with their last and next plans",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			ss, err := q.Schedules(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				v := make([]map[string]any, len(ss))
				for i, s := range ss {
					m := map[string]any{"name": s.Name, "kind": s.Kind, "spec": s.Spec, "type": s.Type, "args": s.Args,
						"priority": s.Priority, "max_attempts": s.MaxAttempts, "timeout_seconds": seconds(s.Timeout),
						"ordering_key": s.OrderingKey, "unique_key": s.UniqueKey, "catch_up": s.CatchUp,
						"last_plan": timePtr(s.LastPlan), "next_plan": timePtr(s.NextPlan), "created_at": s.CreatedAt,
						"updated_at": s.UpdatedAt, "registered_at": s.RegisteredAt, "registered_by": s.RegisteredBy,
						"stale": s.Stale, "tags": s.Tags, "last_job_id": nil}
					if s.LastJobID != [16]byte{} {
						m["last_job_id"] = s.LastJobID
					}
					v[i] = m
				}
				return writeJSON(cmd.OutOrStdout(), v)
			}
			t := newTable(cmd.OutOrStdout(), "NAME", "KIND", "SPEC", "TYPE", "LAST PLAN", "NEXT PLAN", "REGISTERED BY", "STALE")
			for _, s := range ss {
				stale := "no"
				if s.Stale {
					stale = "yes"
				}
				t.row(s.Name, s.Kind, s.Spec, s.Type, s.LastPlan, s.NextPlan, s.RegisteredBy, stale)
			}
			return t.flush()
		},
	}
}
