// Command funclen keeps product functions short enough to read on one
// screen: it lists every function and method of the product areas
// (docs/layout.md: services, gateway, pkg, cmd, internal, deploy) longer
// than -warn lines, and fails when one is longer than -max.
//
//	go run ./hack/funclen            # the module in the current directory
//	go run ./hack/funclen -C dir     # another tree
//
// `make verify-funclen` (part of `make verify`) runs it. A function's
// length is its declaration's lines, from `func` to its closing brace,
// comments and blank lines inside included, as a reader scrolls them.
// Test files and generated files (a "Code generated ... DO NOT EDIT."
// line before the package clause) are not product code and are skipped.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// productAreas are the top-level directories whose code ships
// (hack/layoutcheck's product kind, but proto/, whose Go is generated).
var productAreas = []string{"services", "gateway", "pkg", "cmd", "internal", "deploy"}

// generated matches the line Go's convention puts in generated files.
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// long is one function over the warning length.
type long struct {
	pos   string // file:line of its declaration
	name  string // Recv.Name or Name
	lines int
}

// The lengths make verify-funclen holds product functions to: over
// defaultWarn lines a function is listed, over defaultMax the check fails.
const (
	defaultWarn = 60
	defaultMax  = 80
)

func main() {
	dir := flag.String("C", ".", "the module's root directory")
	warn := flag.Int("warn", defaultWarn, "list functions longer than this many lines")
	limit := flag.Int("max", defaultMax, "fail when a function is longer than this many lines")
	flag.Parse()
	os.Exit(run(os.Stdout, *dir, *warn, *limit))
}

// run lists the long functions under root and returns the exit code: 1
// when one is over limit, 2 when the tree cannot be read.
func run(w io.Writer, root string, warn, limit int) int {
	var found []long
	for _, area := range productAreas {
		fs, err := scan(root, area, warn)
		if err != nil {
			fmt.Fprintln(w, "funclen:", err)
			return 2
		}
		found = append(found, fs...)
	}
	slices.SortFunc(found, func(a, b long) int { return b.lines - a.lines })
	over := 0
	for _, f := range found {
		verdict := "long"
		if f.lines > limit {
			verdict = "TOO LONG"
			over++
		}
		fmt.Fprintf(w, "%-8s %4d lines  %s  %s\n", verdict, f.lines, f.name, f.pos)
	}
	fmt.Fprintf(w, "funclen: %d product functions over %d lines, %d over %d\n", len(found), warn, over, limit)
	if over > 0 {
		fmt.Fprintf(w, "funclen: split the functions over %d lines: one screen a function\n", limit)
		return 1
	}
	return 0
}

// scan returns the functions over warn lines in the Go files below
// root/area, but for tests and generated files.
func scan(root, area string, warn int) ([]long, error) {
	var out []long
	base := filepath.Join(root, area)
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && path == base {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		fs, err := longFuncs(rel, src, warn)
		out = append(out, fs...)
		return err
	})
	return out, err
}

// longFuncs parses one file and returns its functions over warn lines;
// a generated file has none.
func longFuncs(name string, src []byte, warn int) ([]long, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	if generated.Match(src[:fset.Position(f.Package).Offset]) {
		return nil, nil
	}
	var out []long
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
		if n > warn {
			out = append(out, long{pos: fmt.Sprintf("%s:%d", name, fset.Position(fn.Pos()).Line), name: funcName(fn), lines: n})
		}
	}
	return out, nil
}

// funcName is Name, or Recv.Name for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if g, ok := t.(*ast.IndexExpr); ok {
		t = g.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
