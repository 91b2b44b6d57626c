package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/migrations"
)

func (a *app) migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create, upgrade, revert or print the schema's migrations",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("migrate: give a subcommand: up, down, status or sql")
		},
	}
	cmd.AddCommand(a.migrateUpCommand(), a.migrateDownCommand(), a.migrateStatusCommand(), a.migrateSQLCommand())
	return cmd
}

func (a *app) migrateUpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (idempotent)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := a.open(ctx)
			if err != nil {
				return err
			}
			before, err := c.q.MigrationStatus(ctx)
			if err != nil {
				return err
			}
			if err := c.q.Migrate(ctx); err != nil {
				return fmt.Errorf("migrating schema %s: %w", a.schema, err)
			}
			after, err := c.q.MigrationStatus(ctx)
			if err != nil {
				return err
			}
			applied := []string{}
			for _, m := range before.Pending() {
				if m.Version <= after.Version {
					applied = append(applied, migrationName(m.Version, m.Name))
				}
			}
			if a.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"schema": a.schema, "version": after.Version, "applied": applied})
			}
			if len(applied) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "schema %s is up to date (version %d)\n", a.schema, after.Version)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schema %s migrated to version %d: applied %s\n", a.schema, after.Version, strings.Join(applied, ", "))
			return nil
		},
	}
}

func (a *app) migrateDownCommand() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "down [N|all]",
		Short: "Revert the N newest migrations (default 1); needs --yes",
		Long: `Revert the N newest applied migrations (default 1; "all" reverts every one),
newest first, each in its own transaction. Reverting drops what the
migrations made, jobs included: without --yes it only lists what it would
revert. Stop the workers using the schema first.`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			n := 1
			if len(argv) == 1 {
				if argv[0] == "all" {
					n = math.MaxInt
				} else if v, err := strconv.Atoi(argv[0]); err != nil || v < 1 {
					return usagef("migrate down: N must be a positive number or \"all\", got %q", argv[0])
				} else {
					n = v
				}
			}
			ctx := cmd.Context()
			c, err := a.open(ctx)
			if err != nil {
				return err
			}
			st, err := c.q.MigrationStatus(ctx)
			if err != nil {
				return err
			}
			var would []string
			for i := len(st.Migrations) - 1; i >= 0 && len(would) < n; i-- {
				if m := st.Migrations[i]; m.Applied {
					would = append(would, migrationName(m.Version, m.Name))
				}
			}
			if !yes {
				if len(would) == 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "schema %s has no migration to revert\n", a.schema)
					return nil
				}
				if a.json {
					if err := writeJSON(cmd.OutOrStdout(), map[string]any{"schema": a.schema, "would_revert": would}); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "would revert from schema %s: %s\n", a.schema, strings.Join(would, ", "))
				}
				return usagef("migrate down: reverting drops tables and their jobs; add --yes to revert %d migration(s)", len(would))
			}
			done, err := c.q.MigrateDown(ctx, n)
			names := []string{}
			for _, v := range done {
				for _, m := range st.Migrations {
					if m.Version == v {
						names = append(names, migrationName(m.Version, m.Name))
					}
				}
			}
			if err != nil {
				if len(names) > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "reverted %s\n", strings.Join(names, ", "))
				}
				return fmt.Errorf("reverting schema %s: %w", a.schema, err)
			}
			after, err := c.q.MigrationStatus(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"schema": a.schema, "version": after.Version, "reverted": names})
			}
			if len(names) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "schema %s has no migration to revert\n", a.schema)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schema %s reverted to version %d: reverted %s\n", a.schema, after.Version, strings.Join(names, ", "))
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really revert")
	return cmd
}

func (a *app) migrateStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the schema's version and the applied and pending migrations",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := a.open(ctx)
			if err != nil {
				return err
			}
			st, err := c.q.MigrationStatus(ctx)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if a.json {
				type mig struct {
					Version int64  `json:"version"`
					Name    string `json:"name"`
					Applied bool   `json:"applied"`
				}
				ms := make([]mig, len(st.Migrations))
				for i, m := range st.Migrations {
					ms[i] = mig(m)
				}
				type tool struct {
					Tool    string `json:"tool"`
					Table   string `json:"table"`
					Version int64  `json:"version"`
					Dirty   bool   `json:"dirty"`
				}
				tools := make([]tool, len(st.Tools))
				for i, t := range st.Tools {
					tools[i] = tool(t)
				}
				return writeJSON(out, map[string]any{"schema": st.Schema, "version": st.Version, "dirty": st.Dirty,
					"migrated_by": st.MigratedBy, "tools": tools, "pending": len(st.Pending()), "migrations": ms})
			}
			dirty := ""
			if st.Dirty {
				dirty = " (dirty: a migration failed half-way; fix it by hand)"
			}
			by := ""
			if st.MigratedBy != "" {
				by = ", migrated by " + st.MigratedBy
			}
			fmt.Fprintf(out, "schema %s: version %d%s%s, %d pending\n", st.Schema, st.Version, dirty, by, len(st.Pending()))
			for _, t := range st.Tools {
				note := ""
				switch {
				case t.Dirty:
					note = " (dirty)"
				case t.Version < st.Version:
					note = fmt.Sprintf(" (behind backlog's %d: its next run records the newer files without running them)", st.Version)
				case t.Version > st.Version:
					note = fmt.Sprintf(" (ahead of backlog's %d: backlog reverted what it ran since)", st.Version)
				}
				fmt.Fprintf(out, "%s's table %s: version %d%s\n", t.Tool, t.Table, t.Version, note)
			}
			fmt.Fprintln(out)
			t := newTable(out, "VERSION", "NAME", "STATE")
			for _, m := range st.Migrations {
				state := "pending"
				if m.Applied {
					state = "applied"
				}
				t.row(m.Version, m.Name, state)
			}
			return t.flush()
		},
	}
}

