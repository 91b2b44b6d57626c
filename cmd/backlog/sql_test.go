package main

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/backlogq/backlog/migrations"
)

func TestSplitSQL(t *testing.T) {
	t.Parallel()
	in := `-- lead; comment
CREATE TABLE a (x text DEFAULT 'semi;colon', "we;ird" int); /* block; /* nested; */ still; */
INSERT INTO a VALUES (E'it\'s; here', 1);
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END; $$;
DO $body$ BEGIN PERFORM 1; END $body$;
SELECT $1::int;
-- trailing; comment
`
	got := splitSQL(in)
	want := []string{
		"-- lead; comment\nCREATE TABLE a (x text DEFAULT 'semi;colon', \"we;ird\" int);",
		"/* block; /* nested; */ still; */\nINSERT INTO a VALUES (E'it\\'s; here', 1);",
		"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END; $$;",
		"DO $body$ BEGIN PERFORM 1; END $body$;",
		"SELECT $1::int;",
		"-- trailing; comment",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("splitSQL:\n%q\nwant\n%q", got, want)
	}
}

// gooseParse parses a goose migration file as goose's parser
// (internal/sqlparser) does: annotations at the start of a line; leading
// comments and blank lines skipped; outside StatementBegin/End a
// statement ends at a line whose last word before "--" ends with ";".
// It returns the Up and Down statements, or why goose would refuse the
// file.
func gooseParse(text string) (up, down []string, err error) {
	const (
		start = iota
		inUp
		inDown
	)
	state, block := start, false
	var buf strings.Builder
	flush := func() {
		st := strings.TrimSpace(buf.String())
		buf.Reset()
		if state == inUp {
			up = append(up, st)
		} else {
			down = append(down, st)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if state == start && strings.TrimSpace(line) == "" {
			continue
		}
		if strings.HasPrefix(line, "--") {
			switch strings.TrimSpace(strings.TrimPrefix(line, "--")) {
			case "+goose Up":
				if state != start {
					return nil, nil, fmt.Errorf("duplicate Up")
				}
				state = inUp
				continue
			case "+goose Down":
				if state != inUp || block {
					return nil, nil, fmt.Errorf("Down not after Up, or inside a statement block")
				}
				if strings.TrimSpace(buf.String()) != "" {
					return nil, nil, fmt.Errorf("unfinished Up statement: %q", buf.String())
				}
				state = inDown
				continue
			case "+goose StatementBegin":
				if state == start || block {
					return nil, nil, fmt.Errorf("StatementBegin outside a section or nested")
				}
				if strings.TrimSpace(buf.String()) != "" {
					return nil, nil, fmt.Errorf("StatementBegin inside an unfinished statement: %q", buf.String())
				}
				block = true
				continue
			case "+goose StatementEnd":
				if !block {
					return nil, nil, fmt.Errorf("StatementEnd without StatementBegin")
				}
				block = false
				flush()
				continue
			}
		}
		if state == start {
			return nil, nil, fmt.Errorf("SQL before '-- +goose Up': %q", line)
		}
		if buf.Len() == 0 && (strings.HasPrefix(strings.TrimSpace(line), "--") || line == "") {
			continue
		}
		buf.WriteString(line + "\n")
		if !block && gooseEndsStatement(line) {
			flush()
		}
	}
	switch {
	case state == start:
		return nil, nil, fmt.Errorf("no '-- +goose Up'")
	case block:
		return nil, nil, fmt.Errorf("missing StatementEnd")
	case strings.TrimSpace(buf.String()) != "":
		return nil, nil, fmt.Errorf("unfinished statement: %q", buf.String())
	}
	return up, down, nil
}

// TestMigrateSQLGolangMigrate: the files as they are, printed after
// headers or written to --dir.
func TestMigrateSQLGolangMigrate(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, schema: "unused"}
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v %v", files, err)
	}
	out := c.ok("migrate", "sql")
	if !strings.HasPrefix(out, "-- backlog's migrations in golang-migrate format") {
		t.Fatalf("no preamble:\n%.300s", out)
	}
	for _, f := range files {
		body, _ := fs.ReadFile(migrations.FS, f)
		if !strings.Contains(out, "\n-- ==> "+f+" <==\n"+string(body)) {
			t.Fatalf("the output lacks %s as it is", f)
		}
	}
	dir := filepath.Join(t.TempDir(), "m")
	var res struct {
		Files []string `json:"files"`
	}
	c.json(&res, "migrate", "sql", "--format", "golang-migrate", "--dir", dir)
	if len(res.Files) != len(files) {
		t.Fatalf("wrote %v, want %d files", res.Files, len(files))
	}
	for _, f := range files {
		want, _ := fs.ReadFile(migrations.FS, f)
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || string(got) != string(want) {
			t.Fatalf("%s differs from migrations.FS (%v)", f, err)
		}
	}
}

