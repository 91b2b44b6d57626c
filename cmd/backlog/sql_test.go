package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/backlogq/backlog"
)

// TestMigrateSQL: the files for each format, printed after a preamble or
// written to --dir, one (golang-migrate) or two (goose) per embedded
// migration, each naming the schema it targets.
func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	c := &cli{t: t, schema: "orders_q"}
	for _, format := range []string{"golang-migrate", "goose"} {
		var want []string
		for _, m := range ms {
			base := fmt.Sprintf("%04d_%s", m.Version, m.Name)
			if format == "goose" {
				want = append(want, base+".sql")
			} else {
				want = append(want, base+".down.sql", base+".up.sql")
			}
		}
		printed := c.ok("migrate", "sql", "--format", format)
		if !strings.HasPrefix(printed, "-- backlog's migrations in "+format+" format ("+strconv.Itoa(len(want))+" files), for schema orders_q.") {
			t.Fatalf("%s: preamble:\n%.400s", format, printed)
		}
		dir := filepath.Join(t.TempDir(), format)
		c.ok("migrate", "sql", "--format", format, "--dir", dir)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			text := string(b)
			if !strings.Contains(printed, "\n-- ==> "+e.Name()+" <==\n"+text) {
				t.Fatalf("%s: the printed output lacks %s as written", format, e.Name())
			}
			if !strings.Contains(text, "hashtext('orders_q')") || !strings.Contains(text, `set_config('search_path', '"orders_q"', true)`) {
				t.Fatalf("%s: %s does not target schema orders_q:\n%s", format, e.Name(), text)
			}
			if format == "goose" && (strings.Count(text, "-- +goose Up\n") != 1 || strings.Count(text, "-- +goose Down\n") != 1 ||
				strings.Count(text, "-- +goose StatementBegin\n") != 2 || strings.Count(text, "-- +goose StatementEnd\n") != 2) {
				t.Fatalf("%s: annotations:\n%s", e.Name(), text)
			}
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: wrote %v, want %v", format, got, want)
		}
		// What the tool tests run (they take sqlFiles in-process).
		files, err := sqlFiles(format, c.schema)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if b, err := os.ReadFile(filepath.Join(dir, f.Name)); err != nil || string(b) != f.Text {
				t.Fatalf("%s: %s differs from sqlFiles's (%v)", format, f.Name, err)
			}
		}
	}
	c.fail(2, "--format must be golang-migrate or goose", "migrate", "sql", "--format", "flyway")
	bad := &cli{t: t, schema: "orders-q"}
	bad.fail(2, "not a plain identifier", "migrate", "sql")
}

// TestMigrateToolsFromEachVersion: with goose, golang-migrate sharing
// backlog's version table and golang-migrate with its own: each tool runs
// every file from an empty schema; then, from every version N (-short:
// the first and the last two), the files an older release exported (up
// to N) are applied by a tool and the rest by the tool again or by
// `backlog migrate up` (tool and finisher rotate with N, so that every
// pair comes up: running the cross product takes minutes on two cores).
// At each step backlog sees the version and who migrated the schema, the
// tool's own table is reported, `migrate up` applies exactly the missing
// migrations, the tool's next run only records what backlog applied, and
// the schema ends the same as backlog's own migrate makes it, with New,
// Migrate (a no-op) and Work running a job on it.
func TestMigrateToolsFromEachVersion(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	n := len(ms)
	latest := ms[n-1].Version
	type run struct {
		r        toolRun
		k        int
		finisher string
	}
	var runs []run
	for _, r := range toolRuns {
		runs = append(runs, run{r, 0, "tool"})
	}
	for k := 1; k <= n; k++ {
		if testing.Short() && k > 1 && k < n-1 {
			continue
		}
		finisher := "tool"
		if k%2 == 1 && k < n {
			finisher = "backlog"
		}
		runs = append(runs, run{toolRuns[k%len(toolRuns)], k, finisher})
	}
	for _, run := range runs {
		r, k, finisher := run.r, run.k, run.finisher
		t.Run(fmt.Sprintf("%s/from%d/%s", r.name, k, finisher), func(t *testing.T) {
			t.Parallel()
			c := newCLI(t)
			createSchema(c)
			var vk int64
			if k > 0 {
				vk = ms[k-1].Version
				r.up2(c, r.export(c, vk))
				r.status(c, vk, r.format, n-k, vk)
				if k < n {
					_, err := c.lib().Enqueue(context.Background(), "t", nil)
					if !errors.Is(err, backlog.ErrNotMigrated) {
						t.Fatalf("enqueue at version %d: %v", vk, err)
					}
				}
			}
			full := r.export(c, latest)
			switch finisher {
			case "tool":
				r.up2(c, full)
				r.status(c, latest, r.format, 0, latest)
			case "backlog":
				var res struct {
					Version int64    `json:"version"`
					Applied []string `json:"applied"`
				}
				c.json(&res, "migrate", "up")
				var want []string
				for _, m := range ms[k:] {
					want = append(want, fmt.Sprintf("%04d_%s", m.Version, m.Name))
				}
				if res.Version != latest || !slices.Equal(res.Applied, want) {
					t.Fatalf("migrate up applied %v to version %d, want %v to %d", res.Applied, res.Version, want, latest)
				}
				r.status(c, latest, "backlog", 0, r.sharedOr(vk, latest))
				// The tool's next run records what backlog applied,
				// without running it (it would fail: relations exist).
				r.up2(c, full)
				r.status(c, latest, "backlog", 0, latest)
			}
			if v := r.version(c, full); v != latest {
				t.Fatalf("%s's own version: %d, want %d", r.format, v, latest)
			}
			if out := c.ok("migrate", "up"); !strings.Contains(out, "up to date") {
				t.Fatalf("migrate up on the migrated schema: %s", out)
			}
			sameSchema(c)
			runsJobs(c)
		})
	}
}

