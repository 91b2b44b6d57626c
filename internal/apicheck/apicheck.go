// Package apicheck keeps a record of the exported API of the repository's
// published modules ([Modules]: the library in api/backlog.txt, otelbacklog
// in api/otelbacklog.txt), so that an API change is always a deliberate
// one, announced in CHANGELOG.md.
//
// A record lists every exported declaration of every public package of
// its module (not under internal/, not a command) as Go source without
// doc comments, function bodies or parameter names, sorted as go/doc sorts
// them: the same source always gives the same record. The source is
// parsed, not type-checked, so recording a module needs none of its
// dependencies: the library's tests check otelbacklog's record without
// the OpenTelemetry modules. A record's header holds two hashes: that of
// the declarations below it, and that of the text of CHANGELOG.md's
// "## Unreleased" section when the record was written.
//
// Two rules follow, for each record (TestAPIRecord checks them in `make
// test`):
//
//   - The record is current: regenerated from the source, it is what is
//     committed. An API change without `make api` fails.
//   - The record changes only with the Unreleased section: [Update] (run by
//     `make api`) refuses to write a record whose declarations changed
//     while the Unreleased section has the text the record was last
//     written with. So an API change cannot be recorded without a
//     CHANGELOG entry, and because the test also wants the stored hash to
//     match the section as it is, the check needs no git history.
//
// Editing the Unreleased section for any reason means running `make api`
// again (it then only updates the hashes).
package apicheck

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// ChangelogPath is relative to the repository root.
const ChangelogPath = "CHANGELOG.md"

// A Module is a module of the repository whose exported API is recorded.
type Module struct {
	Dir    string // the module's directory (holding its go.mod), relative to the repository root
	Record string // its record, relative to the repository root
}

// Modules are the recorded modules: the library, and otelbacklog, a
// module of its own (so that the library never depends on OpenTelemetry)
// whose API the compatibility promise covers too. cmd/backlog is a
// command: its API is its flags, not Go declarations.
var Modules = []Module{
	{Dir: ".", Record: "api/backlog.txt"},
	{Dir: "otelbacklog", Record: "api/otelbacklog.txt"},
}

func header(module string) string {
	return `# The exported API of the public packages of ` + module + `:
# every exported declaration, without doc comments, bodies or parameter
# names. Written by ` + "`make api`" + ` (internal/apicheck); checked by its
# TestAPIRecord in make test. Do not edit by hand: see docs/compatibility.md.
#
`
}

// goList runs `go list` with args in dir and returns its output.
func goList(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("go list: %w\n%s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("go list: %w", err)
	}
	return out, nil
}

// modulePath returns the path of the module in dir.
func modulePath(dir string) (string, error) {
	out, err := goList(dir, "-m", "-f", "{{.Path}}")
	return strings.TrimSpace(string(out)), err
}

// Packages returns the import paths and directories of the public
// packages of the module in dir: not internal, not commands, with
// non-test Go files. -e lists a package whose imports cannot be resolved
// (a module not downloaded: otelbacklog's OpenTelemetry modules when the
// library's tests run) with its files all the same: only they are needed.
func Packages(dir string) (paths, dirs []string, err error) {
	out, err := goList(dir, "-e", "-f", "{{.ImportPath}}\t{{.Name}}\t{{.Dir}}\t{{len .GoFiles}}", "./...")
	if err != nil {
		return nil, nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 {
			return nil, nil, fmt.Errorf("go list: unexpected line %q", sc.Text())
		}
		path, name, dir, files := f[0], f[1], f[2], f[3]
		if name == "main" || files == "0" || strings.Contains(path+"/", "/internal/") {
			continue
		}
		paths = append(paths, path)
		dirs = append(dirs, dir)
	}
	return paths, dirs, sc.Err()
}

// Generate returns the declarations part of the record of the module in
// dir: every public package's exported API.
func Generate(dir string) (string, error) {
	paths, dirs, err := Packages(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i := range paths {
		s, err := packageAPI(paths[i], dirs[i])
		if err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

func packageAPI(path, dir string) (string, error) {
	fset := token.NewFileSet()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var files []*ast.File
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			return "", err
		}
		if !buildable(f) {
			continue
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, path)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "package %s\n\n", path)
	emit := func(n ast.Node) {
		b.WriteString(render(fset, n))
		b.WriteString("\n\n")
	}
	for _, v := range p.Consts {
		emit(v.Decl)
	}
	for _, v := range p.Vars {
		emit(v.Decl)
	}
	for _, f := range p.Funcs {
		emit(f.Decl)
	}
	for _, t := range p.Types {
		emit(t.Decl)
		for _, v := range t.Consts {
			emit(v.Decl)
		}
		for _, v := range t.Vars {
			emit(v.Decl)
		}
		for _, f := range t.Funcs {
			emit(f.Decl)
		}
		for _, f := range t.Methods {
			emit(f.Decl)
		}
	}
	return b.String(), nil
}

// buildable leaves out files with build constraints other than the
// default build's (there are none in the public packages today; a file
// such as one for another OS would otherwise add duplicates).
func buildable(f *ast.File) bool {
	for _, g := range f.Comments {
		if g.Pos() >= f.Package {
			break
		}
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, "//go:build") && strings.Contains(c.Text, "ignore") {
				return false
			}
		}
	}
	return true
}

