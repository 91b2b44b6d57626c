package main

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

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
				return writeJSON(out, map[string]any{"schema": st.Schema, "version": st.Version, "dirty": st.Dirty,
					"pending": len(st.Pending()), "migrations": ms})
			}
			dirty := ""
			if st.Dirty {
				dirty = " (dirty: a migration failed half-way; fix it by hand)"
			}
			fmt.Fprintf(out, "schema %s: version %d%s, %d pending\n\n", st.Schema, st.Version, dirty, len(st.Pending()))
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

// migration is one migration as the migrations package's files hold it.
type migration struct {
	version  int64
	name     string // without the version
	up, down string
}

// migrationName is how a migration is named in messages: 0001_init.
func migrationName(v int64, name string) string { return fmt.Sprintf("%04d_%s", v, name) }

// loadMigrations reads migrations.FS, by version.
func loadMigrations() ([]migration, error) {
	files, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, f := range files {
		num, rest, _ := strings.Cut(strings.TrimSuffix(f, ".up.sql"), "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration %s: bad version", f)
		}
		up, err := fs.ReadFile(migrations.FS, f)
		if err != nil {
			return nil, err
		}
		down, err := fs.ReadFile(migrations.FS, strings.TrimSuffix(f, ".up.sql")+".down.sql")
		if err != nil {
			return nil, fmt.Errorf("migration %s has no down file: %w", f, err)
		}
		out = append(out, migration{version: v, name: rest, up: string(up), down: string(down)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// sqlFile is one file of migrate sql's output.
type sqlFile struct {
	name string
	text string
}

// sqlFiles renders the migrations in a tool's format.
func sqlFiles(format string) ([]sqlFile, error) {
	ms, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	var out []sqlFile
	for _, m := range ms {
		base := fmt.Sprintf("%04d_%s", m.version, m.name)
		switch format {
		case "golang-migrate":
			out = append(out, sqlFile{base + ".up.sql", m.up}, sqlFile{base + ".down.sql", m.down})
		case "goose":
			var b strings.Builder
			b.WriteString("-- +goose Up\n")
			gooseSection(&b, m.up)
			b.WriteString("-- +goose Down\n")
			gooseSection(&b, m.down)
			out = append(out, sqlFile{base + ".sql", strings.TrimRight(b.String(), "\n") + "\n"})
		default:
			return nil, usagef("migrate sql: --format must be golang-migrate or goose, got %q", format)
		}
	}
	return out, nil
}

const sqlPreamble = `-- backlog's migrations in %s format (%d files).
-- They use unqualified names: run them with search_path set to the queue's
-- schema (create it first), e.g. a connection string ending in
-- ?search_path=backlog. golang-migrate with x-migrations-table=schema_migrations
-- shares backlog's version table, so Queue.Migrate and ` + "`backlog migrate`" + ` see its
-- work; other tools keep their own table: let only one of them migrate.
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
The files use unqualified names: run them with search_path set to the
queue's schema. No database is needed.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			files, err := sqlFiles(format)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if dir != "" {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				for _, f := range files {
					if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.text), 0o644); err != nil {
						return err
					}
					if !a.json {
						fmt.Fprintln(out, filepath.Join(dir, f.name))
					}
				}
				if a.json {
					names := make([]string, len(files))
					for i, f := range files {
						names[i] = filepath.Join(dir, f.name)
					}
					return writeJSON(out, map[string]any{"format": format, "files": names})
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
					fs[i] = file{f.name, f.text}
				}
				return writeJSON(out, map[string]any{"format": format, "files": fs})
			}
			fmt.Fprintf(out, sqlPreamble, format, len(files))
			for _, f := range files {
				fmt.Fprintf(out, "\n-- ==> %s <==\n%s", f.name, f.text)
				if !strings.HasSuffix(f.text, "\n") {
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
