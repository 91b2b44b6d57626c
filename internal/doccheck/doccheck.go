// Package doccheck compiles the Go code blocks of the project's Markdown
// (README.md and docs/*.md), so that no example in the documentation can
// drift away from the API unnoticed. Its tests run in `make test`.
//
// # The convention
//
// Every ```go block of a checked file is compiled; a block the checker
// cannot classify fails the check, so none is silently skipped. A block is
// one of:
//
//   - a file: its first line of code is a package clause. It is compiled as
//     is, in a package of its own.
//   - a run file: a file preceded by the comment <!-- doccheck: run -->. It
//     must be package main; besides being compiled, the test runs it with
//     DATABASE_URL set to a fresh, empty database and wants exit status 0.
//   - a fragment: preceded by <!-- doccheck: fragment -->. Statements,
//     wrapped in a function that returns error, so they may `return err`.
//     The well-known names of [Env] (ctx, q, pool, tx, job, …) are
//     parameters of that function when the fragment uses them without
//     declaring them; the variables the fragment declares at its top
//     level count as used.
//   - declarations: preceded by <!-- doccheck: decls -->. Top-level
//     declarations (types, functions), in a package of their own.
//
// Fragments and declarations get the imports they use from [Imports] (by
// package name: backlog.X imports github.com/backlogq/backlog). A file
// may also hold one prelude, an HTML comment that starts with
// "<!-- doccheck: prelude" and holds Go declarations (the App type a test
// example uses, say); it is added to each fragment and declarations block
// of that file, so the examples stay short without being unchecked.
//
// # How it is checked
//
// Every block becomes a package of one generated module in a temporary
// directory, which requires the library and the otelbacklog module
// through replace directives to this repository, and one `go vet` checks
// them all. Each block's code is preceded by a //line directive, so
// compiler errors name the Markdown file and line.
package doccheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Kind says how a block is compiled.
type Kind string

// The kinds of blocks (see the package doc).
const (
	KindFile     Kind = "file"
	KindRun      Kind = "run"
	KindFragment Kind = "fragment"
	KindDecls    Kind = "decls"
)

// Block is one ```go block of a Markdown file.
type Block struct {
	File    string // path of the Markdown file, as given to Extract
	Line    int    // line of the first line of code (1-based)
	Kind    Kind
	Code    string
	Prelude string // the file's prelude (fragments and declarations)
}

// Imports maps the package names fragments and declarations may use to
// their import paths.
var Imports = map[string]string{
	"backlog":     "github.com/backlogq/backlog",
	"backlogtest": "github.com/backlogq/backlog/backlogtest",
	"backlogui":   "github.com/backlogq/backlog/backlogui",
	"otelbacklog": "github.com/backlogq/backlog/otelbacklog",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"pgconn":      "github.com/jackc/pgx/v5/pgconn",
	"stdlib":      "github.com/jackc/pgx/v5/stdlib",
	"uuid":        "github.com/google/uuid",
	"propagation": "go.opentelemetry.io/otel/propagation",
	"otel":        "go.opentelemetry.io/otel",
	"trace":       "go.opentelemetry.io/otel/trace",
	"metric":      "go.opentelemetry.io/otel/metric",
	"bytes":       "bytes",
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"json":        "encoding/json",
	"log":         "log",
	"os":          "os",
	"signal":      "os/signal",
	"slog":        "log/slog",
	"sql":         "database/sql",
	"strings":     "strings",
	"testing":     "testing",
	"time":        "time",
}

// Env maps the names a fragment may use without declaring them to their
// types.
var Env = map[string]string{
	"ctx":    "context.Context",
	"q":      "*backlog.Queue",
	"pool":   "*pgxpool.Pool",
	"mux":    "*backlog.Mux",
	"job":    "*backlog.Job",
	"tx":     "pgx.Tx",
	"db":     "*sql.DB",
	"t":      "*testing.T",
	"id":     "uuid.UUID",
	"args":   "any",
	"filter": "backlog.Filter",
	"logger": "*slog.Logger",
}

var (
	markerRE  = regexp.MustCompile(`^<!--\s*doccheck:\s*([a-z]+)\s*-->$`)
	preludeRE = regexp.MustCompile(`^<!--\s*doccheck:\s*prelude\s*$`)
)

