package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/backlogq/backlog"
)

// jobJSON is a job as --json prints it.
type jobJSON struct {
	ID             uuid.UUID         `json:"id"`
	Type           string            `json:"type"`
	State          backlog.State     `json:"state"`
	Args           json.RawMessage   `json:"args"`
	Tags           map[string]string `json:"tags,omitempty"`
	Priority       int               `json:"priority"`
	Attempt        int               `json:"attempt"`
	MaxAttempts    int               `json:"max_attempts"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
	Worker         string            `json:"worker,omitempty"`
	Result         json.RawMessage   `json:"result,omitempty"`
	Progress       json.RawMessage   `json:"progress,omitempty"`
	LastError      string            `json:"last_error,omitempty"`
	Errors         []attemptJSON     `json:"errors,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	RunAt          time.Time         `json:"run_at"`
	StartedAt      *time.Time        `json:"started_at,omitempty"`
	FinishedAt     *time.Time        `json:"finished_at,omitempty"`
	OrderingKey    string            `json:"ordering_key,omitempty"`
	UniqueKey      string            `json:"unique_key,omitempty"`
	ConcurrencyKey string            `json:"concurrency_key,omitempty"`
}

// showJSON is a job as show --json prints it: its record and the graph
// around it (Queue.Graph).
type showJSON struct {
	jobJSON
	Prerequisites     []nodeJSON `json:"prerequisites"`
	Dependents        []nodeJSON `json:"dependents"`
	MorePrerequisites int        `json:"more_prerequisites,omitempty"`
	MoreDependents    int        `json:"more_dependents,omitempty"`
	// MoreDependentsAtLeast: counting stopped; MoreDependents is a lower
	// bound.
	MoreDependentsAtLeast bool `json:"more_dependents_at_least,omitempty"`
}

// nodeJSON is a neighbour of a job.
type nodeJSON struct {
	ID      uuid.UUID     `json:"id"`
	Type    string        `json:"type,omitempty"`
	State   backlog.State `json:"state,omitempty"`
	Edge    string        `json:"edge"` // depends or order
	Deleted bool          `json:"deleted,omitempty"`
}

func nodesView(ns []backlog.GraphNode) []nodeJSON {
	out := make([]nodeJSON, len(ns))
	for i, n := range ns {
		out[i] = nodeJSON{ID: n.ID, Type: n.Type, State: n.State, Edge: edgeKind(n), Deleted: n.Deleted}
	}
	return out
}

func edgeKind(n backlog.GraphNode) string {
	if n.Order {
		return "order"
	}
	return "depends"
}

type attemptJSON struct {
	Attempt    int        `json:"attempt"`
	At         time.Time  `json:"at"`
	Error      string     `json:"error"`
	Worker     string     `json:"worker,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	DurationMs *int64     `json:"duration_ms,omitempty"`
	Outcome    string     `json:"outcome,omitempty"`
}

func jobView(j *backlog.JobInfo) jobJSON {
	v := jobJSON{ID: j.ID, Type: j.Type, State: j.State, Args: j.Args, Tags: j.Tags, Priority: j.Priority,
		Attempt: j.Attempt, MaxAttempts: j.MaxAttempts, TimeoutSeconds: seconds(j.Timeout), Worker: j.Worker,
		Result: j.Result, Progress: j.Progress, LastError: j.LastError, CreatedAt: j.CreatedAt, RunAt: j.RunAt, StartedAt: j.StartedAt,
		FinishedAt: j.FinishedAt, OrderingKey: j.OrderingKey, UniqueKey: j.UniqueKey, ConcurrencyKey: j.ConcurrencyKey}
	if len(v.Args) == 0 {
		v.Args = json.RawMessage("null")
	}
	if len(v.Tags) == 0 {
		v.Tags = nil
	}
	for _, e := range j.Errors {
		a := attemptJSON{Attempt: e.Attempt, At: e.At, Error: e.Error, Worker: e.Worker, StartedAt: e.StartedAt, Outcome: e.Outcome}
		if e.StartedAt != nil {
			ms := e.Duration.Milliseconds()
			a.DurationMs = &ms
		}
		v.Errors = append(v.Errors, a)
	}
	return v
}

// tagText prints tags as k=v, sorted.
func tagText(tags map[string]string) string {
	kv := make([]string, 0, len(tags))
	for k, v := range tags {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

func (a *app) listCommand() *cobra.Command {
	var ff filterFlags
	var limit int
	var oldest bool
	var cursor string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List jobs, newest first, a page at a time",
		Long: `List the jobs the filter flags select, live and finished, newest first
(--oldest-first for oldest first), a page of --limit jobs at a time. When
more may follow, the next cursor is printed: pass it as --cursor, with the
same flags, for the next page.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := ff.filter()
			if err != nil {
				return err
			}
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			page, err := q.List(cmd.Context(), f, backlog.ListOptions{Oldest: oldest, Limit: limit, Cursor: cursor})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if a.json {
				jobs := make([]jobJSON, len(page.Jobs))
				for i, j := range page.Jobs {
					jobs[i] = jobView(j)
				}
				return writeJSON(out, map[string]any{"jobs": jobs, "next": page.Next})
			}
			t := newTable(out, "ID", "TYPE", "STATE", "ATTEMPT", "CREATED", "FINISHED", "TAGS", "LAST ERROR")
			for _, j := range page.Jobs {
				t.row(j.ID, j.Type, j.State, fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts), j.CreatedAt, j.FinishedAt,
					tagText(j.Tags), truncate(j.LastError, 60))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if page.Next != "" {
				fmt.Fprintf(out, "next cursor: %s\n", page.Next)
			}
			return nil
		},
	}
	ff.register(cmd.Flags())
	cmd.Flags().IntVar(&limit, "limit", backlog.DefaultListLimit, fmt.Sprintf("page size, at most %d", backlog.MaxListLimit))
	cmd.Flags().BoolVar(&oldest, "oldest-first", false, "oldest jobs first")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue a listing: the next cursor a previous page printed")
	return cmd
}