// migrationName is how a migration is named in messages: 0001_init.
func migrationName(v int64, name string) string { return fmt.Sprintf("%04d_%s", v, name) }

// sqlFiles renders the migrations in a tool's format, for schema.
func sqlFiles(format, schema string) ([]migrate.File, error) {
	if format != migrate.FormatGolangMigrate && format != migrate.FormatGoose {
		return nil, usagef("migrate sql: --format must be golang-migrate or goose, got %q", format)
	}
	ms, err := migrate.Load(migrations.FS)
	if err != nil {
		return nil, err
	}
	files, err := migrate.Export(ms, schema, format)
	if err != nil {
		return nil, usagef("migrate sql: %v", err)
	}
	return files, nil
}

const sqlPreamble = `-- backlog's migrations in %s format (%d files), for schema %s.
-- Each file is one statement per direction, a DO block that targets the
-- schema itself (it creates it, and sets search_path for the migration
-- only), skips a migration schema_migrations (backlog's version table)
-- says is applied, and records each one there: backlog's own migrate and
-- Queue.Migrate, goose and golang-migrate can take turns on the schema.
-- Keep the tool's own version table in the schema too (search_path=%s
-- in its connection string, once the schema exists), so that
-- ` + "`backlog migrate status`" + ` finds it. golang-migrate must not split
-- the files (no x-multi-statement).
`

func (a *app) migrateSQLCommand() *cobra.Command {
	var format, dir string
	cmd := &cobra.Command{
		Use:   "sql",
		Short: "Print the migrations for your own migration tool (golang-migrate or goose)",
		Long: `Print backlog's migrations for teams that run their own migration tool.

--format golang-migrate prints the NNNN_name.up.sql and .down.sql files,
each after a header line; --format goose prints NNNN_name.sql files with
goose's annotations. With --dir, the files are written there instead.
No database is needed.

The files target the queue's schema (--schema): each direction of a
migration is one statement, a DO block that takes backlog's migration
lock, creates the schema if needed, sets search_path to it for the
migration only, runs the migration unless schema_migrations (backlog's own
version table) says the schema has it, and records the version there. So
` + "`backlog migrate up`" + `, Queue.Migrate, goose and golang-migrate can take turns on
one schema, in either order, and none runs a migration twice. Keep the
tool's own version table in the schema too (search_path=<schema> in its
connection string, once the schema exists) so that ` + "`migrate status`" + ` shows it.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			files, err := sqlFiles(format, a.schema)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if dir != "" {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				for _, f := range files {
					if err := os.WriteFile(filepath.Join(dir, f.Name), []byte(f.Text), 0o644); err != nil {
						return err
					}
					if !a.json {
						fmt.Fprintln(out, filepath.Join(dir, f.Name))
					}
				}
				if a.json {
					names := make([]string, len(files))
					for i, f := range files {
						names[i] = filepath.Join(dir, f.Name)
					}
					return writeJSON(out, map[string]any{"format": format, "schema": a.schema, "files": names})
				}
				return nil
			}
			if a.json {
				type file struct {
					Name string `json:"name"`
					SQL  string `json:"sql"`
				}
				fs := make([]file, len(files))
				for i, f := range files {
					fs[i] = file{f.Name, f.Text}
				}
				return writeJSON(out, map[string]any{"format": format, "schema": a.schema, "files": fs})
			}
			fmt.Fprintf(out, sqlPreamble, format, len(files), a.schema, a.schema)
			for _, f := range files {
				fmt.Fprintf(out, "\n-- ==> %s <==\n%s", f.Name, f.Text)
				if !strings.HasSuffix(f.Text, "\n") {
					fmt.Fprintln(out)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "golang-migrate", "golang-migrate or goose")
	cmd.Flags().StringVar(&dir, "dir", "", "write the files into this directory instead of printing them")
	return cmd
}