// Extract returns the ```go blocks of a Markdown file, classified. A block
// that is neither a file nor marked, a marker that names no kind, or a
// marker that is not followed by a Go block is an error.
func Extract(path string) ([]Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var (
		out     []Block
		prelude string
		errs    []error
		marker  Kind
		markAt  int
	)
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		switch {
		case preludeRE.MatchString(line):
			if prelude != "" {
				errs = append(errs, fmt.Errorf("%s:%d: a second prelude (one a file)", path, i+1))
			}
			start := i + 1
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "-->"; i++ {
			}
			if i == len(lines) {
				return nil, fmt.Errorf("%s:%d: prelude not closed by a line holding only -->", path, start)
			}
			prelude = fmt.Sprintf("//line %s:%d\n%s\n", abs(path), start+1, strings.Join(lines[start:i], "\n"))
		case markerRE.MatchString(line):
			k := Kind(markerRE.FindStringSubmatch(line)[1])
			switch k {
			case KindRun, KindFragment, KindDecls:
			default:
				errs = append(errs, fmt.Errorf("%s:%d: unknown doccheck marker %q (run, fragment, decls)", path, i+1, k))
			}
			if marker != "" {
				errs = append(errs, fmt.Errorf("%s:%d: doccheck marker not followed by a ```go block", path, markAt))
			}
			marker, markAt = k, i+1
		case strings.HasPrefix(line, "```"):
			lang := strings.TrimSpace(strings.TrimPrefix(line, "```"))
			start := i + 1
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
			}
			if i == len(lines) {
				return nil, fmt.Errorf("%s:%d: code block not closed", path, start)
			}
			if lang != "go" {
				if marker != "" {
					errs = append(errs, fmt.Errorf("%s:%d: doccheck marker before a %q block, not a go one", path, markAt, lang))
					marker = ""
				}
				continue
			}
			code := strings.Join(lines[start:i], "\n") + "\n"
			blk := Block{File: path, Line: start + 1, Code: code}
			isFile := hasPackageClause(code)
			switch {
			case marker == KindRun && isFile:
				blk.Kind = KindRun
			case marker == "" && isFile:
				blk.Kind = KindFile
			case (marker == KindFragment || marker == KindDecls) && !isFile:
				blk.Kind = marker
			case marker == "":
				errs = append(errs, fmt.Errorf("%s:%d: a go block with no package clause and no doccheck marker "+
					"(put <!-- doccheck: fragment --> or <!-- doccheck: decls --> on the line before it)", path, start))
			default:
				errs = append(errs, fmt.Errorf("%s:%d: doccheck marker %q does not fit this block (package clause: %v)", path, markAt, marker, isFile))
			}
			if blk.Kind != "" {
				out = append(out, blk)
			}
			marker = ""
		case line != "" && marker != "":
			errs = append(errs, fmt.Errorf("%s:%d: doccheck marker not followed by a ```go block", path, markAt))
			marker = ""
		}
	}
	if marker != "" {
		errs = append(errs, fmt.Errorf("%s:%d: doccheck marker not followed by a ```go block", path, markAt))
	}
	for i := range out {
		if out[i].Kind == KindFragment || out[i].Kind == KindDecls {
			out[i].Prelude = prelude
		}
	}
	return out, errors.Join(errs...)
}

// hasPackageClause reports whether the first line of code (after comments
// and blank lines) is a package clause.
func hasPackageClause(code string) bool {
	sc := bufio.NewScanner(strings.NewReader(code))
	inBlock := false
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case inBlock:
			if strings.Contains(l, "*/") {
				inBlock = false
			}
		case l == "" || strings.HasPrefix(l, "//"):
		case strings.HasPrefix(l, "/*"):
			inBlock = !strings.Contains(l, "*/")
		default:
			return strings.HasPrefix(l, "package ")
		}
	}
	return false
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// Source returns the Go file a block compiles as, in package pkg.
func Source(b Block, pkg string) (string, error) {
	line := fmt.Sprintf("//line %s:%d\n", abs(b.File), b.Line)
	switch b.Kind {
	case KindFile, KindRun:
		return line + b.Code, nil
	case KindDecls:
		prelude, err := withoutRedeclared(b.Prelude, b.Code)
		if err != nil {
			return "", fmt.Errorf("%s:%d: %w", b.File, b.Line, err)
		}
		body := prelude + line + b.Code
		imps, err := importsOf(body, nil)
		if err != nil {
			return "", fmt.Errorf("%s:%d: %w", b.File, b.Line, err)
		}
		return "package " + pkg + "\n\n" + importBlock(imps) + body, nil
	case KindFragment:
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+b.Code+"\n}\n", parser.SkipObjectResolution)
		if err != nil {
			return "", fmt.Errorf("%s:%d: the fragment does not parse as statements: %w", b.File, b.Line, err)
		}
		body := f.Decls[0].(*ast.FuncDecl).Body
		declared := topLevelNames(body)
		used := map[string]bool{}
		ast.Inspect(body, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				used[id.Name] = true
			}
			return true
		})
		var params, envTypes []string
		for _, name := range sortedKeys(Env) {
			if used[name] && !declared[name] {
				params = append(params, name+" "+Env[name])
				envTypes = append(envTypes, Env[name])
			}
		}
		var tail strings.Builder
		for _, name := range sortedKeys(declared) {
			if name != "_" {
				fmt.Fprintf(&tail, "\t_ = %s\n", name)
			}
		}
		prelude := b.Prelude
		fn := fmt.Sprintf("func _(%s) error {\n%s%s\n%s\treturn nil\n}\n", strings.Join(params, ", "), line, b.Code, tail.String())
		imps, err := importsOf(prelude+"func _() {\n"+b.Code+"\n}\n", envTypes)
		if err != nil {
			return "", fmt.Errorf("%s:%d: %w", b.File, b.Line, err)
		}
		return "package " + pkg + "\n\n" + importBlock(imps) + prelude + fn, nil
	}
	return "", fmt.Errorf("%s:%d: unknown kind %q", b.File, b.Line, b.Kind)
}