func (a *app) showCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show a job: its record, args, result, error history and graph",
		Long: `Show a job: its record, args, result and error history, and the graph
around it: its prerequisites and dependents, pending or finished, each with
its state (a finished job's graph is kept as long as the jobs are).`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ids, err := parseIDs(argv)
			if err != nil {
				return err
			}
			q, err := a.readQueue(cmd.Context())
			if err != nil {
				return err
			}
			j, err := q.Job(cmd.Context(), ids[0])
			if err != nil {
				return err
			}
			g, err := q.Graph(cmd.Context(), ids[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if a.json {
				return writeJSON(out, showJSON{jobJSON: jobView(j), Prerequisites: nodesView(g.Prerequisites),
					Dependents: nodesView(g.Dependents), MorePrerequisites: g.MorePrerequisites,
					MoreDependents: g.MoreDependents, MoreDependentsAtLeast: g.DependentsAtLeast})
			}
			if err := printJob(out, j); err != nil {
				return err
			}
			if err := printNodes(out, "Prerequisites", g.Prerequisites, g.MorePrerequisites, false); err != nil {
				return err
			}
			return printNodes(out, "Dependents", g.Dependents, g.MoreDependents, g.DependentsAtLeast)
		},
	}
}

// printNodes prints one side of a job's graph, when it has any.
func printNodes(out io.Writer, title string, ns []backlog.GraphNode, more int, atLeast bool) error {
	if len(ns) == 0 && more == 0 {
		return nil
	}
	fmt.Fprintf(out, "\n%s:\n", title)
	t := newTable(out, "ID", "TYPE", "STATE", "EDGE")
	for _, n := range ns {
		state := string(n.State)
		if n.Deleted {
			state = "deleted"
		}
		t.row(n.ID, n.Type, state, edgeKind(n))
	}
	if err := t.flush(); err != nil {
		return err
	}
	switch {
	case more > 0 && atLeast:
		fmt.Fprintf(out, "and at least %d more\n", more)
	case more > 0:
		fmt.Fprintf(out, "and %d more\n", more)
	}
	return nil
}

