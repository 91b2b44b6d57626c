// Command backlog operates a backlog job queue from the shell: it migrates
// the schema, lists, shows, retries, cancels, deletes and enqueues jobs,
// pauses and resumes types, sets and removes their flow-control limits, and
// reports stats, processes and schedules; `backlog ui` serves the web
// dashboard (backlogui).
//
// It connects to $DATABASE_URL (or --database-url) and works on one schema
// (--schema, default "backlog"); with --read-url (or $BACKLOG_READ_URL) the
// read commands read a hot standby instead. Output is an aligned table by default and
// JSON with --json. Exit codes: 0 success, 1 failure, 2 bad usage (an
// unknown flag, a bad argument, input the library rejects).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/backlogq/backlog"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is bad usage: a wrong argument or flag value, or a missing
// confirmation. It exits with exitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// run executes one command line and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := &app{stdout: stdout, stderr: stderr}
	root := app.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	app.close()
	if err == nil {
		return exitOK
	}
	msg := "backlog: " + oneLine(app.redact(err.Error()))
	if !app.ran {
		// Errors before a command ran are cobra's: unknown commands and
		// flags, bad flag values, wrong argument counts.
		msg += " (see backlog --help)"
	}
	fmt.Fprintln(stderr, msg)
	var ue *usageError
	switch {
	case !app.ran, errors.As(err, &ue), errors.Is(err, backlog.ErrInvalid):
		return exitUsage
	default:
		return exitFailure
	}
}

// oneLine makes an error message fit on one line, without the repeated
// "backlog: " prefixes of wrapped library errors.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "backlog: ", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// app is one invocation: its global flags and its connection.
type app struct {
	stdout, stderr io.Writer
	databaseURL    string
	readURLFlag    string
	schema         string
	json           bool
	ran            bool // a command's RunE started: later errors are not cobra's

	conn *conn // opened on first use
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "backlog",
		Short: "Operate a backlog job queue in PostgreSQL",
		Long: `backlog operates a backlog job queue: migrations, jobs, types, limits, stats.

It connects to $DATABASE_URL (or --database-url) and works on one schema
(--schema); with --read-url (or $BACKLOG_READ_URL) the read commands read a
hot standby, as stale as its replay lag. Tables by default, JSON with --json.

Exit codes: 0 success, 1 failure, 2 bad usage.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(*cobra.Command, []string) {
			a.ran = true
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL connection string (default $DATABASE_URL)")
	pf.StringVar(&a.readURLFlag, "read-url", "", "a hot standby's connection string for the read commands (stats, list, show, paused, processes, schedules, limits, ui); writes stay on --database-url (default $BACKLOG_READ_URL, else none)")
	pf.StringVar(&a.schema, "schema", backlog.DefaultSchema, "the queue's PostgreSQL schema")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of tables")

	root.AddCommand(a.migrateCommand(), a.statsCommand(), a.listCommand(), a.showCommand(),
		a.retryCommand(), a.cancelCommand(), a.deleteCommand(), a.pauseCommand(), a.resumeCommand(),
		a.pausedCommand(), a.processesCommand(), a.schedulesCommand(), a.enqueueCommand(),
		a.limitsCommand(), a.limitCommand(), a.uiCommand())
	return root
}

// args checks a command's positional arguments, as a usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &usageError{msg: cmd.CommandPath() + ": " + err.Error()}
		}
		return nil
	}
}