// topLevelNames returns the names a function body declares in its own
// scope (:= and var), the ones a reader of the fragment sees as its
// results.
func topLevelNames(body *ast.BlockStmt) map[string]bool {
	names := map[string]bool{}
	for _, st := range body.List {
		switch s := st.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						names[id.Name] = true
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, sp := range g.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						names[id.Name] = true
					}
				}
			}
		}
	}
	return names
}

// importsOf returns the import paths of the package names src uses as
// selectors (name.X) and the env types need.
func importsOf(src string, envTypes []string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", "package p\n"+src, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("does not parse: %w", err)
	}
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok {
				used[id.Name] = true
			}
		}
		return true
	})
	for _, t := range envTypes {
		if i := strings.Index(t, "."); i > 0 {
			used[strings.TrimLeft(t[:i], "*[]")] = true
		}
	}
	var paths []string
	for name := range used {
		if p, ok := Imports[name]; ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	return paths, nil
}

func importBlock(paths []string) string {
	if len(paths) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("import (\n")
	for _, p := range paths {
		fmt.Fprintf(&b, "\t%q\n", p)
	}
	b.WriteString(")\n\n")
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Module writes a module into dir with one package per block (p001,
// p002, …, in the order given) that requires the library and otelbacklog
// from the repository at root. It returns each block's package directory.
func Module(dir, root string, blocks []Block) ([]string, error) {
	gomod, gosum, err := moduleFiles(root)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), gomod, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), gosum, 0o644); err != nil {
		return nil, err
	}
	var dirs []string
	var errs []error
	for i, b := range blocks {
		pkg := fmt.Sprintf("p%03d", i+1)
		src, err := Source(b, pkg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d := filepath.Join(dir, pkg)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(d, "doc.go"), []byte(src), 0o644); err != nil {
			return nil, err
		}
		dirs = append(dirs, d)
	}
	return dirs, errors.Join(errs...)
}

// moduleFiles builds the generated module's go.mod (the requirements of
// the library and of otelbacklog, both replaced by the repository's
// directories) and go.sum (theirs, merged).
func moduleFiles(root string) (gomod, gosum []byte, err error) {
	reqs := map[string]string{}
	var goVersion string
	sums := map[string]bool{}
	for _, m := range []string{".", "otelbacklog"} {
		b, err := os.ReadFile(filepath.Join(root, m, "go.mod"))
		if err != nil {
			return nil, nil, err
		}
		inReq := false
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			switch {
			case strings.HasPrefix(l, "go ") && goVersion == "":
				goVersion = strings.TrimSpace(strings.TrimPrefix(l, "go "))
			case l == "require (":
				inReq = true
			case l == ")":
				inReq = false
			case inReq || strings.HasPrefix(l, "require "):
				f := strings.Fields(strings.TrimPrefix(l, "require "))
				if len(f) < 2 || strings.HasPrefix(f[0], "github.com/backlogq/backlog") {
					continue
				}
				if v, ok := reqs[f[0]]; !ok || semverLess(v, f[1]) {
					reqs[f[0]] = f[1]
				}
			}
		}
		s, err := os.ReadFile(filepath.Join(root, m, "go.sum"))
		if err != nil {
			return nil, nil, err
		}
		for _, l := range strings.Split(string(s), "\n") {
			if strings.TrimSpace(l) != "" {
				sums[l] = true
			}
		}
	}
	var mod bytes.Buffer
	fmt.Fprintf(&mod, "module doccheck.invalid/docs\n\ngo %s\n\nrequire (\n", goVersion)
	fmt.Fprintf(&mod, "\tgithub.com/backlogq/backlog v0.0.0-00010101000000-000000000000\n")
	fmt.Fprintf(&mod, "\tgithub.com/backlogq/backlog/otelbacklog v0.0.0-00010101000000-000000000000\n")
	for _, p := range sortedKeys(reqs) {
		fmt.Fprintf(&mod, "\t%s %s\n", p, reqs[p])
	}
	fmt.Fprintf(&mod, ")\n\nreplace github.com/backlogq/backlog => %s\n\nreplace github.com/backlogq/backlog/otelbacklog => %s\n",
		root, filepath.Join(root, "otelbacklog"))
	return mod.Bytes(), []byte(strings.Join(sortedKeys(sums), "\n") + "\n"), nil
}