// up2 runs the tool's up, failing the test on error.
func (r toolRun) up2(c *cli, dir string) {
	c.t.Helper()
	if err := r.up(c, dir); err != nil {
		c.t.Fatalf("%s up: %v", r.name, err)
	}
}

// sharedOr is the tool's version after backlog applied up to latest on a
// schema the tool had taken to vk: latest when it shares backlog's table.
func (r toolRun) sharedOr(vk, latest int64) int64 {
	if r.format == "golang-migrate" && r.table == "" {
		return latest
	}
	return vk
}

// TestMigrateToolsHandOver: a schema backlog migrated (to the first and
// to the newest version) handed to the tool: its files skip what
// backlog applied, apply the rest, and the tool's own table ends at the
// newest version.
func TestMigrateToolsHandOver(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	n := len(ms)
	latest := ms[n-1].Version
	for _, r := range toolRuns {
		for _, k := range []int{1, n} {
			t.Run(fmt.Sprintf("%s/at%d", r.name, k), func(t *testing.T) {
				t.Parallel()
				c := newCLI(t)
				c.ok("migrate", "up")
				if k < n {
					c.ok("migrate", "down", strconv.Itoa(n-k), "--yes")
				}
				st, err := c.lib().MigrationStatus(context.Background())
				if err != nil || st.Version != ms[k-1].Version || st.MigratedBy != "backlog" {
					t.Fatalf("backlog at %d: %+v %v", ms[k-1].Version, st, err)
				}
				dir := r.export(c, latest)
				r.up2(c, dir)
				by := r.format
				if k == n {
					by = "backlog" // the tool only recorded
				}
				r.status(c, latest, by, 0, latest)
				if v := r.version(c, dir); v != latest {
					t.Fatalf("%s's own version: %d", r.format, v)
				}
				sameSchema(c)
				runsJobs(c)
			})
		}
	}
}