func printJob(out io.Writer, j *backlog.JobInfo) error {
	t := newTable(out, "ID:", j.ID.String())
	timeout := "-"
	if j.Timeout > 0 {
		timeout = j.Timeout.String()
	}
	for _, kv := range [][2]any{
		{"Type:", j.Type}, {"State:", j.State}, {"Priority:", j.Priority},
		{"Attempt:", fmt.Sprintf("%d of %d", j.Attempt, j.MaxAttempts)}, {"Timeout:", timeout},
		{"Tags:", tagText(j.Tags)}, {"Worker:", j.Worker}, {"Created:", j.CreatedAt}, {"Run at:", j.RunAt},
		{"Started:", j.StartedAt}, {"Finished:", j.FinishedAt}, {"Last error:", j.LastError},
	} {
		t.row(kv[0], kv[1])
	}
	for _, kv := range [][2]string{{"Ordering key:", j.OrderingKey}, {"Unique key:", j.UniqueKey}, {"Concurrency key:", j.ConcurrencyKey}} {
		if kv[1] != "" { // only the keys it has
			t.row(kv[0], kv[1])
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nArgs:\n%s\n", indent(prettyJSON(j.Args)))
	if len(j.Progress) > 0 {
		fmt.Fprintf(out, "\nProgress:\n%s\n", indent(prettyJSON(j.Progress)))
	}
	if len(j.Result) > 0 {
		fmt.Fprintf(out, "\nResult:\n%s\n", indent(prettyJSON(j.Result)))
	}
	if len(j.Errors) > 0 {
		fmt.Fprintf(out, "\nErrors (oldest first):\n")
		for _, e := range j.Errors {
			how := ""
			if e.Outcome != "" {
				how = " (" + e.Outcome
				if e.Worker != "" {
					how += ", worker " + e.Worker
				}
				if e.StartedAt != nil {
					how += ", ran " + e.Duration.String()
				}
				how += ")"
			}
			fmt.Fprintf(out, "  attempt %d at %s%s:\n%s\n", e.Attempt, cell(e.At), how, indent(indent(e.Error)))
		}
	}
	return nil
}

// indent indents every line by two spaces.
func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

func (a *app) enqueueCommand() *cobra.Command {
	var tags []string
	var runAt, uniqueKey, orderingKey, concurrencyKey string
	var priority, maxAttempts int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "enqueue TYPE [ARGS-JSON]",
		Short: "Enqueue a job; ARGS-JSON is its arguments as JSON (- reads stdin)",
		Args:  args(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var opts []backlog.EnqueueOption
			var jobArgs any
			if len(argv) == 2 {
				raw := []byte(argv[1])
				if argv[1] == "-" {
					var err error
					if raw, err = io.ReadAll(cmd.InOrStdin()); err != nil {
						return fmt.Errorf("reading args from stdin: %w", err)
					}
				}
				if !json.Valid(raw) {
					return usagef("enqueue: ARGS-JSON is not valid JSON: %s", truncate(string(raw), 60))
				}
				jobArgs = json.RawMessage(raw)
			}
			t, err := parseTags(tags)
			if err != nil {
				return err
			}
			if t != nil {
				opts = append(opts, t)
			}
			if runAt != "" {
				o, err := parseRunAt(runAt)
				if err != nil {
					return err
				}
				opts = append(opts, o)
			}
			if uniqueKey != "" {
				opts = append(opts, backlog.UniqueKey(uniqueKey))
			}
			if orderingKey != "" {
				opts = append(opts, backlog.OrderingKey(orderingKey))
			}
			if concurrencyKey != "" {
				opts = append(opts, backlog.ConcurrencyKey(concurrencyKey))
			}
			if cmd.Flags().Changed("priority") {
				opts = append(opts, backlog.Priority(priority))
			}
			if cmd.Flags().Changed("max-attempts") {
				opts = append(opts, backlog.MaxAttempts(maxAttempts))
			}
			if timeout != 0 {
				opts = append(opts, backlog.Timeout(timeout))
			}
			q, err := a.queue(cmd.Context())
			if err != nil {
				return err
			}
			id, err := q.Enqueue(cmd.Context(), argv[0], jobArgs, opts...)
			if err != nil {
				return err
			}
			if a.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"id": id})
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&tags, "tag", nil, "a tag, as key=value (repeat for several)")
	fl.StringVar(&runAt, "run-at", "", "when the job is due: RFC 3339, or +duration from now (+10m)")
	fl.StringVar(&uniqueKey, "unique-key", "", "at most one live job with this key (enqueueing another returns its ID)")
	fl.StringVar(&orderingKey, "ordering-key", "", "jobs with this key run one at a time, in order")
	fl.StringVar(&concurrencyKey, "concurrency-key", "", "the job's group for flow control (backlog limit set --key-concurrency, --per-key)")
	fl.IntVar(&priority, "priority", backlog.DefaultPriority, "priority, 0 (runs first) to 100")
	fl.IntVar(&maxAttempts, "max-attempts", backlog.DefaultMaxAttempts, "attempts before the job fails")
	fl.DurationVar(&timeout, "timeout", 0, "cancel an attempt after this long (0: never)")
	return cmd
}

// parseRunAt reads --run-at: a time, or a delay on the database clock.
func parseRunAt(s string) (backlog.EnqueueOption, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return backlog.RunAt(t), nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(s, "+")); err == nil && d >= 0 {
		return backlog.Delay(d), nil
	}
	return nil, usagef("--run-at %q: want an RFC 3339 time or +duration (+10m)", s)
}