// semverLess compares two module versions by their numeric release parts
// (enough for the requirements of two go.mod files of one repository).
func semverLess(a, b string) bool {
	pa, pb := strings.FieldsFunc(strings.TrimPrefix(a, "v"), sep), strings.FieldsFunc(strings.TrimPrefix(b, "v"), sep)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea != nil || eb != nil {
			if pa[i] != pb[i] {
				return pa[i] < pb[i]
			}
			continue
		}
		if na != nb {
			return na < nb
		}
	}
	return len(pa) < len(pb)
}

func sep(r rune) bool { return r == '.' || r == '-' || r == '+' }

// GoEnv is the environment of the go commands run on the generated
// module: the caller's, with -mod=mod (the generated go.sum may lack a
// line the go command can fill in) and no workspace.
func GoEnv() []string {
	return append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "GOWORK=off")
}

// Vet runs `go vet` (without the unreachable-code check: a fragment that
// ends in a return is followed by the wrapper's own) on every package of
// the generated module in dir. Its error holds the tool's output, whose
// positions are those of the Markdown files.
func Vet(dir string) error {
	cmd := exec.Command("go", "vet", "-unreachable=false", "./...")
	cmd.Dir = dir
	cmd.Env = GoEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go vet of the documentation's Go blocks: %w\n%s", err, out)
	}
	return nil
}

// withoutRedeclared returns the prelude without the declarations a
// declarations block makes itself (a type, with the prelude's methods on
// it, a function, a variable or a constant of the same name), so that a
// guide may show a type in a declarations block and use it in fragments,
// which get it from the prelude.
func withoutRedeclared(prelude, code string) (string, error) {
	if prelude == "" {
		return "", nil
	}
	names := func(src string) (*token.FileSet, *ast.File, map[string]bool, error) {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "", "package p\n"+src, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return nil, nil, nil, err
		}
		declared := map[string]bool{}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					declared[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						declared[sp.Name.Name] = true
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							declared[n.Name] = true
						}
					}
				}
			}
		}
		return fset, f, declared, nil
	}
	_, _, mine, err := names(code)
	if err != nil {
		return "", fmt.Errorf("the declarations do not parse: %w", err)
	}
	fset, f, _, err := names(prelude)
	if err != nil {
		return "", fmt.Errorf("the prelude does not parse: %w", err)
	}
	src := "package p\n" + prelude
	// The prelude's first line is its //line directive: keep it, and give
	// each kept declaration its own, so errors still name the right line.
	directive, _, _ := strings.Cut(prelude, "\n")
	file, first := abs(""), 0
	if m := regexp.MustCompile(`^//line (.*):(\d+)$`).FindStringSubmatch(directive); m != nil {
		file = m[1]
		first, _ = strconv.Atoi(m[2])
	}
	var out strings.Builder
	for _, d := range f.Decls {
		drop := false
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				drop = mine[d.Name.Name]
			} else if len(d.Recv.List) == 1 {
				t := d.Recv.List[0].Type
				if st, ok := t.(*ast.StarExpr); ok {
					t = st.X
				}
				if id, ok := t.(*ast.Ident); ok {
					drop = mine[id.Name]
				}
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					drop = drop || mine[sp.Name.Name]
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						drop = drop || mine[n.Name]
					}
				}
			}
		}
		if drop {
			continue
		}
		start, end := d.Pos(), d.End()
		if doc := declDoc(d); doc != nil {
			start = doc.Pos()
		}
		// Line 1 is the package clause, line 2 the directive.
		fmt.Fprintf(&out, "//line %s:%d\n%s\n", file, first+fset.Position(start).Line-3,
			src[fset.Position(start).Offset:fset.Position(end).Offset])
	}
	return out.String(), nil
}

// declDoc returns a declaration's doc comment, if any.
func declDoc(d ast.Decl) *ast.CommentGroup {
	switch d := d.(type) {
	case *ast.FuncDecl:
		return d.Doc
	case *ast.GenDecl:
		return d.Doc
	}
	return nil
}