// TestMigrateToolsDown: the tools' down migrations revert one step and
// record it; a down the tool asks for while backlog has applied a newer
// migration is refused; every step down leaves only the version tables,
// and backlog's migrate up then makes a working queue again. The CLI's
// status says who migrated the schema and where the tool's table stands.
func TestMigrateToolsDown(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	n := len(ms)
	latest, prev := ms[n-1].Version, ms[n-2].Version
	for _, r := range toolRuns {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			c := newCLI(t)
			createSchema(c)
			dir := r.export(c, latest)
			r.up2(c, dir)
			if err := r.downOne(c, dir); err != nil {
				t.Fatalf("%s down: %v", r.name, err)
			}
			r.status(c, prev, r.format, 1, prev)
			c.fail(1, fmt.Sprintf("schema %s is at version %d of %d; run `backlog --schema %s migrate up`", c.schema, prev, latest, c.schema), "stats")
			c.ok("migrate", "up")
			r.status(c, latest, "backlog", 0, r.sharedOr(prev, latest))
			if r.sharedOr(prev, latest) == prev {
				out := c.ok("migrate", "status")
				want := fmt.Sprintf("schema %s: version %d, migrated by backlog, 0 pending\n%s's table %s: version %d (behind backlog's %d: ",
					c.schema, latest, r.format, r.versionTable(), prev, latest)
				if !strings.HasPrefix(out, want) {
					t.Fatalf("migrate status:\n%s\nwant it to start\n%s", out, want)
				}
				// The tool believes prev is the newest: reverting it now
				// would leave latest's objects over a missing prev.
				err := r.downOne(c, dir)
				if err == nil || !strings.Contains(err.Error(), "revert the newer migrations") {
					t.Fatalf("%s down behind backlog: %v", r.name, err)
				}
				if r.format == "golang-migrate" {
					// A failed migration leaves golang-migrate's version
					// dirty (at the one before prev), as any failure does:
					// it is told where it was, and catches up.
					if err := r.golangMigrate(c, dir).Force(int(prev)); err != nil {
						t.Fatal(err)
					}
				}
				r.status(c, latest, "backlog", 0, prev)
				r.up2(c, dir)
				r.status(c, latest, "backlog", 0, latest)
			}
			if err := r.downAll(c, dir); err != nil {
				t.Fatalf("%s down all: %v", r.name, err)
			}
			r.status(c, 0, r.format, n, 0)
			var st statusJSON
			c.json(&st, "migrate", "status")
			if st.Version != 0 || st.MigratedBy != r.format || st.Pending != n {
				t.Fatalf("migrate status after %s down all: %+v", r.name, st)
			}
			if got, _ := dumpSchema(c.schema); got != "" {
				t.Fatalf("left after %s down all:\n%s", r.name, got)
			}
			c.ok("migrate", "up")
			sameSchema(c)
			runsJobs(c)
		})
	}
}

// TestMigrateToolsOldExport: a schema goose or golang-migrate (with its own
// table) migrated from files exported before they recorded backlog's
// version (the migrations as they are) has only the tool's table: backlog
// takes its version from there, says who migrated it, and migrate up
// applies only what is missing and records the version; files exported
// now take over from there.
func TestMigrateToolsOldExport(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	n := len(ms)
	latest := ms[n-1].Version
	for _, r := range []toolRun{toolRuns[0], toolRuns[2]} {
		for _, k := range []int{n - 1, n} {
			t.Run(fmt.Sprintf("%s/%d", r.name, k), func(t *testing.T) {
				t.Parallel()
				c := newCLI(t)
				createSchema(c)
				dir := t.TempDir()
				for _, m := range ms[:k] {
					base := filepath.Join(dir, fmt.Sprintf("%04d_%s", m.Version, m.Name))
					var err error
					if r.format == "goose" {
						err = os.WriteFile(base+".sql", []byte("-- +goose Up\n-- +goose StatementBegin\n"+m.SQL+
							"\n-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n"+m.Down+"\n-- +goose StatementEnd\n"), 0o644)
					} else {
						err = os.WriteFile(base+".up.sql", []byte(m.SQL), 0o644)
						if err == nil {
							err = os.WriteFile(base+".down.sql", []byte(m.Down), 0o644)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				r.up2(c, dir)
				vk := ms[k-1].Version
				r.status(c, vk, r.format, n-k, vk)
				var res struct {
					Applied []string `json:"applied"`
				}
				c.json(&res, "migrate", "up")
				if len(res.Applied) != n-k {
					t.Fatalf("migrate up applied %v, want the %d missing", res.Applied, n-k)
				}
				by := r.format
				if k < n {
					by = "backlog"
				}
				r.status(c, latest, by, 0, vk)
				runsJobs(c)
				r.up2(c, r.export(c, latest))
				r.status(c, latest, by, 0, latest)
			})
		}
	}
}

// TestMigrateToolsOtherSearchPath: the files target the schema they were
// exported for, whatever the tool's connection's search_path (here
// another schema, which keeps goose's table): the queue's tables and
// functions are those backlog's own migrate makes, and goose's own writes
// after each file still find its table (the files restore search_path).
func TestMigrateToolsOtherSearchPath(t *testing.T) {
	t.Parallel()
	ms := embedded(t)
	latest := ms[len(ms)-1].Version
	c := newCLI(t)
	other := newCLI(t).schema
	createSchema(&cli{t: t, schema: other})
	r := toolRun{name: "goose", format: "goose", searchPath: other}
	dir := r.export(c, latest)
	r.up2(c, dir)
	st, err := c.lib().MigrationStatus(context.Background())
	if err != nil || st.Version != latest || st.MigratedBy != "goose" || len(st.Tools) != 0 {
		t.Fatalf("status: %+v %v", st, err)
	}
	if v := r.version(c, dir); v != latest {
		t.Fatalf("goose's version: %d", v)
	}
	sameSchema(c)
	runsJobs(c)
}
