package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// The tests run the real binary, built once, against a real PostgreSQL
// ($DATABASE_URL, else defaultURL), each in a schema of its own.

const defaultURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

var (
	binary string // the built backlog command
	dbURL  string
	pool   *pgxpool.Pool
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dbURL = os.Getenv("DATABASE_URL")
	if dbURL == "" {
		dbURL = defaultURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err == nil {
		cfg.MaxConns = 16 // tests run in parallel; Work and Wait hold connections
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err == nil {
			err = pool.Ping(ctx)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cmd/backlog tests: SKIPPING EVERY TEST: no PostgreSQL at $DATABASE_URL or %s (%v); `make test` finds or starts one\n", defaultURL, err)
		if os.Getenv("BACKLOG_CI") != "" || os.Getenv("CI") != "" {
			return 1
		}
		return 0
	}
	defer pool.Close()
	dir, err := os.MkdirTemp("", "backlog-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "backlog")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building the backlog command: %v\n", err)
		return 1
	}
	return m.Run()
}

// cli runs the binary on one test's schema.
type cli struct {
	t      *testing.T
	schema string
	stdin  string
	q      *backlog.Queue // see lib
}

// newCLI returns a CLI on a fresh schema (not migrated), dropped when the
// test ends.
func newCLI(t *testing.T) *cli {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "cli_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return &cli{t: t, schema: schema}
}

// migrated returns a CLI on a fresh migrated schema.
func migrated(t *testing.T) *cli {
	c := newCLI(t)
	c.ok("migrate", "up")
	return c
}

// run runs the binary with --schema and DATABASE_URL set.
func (c *cli) run(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	return c.runEnv([]string{"DATABASE_URL=" + dbURL}, append([]string{"--schema", c.schema}, args...)...)
}

func (c *cli) runEnv(env []string, args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(c.stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			c.t.Fatalf("running backlog %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("backlog %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errs)
	}
	if errs != "" {
		c.t.Fatalf("backlog %s: unexpected stderr:\n%s", strings.Join(args, " "), errs)
	}
	return out
}

// json runs a command with --json that must succeed and decodes its output.
func (c *cli) json(v any, args ...string) {
	c.t.Helper()
	out := c.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("backlog %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// fail runs a command that must exit with code and print one error line
// on stderr containing want.
func (c *cli) fail(code int, want string, args ...string) string {
	c.t.Helper()
	out, errs, got := c.run(args...)
	c.checkFail(args, out, errs, got, code, want)
	return out
}

func (c *cli) checkFail(args []string, out, errs string, got, code int, want string) {
	c.t.Helper()
	if got != code {
		c.t.Fatalf("backlog %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), got, code, out, errs)
	}
	first, _, _ := strings.Cut(errs, "\n")
	if !strings.HasPrefix(first, "backlog: ") || !strings.Contains(first, want) {
		c.t.Fatalf("backlog %s: stderr's first line %q does not name %q\nstderr:\n%s", strings.Join(args, " "), first, want, errs)
	}
}

// queue opens the library on the CLI's schema, for what the CLI cannot do
// (run workers).
func (c *cli) queue(opts ...backlog.Option) *backlog.Queue {
	c.t.Helper()
	q, err := backlog.New(context.Background(), pool, append([]backlog.Option{backlog.WithSchema(c.schema),
		backlog.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = q.Close() })
	return q
}

var (
	idRE   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
)

// normalize replaces IDs and times with placeholders of the same width,
// so that the table stays aligned.
func normalize(s string) string {
	s = idRE.ReplaceAllString(s, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
	return timeRE.ReplaceAllString(s, "YYYY-MM-DDTHH:MM:SSZ")
}

// golden compares normalized output with want.
func golden(t *testing.T, got, want string) {
	t.Helper()
	got = normalize(got)
	want = strings.TrimPrefix(want, "\n")
	if got != want {
		t.Fatalf("output differs\n--- got:\n%s\n--- want:\n%s", got, want)
	}
}