// render prints a declaration without its doc comments, body or
// parameter names.
func render(fset *token.FileSet, n ast.Node) string {
	switch d := n.(type) {
	case *ast.FuncDecl:
		c := *d
		c.Doc, c.Body = nil, nil
		if c.Recv != nil {
			c.Recv = stripNames(c.Recv)
		}
		c.Type = stripFunc(c.Type)
		ast.Inspect(c.Type, func(x ast.Node) bool {
			if y, ok := x.(*ast.FuncType); ok {
				*y = *stripFunc(y)
			}
			return true
		})
		n = &c
	case *ast.GenDecl:
		c := *d
		c.Doc = nil
		ast.Inspect(&c, func(x ast.Node) bool {
			switch y := x.(type) {
			case *ast.Field:
				y.Doc, y.Comment = nil, nil
			case *ast.ValueSpec:
				y.Doc, y.Comment = nil, nil
			case *ast.TypeSpec:
				y.Doc, y.Comment = nil, nil
			case *ast.FuncType:
				*y = *stripFunc(y)
			}
			return true
		})
		n = &c
	}
	var buf bytes.Buffer
	cfg := printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}
	if err := cfg.Fprint(&buf, fset, n); err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	// The lines of removed doc comments leave blank lines inside a group
	// (one declaration is one paragraph), and the printer aligns fields
	// by where the comments were: spaces are collapsed, so that editing a
	// doc comment never changes the record.
	var lines []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, collapseSpaces(l))
		}
	}
	return strings.Join(lines, "\n")
}