// TestMigrateSQLGoose: the goose files parse as goose parses them, each
// statement whole, and applying them statement by statement (as goose
// does) makes a schema the CLI works with; the down statements undo it.
func TestMigrateSQLGoose(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	dir := t.TempDir()
	printed := c.ok("migrate", "sql", "--format", "goose")
	c.ok("migrate", "sql", "--format", "goose", "--dir", dir)
	names, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil || len(names) == 0 {
		t.Fatalf("goose files: %v %v", names, err)
	}
	slices.Sort(names)
	ups, _ := fs.Glob(migrations.FS, "*.up.sql")
	if len(names) != len(ups) {
		t.Fatalf("%d goose files for %d migrations", len(names), len(ups))
	}
	ctx := context.Background()
	_, err = pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{c.schema}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	apply := func(stmts []string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{c.schema}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		for _, st := range stmts {
			if _, err := tx.Exec(ctx, st); err != nil {
				t.Fatalf("%v\n%s", err, st)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var downs [][]string
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if !strings.Contains(printed, "\n-- ==> "+filepath.Base(name)+" <==\n"+text) {
			t.Fatalf("the printed output lacks %s", filepath.Base(name))
		}
		if strings.Count(text, "-- +goose Up\n") != 1 || strings.Count(text, "-- +goose Down\n") != 1 ||
			strings.Count(text, "-- +goose StatementBegin\n") != strings.Count(text, "-- +goose StatementEnd\n") {
			t.Fatalf("%s: annotations do not balance", name)
		}
		up, down, err := gooseParse(text)
		if err != nil {
			t.Fatalf("%s: goose would refuse it: %v", name, err)
		}
		if len(up) == 0 || len(down) == 0 {
			t.Fatalf("%s: %d up and %d down statements", name, len(up), len(down))
		}
		for _, st := range slices.Concat(up, down) {
			if n := len(splitSQL(st)); n != 1 {
				t.Fatalf("%s: goose would send %d statements as one:\n%s", name, n, st)
			}
		}
		apply(up)
		downs = append(downs, down)
	}
	// Tell backlog the version, as golang-migrate's table would.
	newest := strings.SplitN(filepath.Base(names[len(names)-1]), "_", 2)[0]
	apply([]string{`CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)`,
		`INSERT INTO schema_migrations VALUES (` + strings.TrimLeft(newest, "0") + `, false)`})
	id := strings.TrimSpace(c.ok("enqueue", "t", `{"via":"goose"}`))
	var job jobJSON
	c.json(&job, "show", id)
	if job.Type != "t" {
		t.Fatalf("job: %+v", job)
	}
	for i := len(downs) - 1; i >= 0; i-- {
		apply(downs[i])
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1`, c.schema)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(left, []string{"schema_migrations"}) {
		t.Fatalf("left after the down statements: %v %v", left, err)
	}
	var printedJSON struct {
		Format string `json:"format"`
		Files  []struct {
			Name string `json:"name"`
			SQL  string `json:"sql"`
		} `json:"files"`
	}
	c.json(&printedJSON, "migrate", "sql", "--format", "goose")
	if printedJSON.Format != "goose" || len(printedJSON.Files) != len(names) {
		t.Fatalf("--json: %s, %d files", printedJSON.Format, len(printedJSON.Files))
	}
}
