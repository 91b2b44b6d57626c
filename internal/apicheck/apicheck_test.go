package apicheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAPIRecord: api/backlog.txt and api/otelbacklog.txt are the exported
// API of the source as it is, written with CHANGELOG.md's Unreleased
// section as it is (see the package doc for the two rules).
func TestAPIRecord(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.NoError(t, Check(root, Modules))
}

// TestGenerateIsDeterministic: two runs give the same record, and it holds
// the declarations of every public package and none of the internal ones.
func TestGenerateIsDeterministic(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	a, err := Generate(root)
	require.NoError(t, err)
	b, err := Generate(root)
	require.NoError(t, err)
	require.Equal(t, a, b)
	for _, want := range []string{
		"package github.com/backlogq/backlog\n",
		"package github.com/backlogq/backlog/backlogtest\n",
		"package github.com/backlogq/backlog/backlogui\n",
		"func New(context.Context, *pgxpool.Pool, ...Option) (*Queue, error)",
		"func (*Queue) Enqueue(context.Context, string, any, ...EnqueueOption) (uuid.UUID, error)",
	} {
		require.Contains(t, a, want)
	}
	require.NotContains(t, a, "/internal/")
	require.NotContains(t, a, "package github.com/backlogq/backlog/examples/")
	require.NotContains(t, a, "Work runs jobs with h", "doc comments are left out")
	require.Contains(t, a, "func HandleJSON[T any](func(context.Context, *Job, T) error) Handler", "no parameter names")
	require.Contains(t, a, "type Job struct {\n\tID uuid.UUID\n\tType string\n", "no alignment that depends on comments")
	require.NotContains(t, a, "otelbacklog", "a module of its own, recorded apart")

	// otelbacklog, a module of its own, has its own record.
	o, err := Generate(filepath.Join(root, "otelbacklog"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(o, "package github.com/backlogq/backlog/otelbacklog\n"), o)
	require.Contains(t, o, "func New(...Option) (*Instrumentation, error)")
	require.Contains(t, o, "func (*Instrumentation) Hooks() backlog.Hooks")
	require.NotContains(t, o, "otelbacklog/example", "a command")
}

// fakeRepo is a module with one public package and a changelog, in a
// temporary directory, and a module of its own under sub/ (its record:
// api/sub.txt).
func fakeRepo(t *testing.T, api, unreleased string) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("go.mod", "module example.invalid/lib\n\ngo 1.26\n")
	write("lib.go", "// Package lib is a library.\npackage lib\n\n"+api)
	write("internal/x/x.go", "package x\n\n// Hidden is internal.\nfunc Hidden() {}\n")
	write("sub/go.mod", "module example.invalid/lib/sub\n\ngo 1.26\n")
	write("sub/sub.go", "// Package sub is a module of its own.\npackage sub\n\n// S is s.\nfunc S() {}\n")
	write(ChangelogPath, "# Changelog\n\n## Unreleased\n\n"+unreleased+"\n\n## History\n\n- old\n")
	return dir
}

// TestUpdateNeedsAChangelogEntry: make api refuses to record an API
// change while the Unreleased section is what it was when the record was
// written, and records it once the section changed; the check fails on
// an unrecorded change and on an Unreleased section edited after the
// record.
func TestUpdateNeedsAChangelogEntry(t *testing.T) {
	t.Parallel()
	dir := fakeRepo(t, "// A is a.\nfunc A(n int) error { return nil }\n", "- A")
	const record = "api/backlog.txt"
	mods := []Module{{Dir: ".", Record: record}, {Dir: "sub", Record: "api/sub.txt"}}
	wrote, err := Update(dir, mods)
	require.NoError(t, err)
	require.Equal(t, []string{record, "api/sub.txt"}, wrote)
	require.NoError(t, Check(dir, mods))
	rec, err := os.ReadFile(filepath.Join(dir, record))
	require.NoError(t, err)
	require.Contains(t, string(rec), "# The exported API of the public packages of example.invalid/lib:\n")
	require.Contains(t, string(rec), "package example.invalid/lib\n\nfunc A(int) error\n")
	require.NotContains(t, string(rec), "Hidden")
	require.NotContains(t, string(rec), "func S()", "sub/ is a module of its own")
	sub, err := os.ReadFile(filepath.Join(dir, "api/sub.txt"))
	require.NoError(t, err)
	require.Contains(t, string(sub), "# The exported API of the public packages of example.invalid/lib/sub:\n")
	require.Contains(t, string(sub), "package example.invalid/lib/sub\n\nfunc S()\n")

	// Nothing changed: nothing written.
	wrote, err = Update(dir, mods)
	require.NoError(t, err)
	require.Empty(t, wrote)

	// A change to the other module's API is caught the same way.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub/sub.go"), []byte("package sub\n\n// S is s.\nfunc S(int) {}\n"), 0o644))
	err = Check(dir, mods)
	require.ErrorContains(t, err, "the exported API differs from api/sub.txt")
	require.ErrorContains(t, err, "+ example.invalid/lib/sub: func S(int)")
	_, err = Update(dir, mods)
	require.ErrorContains(t, err, "did not since api/sub.txt was last written")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub/sub.go"), []byte("// Package sub is a module of its own.\npackage sub\n\n// S is s.\nfunc S() {}\n"), 0o644))
	require.NoError(t, Check(dir, mods))

	// An API change without a changelog entry: the check fails, and
	// make api refuses.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lib.go"),
		[]byte("package lib\n\n// A is a.\nfunc A(n int) error { return nil }\n\n// B is new.\nfunc B() {}\n"), 0o644))
	err = Check(dir, mods)
	require.ErrorContains(t, err, "the exported API differs")
	require.ErrorContains(t, err, "+ example.invalid/lib: func B()")
	_, err = Update(dir, mods)
	require.ErrorContains(t, err, "did not since api/backlog.txt was last written")

	// With an entry, it is recorded.
	cl := filepath.Join(dir, ChangelogPath)
	b, err := os.ReadFile(cl)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cl, []byte(strings.Replace(string(b), "- A\n", "- A\n- B\n", 1)), 0o644))
	wrote, err = Update(dir, mods)
	require.NoError(t, err)
	require.Equal(t, []string{record, "api/sub.txt"}, wrote, "both hold the section's hash")
	require.NoError(t, Check(dir, mods))

	// An Unreleased section edited after the record: make api again.
	b, err = os.ReadFile(cl)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cl, []byte(strings.Replace(string(b), "- B\n", "- B, documented\n", 1)), 0o644))
	require.ErrorContains(t, Check(dir, mods), "Unreleased section changed")
	// A change below Unreleased does not count.
	require.NoError(t, os.WriteFile(cl, []byte(strings.Replace(string(b), "- old", "- older", 1)), 0o644))
	require.NoError(t, Check(dir, mods))

	// A record edited by hand is caught by its hash.
	rec, err = os.ReadFile(filepath.Join(dir, record))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, record), []byte(strings.Replace(string(rec), "func B()", "func B() int", 1)), 0o644))
	require.ErrorContains(t, Check(dir, mods), "edited by hand")
}

func TestUnreleased(t *testing.T) {
	t.Parallel()
	s, err := Unreleased([]byte("# C\n\n## Unreleased\n\n- a  \n- b\n\n## 0.1\n- c\n"))
	require.NoError(t, err)
	require.Equal(t, "- a\n- b", s)
	_, err = Unreleased([]byte("# C\n\n## 0.1\n"))
	require.Error(t, err)
}
