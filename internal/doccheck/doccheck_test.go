package doccheck

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// repoRoot is the repository (and library module) root.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	return root
}

// docFiles are the checked Markdown files: README.md and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	return append([]string{filepath.Join(root, "README.md")}, files...)
}

// TestDocsCompile: every Go block of README.md and docs/*.md compiles (and
// passes go vet), in one generated module.
func TestDocsCompile(t *testing.T) {
	t.Parallel()
	var blocks []Block
	for _, f := range docFiles(t) {
		bs, err := Extract(f)
		require.NoError(t, err)
		blocks = append(blocks, bs...)
	}
	require.NotEmpty(t, blocks)
	dir := t.TempDir()
	_, err := Module(dir, repoRoot(t), blocks)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, Vet(dir))
	t.Logf("%d blocks compiled and vetted in %s", len(blocks), time.Since(start).Round(time.Millisecond))
}

// TestBrokenBlockFails: a block that does not compile fails the check, and
// the error names its Markdown file and line.
func TestBrokenBlockFails(t *testing.T) {
	t.Parallel()
	blocks, err := Extract("testdata/broken.md")
	require.NoError(t, err)
	require.Len(t, blocks, 3)
	dir := t.TempDir()
	_, err = Module(dir, repoRoot(t), blocks)
	require.NoError(t, err)
	err = Vet(dir)
	require.Error(t, err)
	// The good blocks pass; each broken one is reported at its own line.
	require.Regexp(t, regexp.MustCompile(`broken\.md:12(:\d+)?: undefined: backlog\.EnqueueSomehow`), err.Error())
	require.Regexp(t, regexp.MustCompile(`broken\.md:20(:\d+)?: declared and not used: unused`), err.Error())
	require.NotContains(t, err.Error(), "broken.md:28")
}

// TestUnclassifiedBlockFails: a block without a package clause or a
// marker, a marker before nothing, a marker of an unknown kind and a
// marker that does not fit its block are errors, not skipped blocks.
func TestUnclassifiedBlockFails(t *testing.T) {
	t.Parallel()
	_, err := Extract("testdata/unmarked.md")
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{
		"unmarked.md:5: a go block with no package clause and no doccheck marker",
		"unmarked.md:9: doccheck marker not followed by a ```go block",
		`unmarked.md:13: unknown doccheck marker "snippet"`,
		`unmarked.md:18: doccheck marker "fragment" does not fit this block (package clause: true)`,
	} {
		require.Contains(t, msg, want)
	}
}

// TestFragmentWrapping: a fragment gets the Env names it uses as
// parameters, the imports it uses, and its top-level variables count as
// used.
func TestFragmentWrapping(t *testing.T) {
	t.Parallel()
	src, err := Source(Block{File: "x.md", Line: 3, Kind: KindFragment,
		Code: "id2, err := q.Enqueue(ctx, \"a\", nil, backlog.Delay(time.Second))\nif err != nil {\n\treturn err\n}\n"}, "p")
	require.NoError(t, err)
	require.Contains(t, src, `"github.com/backlogq/backlog"`)
	require.Contains(t, src, `"time"`)
	require.Contains(t, src, "func _(ctx context.Context, q *backlog.Queue) error {")
	require.Contains(t, src, "_ = err\n\t_ = id2\n")
	require.Contains(t, src, "//line "+abs("x.md")+":3\n")
}

// TestQuickstartRuns: the README's quickstart, a whole program marked
// "run", runs as written against a fresh, empty database and exits 0
// after its job completed (its last line: "job <id> completed").
func TestQuickstartRuns(t *testing.T) {
	t.Parallel()
	blocks, err := Extract(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	var run []Block
	for _, b := range blocks {
		if b.Kind == KindRun {
			run = append(run, b)
		}
	}
	require.Len(t, run, 1, "the README has one quickstart marked <!-- doccheck: run -->")

	dir := t.TempDir()
	dirs, err := Module(dir, repoRoot(t), run)
	require.NoError(t, err)
	bin := filepath.Join(dir, "quickstart")
	build := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(dirs[0]))
	build.Dir = dir
	build.Env = GoEnv()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	dbURL := freshDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	// The quickstart's last line says that its job completed.
	require.Regexp(t, `job [0-9a-f-]{36} completed\n$`, stdout.String())
}

// freshDatabase creates an empty database for one test, dropped at its
// end, and returns its URL.
func freshDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t)
	name := strings.ReplaceAll(testdb.Schema(t), "-", "_") + "_db"
	_, err := pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// TestDocLinks: every relative link of README.md, CHANGELOG.md and
// docs/*.md points at a file or directory of the repository, and every
// #anchor at a heading of the file it names.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	files := append(docFiles(t), filepath.Join(root, "CHANGELOG.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	var bad []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		inCode := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inCode = !inCode
			}
			if inCode {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if strings.ContainsAny(target, " ,\"") || !strings.ContainsAny(target, "/.#") {
					continue // Go code in prose such as [T](ctx, job)
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), path)
					if _, err := os.Stat(dest); err != nil {
						bad = append(bad, fmt.Sprintf("%s:%d: %s: no such file", rel(root, f), i+1, target))
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[anchor] {
					bad = append(bad, fmt.Sprintf("%s:%d: %s: no heading with that anchor", rel(root, f), i+1, target))
				}
			}
		}
	}
	// The package doc's links to the guides name files of the repository.
	b, err := os.ReadFile(filepath.Join(root, "doc.go"))
	require.NoError(t, err)
	guides := regexp.MustCompile(`https://github\.com/backlogq/backlog/blob/main/(\S+)`).FindAllStringSubmatch(string(b), -1)
	require.NotEmpty(t, guides, "doc.go links to the guides")
	for _, m := range guides {
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			bad = append(bad, fmt.Sprintf("doc.go: %s: no such file", m[0]))
		}
	}
	require.Empty(t, bad)
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}

// anchors returns the anchors GitHub gives the headings of a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var s strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				s.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				s.WriteRune(r)
			}
		}
		out[s.String()] = true
	}
	return out
}