// collapseSpaces keeps a line's indentation and turns every other run of
// spaces into one, outside string and rune literals.
func collapseSpaces(l string) string {
	trimmed := strings.TrimLeft(l, " \t")
	var b strings.Builder
	b.WriteString(l[:len(l)-len(trimmed)])
	var quote byte
	space := false
	for i := 0; i < len(trimmed); i++ {
		c := trimmed[i]
		switch {
		case quote != 0:
			b.WriteByte(c)
			if c == '\\' && quote != '`' && i+1 < len(trimmed) {
				i++
				b.WriteByte(trimmed[i])
			} else if c == quote {
				quote = 0
			}
			continue
		case c == '"' || c == '`' || c == '\'':
			quote = c
		case c == ' ' || c == '\t':
			space = true
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteByte(c)
	}
	return b.String()
}

func stripFunc(t *ast.FuncType) *ast.FuncType {
	c := *t
	c.Params = stripNames(c.Params)
	c.Results = stripNames(c.Results)
	return &c
}

// stripNames returns a field list of the same types without names (one
// field per name, so `a, b int` becomes `int, int`).
func stripNames(l *ast.FieldList) *ast.FieldList {
	if l == nil {
		return nil
	}
	c := &ast.FieldList{Opening: l.Opening, Closing: l.Closing}
	for _, f := range l.List {
		n := len(f.Names)
		if n == 0 {
			n = 1
		}
		for range n {
			c.List = append(c.List, &ast.Field{Type: f.Type})
		}
	}
	return c
}

// Unreleased returns the text of the changelog's "## Unreleased" section
// (its lines up to the next "## " heading, trailing spaces removed).
func Unreleased(changelog []byte) (string, error) {
	var lines []string
	in, found := false, false
	for _, l := range strings.Split(string(changelog), "\n") {
		if strings.HasPrefix(l, "## ") {
			if in {
				break
			}
			if strings.TrimSpace(l) == "## Unreleased" {
				in, found = true, true
				continue
			}
		}
		if in {
			lines = append(lines, strings.TrimRight(l, " \t\r"))
		}
	}
	if !found {
		return "", errors.New(`CHANGELOG.md has no "## Unreleased" section`)
	}
	return strings.TrimSpace(strings.Join(lines, "\n")), nil
}

func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// Record is a parsed record (api/backlog.txt).
type Record struct {
	Module         string // the module's path, named in the header
	UnreleasedHash string // of the Unreleased section when it was written
	APIHash        string // of API, as stored
	API            string // the declarations
}

// Format returns the record's text.
func (r Record) Format() string {
	return header(r.Module) + "# unreleased-sha256: " + r.UnreleasedHash + "\n# api-sha256: " + r.APIHash + "\n\n" + r.API
}

// ParseRecord parses a record's text.
func ParseRecord(text string) (Record, error) {
	var r Record
	rest := text
	for strings.HasPrefix(rest, "#") {
		line, after, _ := strings.Cut(rest, "\n")
		rest = after
		if v, ok := strings.CutPrefix(line, "# The exported API of the public packages of "); ok {
			r.Module = strings.TrimSuffix(v, ":")
		}
		if v, ok := strings.CutPrefix(line, "# unreleased-sha256: "); ok {
			r.UnreleasedHash = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "# api-sha256: "); ok {
			r.APIHash = strings.TrimSpace(v)
		}
	}
	if r.UnreleasedHash == "" || r.APIHash == "" {
		return r, errors.New("the record's header lacks its unreleased-sha256 or api-sha256 line")
	}
	r.API = strings.TrimPrefix(rest, "\n")
	return r, nil
}

// unreleased returns the text of the Unreleased section of the changelog
// under root.
func unreleased(root string) (string, error) {
	cl, err := os.ReadFile(filepath.Join(root, ChangelogPath))
	if err != nil {
		return "", err
	}
	return Unreleased(cl)
}

// Check compares the committed records of mods with the source and the
// changelog, and returns what is wrong, with what to do.
func Check(root string, mods []Module) error {
	unreleased, err := unreleased(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mods {
		errs = append(errs, checkModule(root, m, unreleased))
	}
	return errors.Join(errs...)
}

func checkModule(root string, m Module, unreleased string) error {
	api, err := Generate(filepath.Join(root, m.Dir))
	if err != nil {
		return err
	}
	text, err := os.ReadFile(filepath.Join(root, m.Record))
	if err != nil {
		return fmt.Errorf("%w (run make api)", err)
	}
	rec, err := ParseRecord(string(text))
	if err != nil {
		return fmt.Errorf("%s: %w (run make api)", m.Record, err)
	}
	var errs []error
	if rec.APIHash != hash(rec.API) {
		errs = append(errs, fmt.Errorf("%s was edited by hand: its declarations do not match its api-sha256; run make api", m.Record))
	}
	if rec.API != api {
		errs = append(errs, fmt.Errorf("the exported API differs from %s:\n%s\n"+
			"If the change is meant: add an entry under \"## Unreleased\" in CHANGELOG.md, then run make api", m.Record, diff(rec.API, api)))
	} else if rec.UnreleasedHash != hash(unreleased) {
		errs = append(errs, fmt.Errorf("CHANGELOG.md's Unreleased section changed since %s was written: run make api (it records the section's hash)", m.Record))
	}
	return errors.Join(errs...)
}

// Update regenerates the records of mods. It refuses, writing none, when
// a module's declarations changed but the Unreleased section did not
// since its record was last written. It returns the records it wrote
// (none when all were current).
func Update(root string, mods []Module) ([]string, error) {
	unreleased, err := unreleased(root)
	if err != nil {
		return nil, err
	}
	next := make([]string, len(mods))
	var errs []error
	for i, m := range mods {
		next[i], err = nextRecord(root, m, unreleased)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var wrote []string
	for i, m := range mods {
		if next[i] == "" {
			continue
		}
		path := filepath.Join(root, m.Record)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return wrote, err
		}
		if err := os.WriteFile(path, []byte(next[i]), 0o644); err != nil {
			return wrote, err
		}
		wrote = append(wrote, m.Record)
	}
	return wrote, nil
}

// nextRecord returns the text m's record is to have, or "" when it has
// it already.
func nextRecord(root string, m Module, unreleased string) (string, error) {
	dir := filepath.Join(root, m.Dir)
	api, err := Generate(dir)
	if err != nil {
		return "", err
	}
	module, err := modulePath(dir)
	if err != nil {
		return "", err
	}
	old, err := os.ReadFile(filepath.Join(root, m.Record))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// The first record.
	case err != nil:
		return "", err
	default:
		rec, err := ParseRecord(string(old))
		if err != nil {
			return "", fmt.Errorf("%s: %w", m.Record, err)
		}
		if rec.API != api && rec.UnreleasedHash == hash(unreleased) {
			return "", fmt.Errorf("the exported API changed:\n%s\n"+
				"but CHANGELOG.md's \"## Unreleased\" section did not since %s was last written: "+
				"add an entry there saying what changed for users, then run make api again", diff(rec.API, api), m.Record)
		}
	}
	next := Record{Module: module, UnreleasedHash: hash(unreleased), APIHash: hash(api), API: api}.Format()
	if string(old) == next {
		return "", nil
	}
	return next, nil
}

// diff lists the paragraphs (declarations) only in a ("-") or only in b
// ("+"), enough to see what changed.
func diff(a, b string) string {
	pa, pb := paragraphs(a), paragraphs(b)
	var out []string
	for _, p := range sortedDiff(pa, pb) {
		out = append(out, indent("- ", p))
	}
	for _, p := range sortedDiff(pb, pa) {
		out = append(out, indent("+ ", p))
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("… and %d more", len(out)-40))
	}
	return strings.Join(out, "\n")
}

func paragraphs(s string) map[string]bool {
	m := map[string]bool{}
	pkg := ""
	for _, p := range strings.Split(s, "\n\n") {
		p = strings.TrimSpace(p)
		if strings.HasPrefix(p, "package ") {
			pkg = strings.TrimPrefix(p, "package ")
			continue
		}
		if p != "" {
			m[pkg+": "+p] = true
		}
	}
	return m
}

func sortedDiff(a, b map[string]bool) []string {
	var out []string
	for p := range a {
		if !b[p] {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

func indent(prefix, s string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", len(prefix)))
}
