// Command layoutcheck fails when the repository's layout stops showing its
// architecture (docs/layout.md): every package of the module must sit in a
// product area (proto, services, gateway, pkg, cmd, internal, deploy) or a
// harness area (test, hack), and no product package may import a harness
// package. Tests of product packages may (they start the dev environment,
// make certificates, measure memory); the code that ships may not.
//
//	go run ./hack/layoutcheck          # the module in the current directory
//	go run ./hack/layoutcheck -C dir   # another module
//
// `make verify-layout` runs it. It lists the packages with `go list`, and
// reads the imports of every non-test file itself, those excluded by
// build constraints included, so that a file built only on another
// platform cannot import a harness unseen.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// kind is what a package is for.
type kind string

const (
	product kind = "product" // shipped code: services, gateway, pkg, cmd, internal
	harness kind = "harness" // tests, benchmarks, chaos, the dev environment, build tools
)

// areas are the module's top-level directories and what each holds; the
// longest matching path decides. docs/layout.md explains each one, and a
// change here goes with a change there.
var areas = map[string]kind{
	"proto":    product,
	"services": product,
	"gateway":  product,
	"pkg":      product,
	"cmd":      product,
	"internal": product,
	"deploy":   product,
	"test":     harness,
	"hack":     harness,
}

// pkg is what layoutcheck reads of `go list -json`.
type pkg struct {
	ImportPath     string
	Dir            string
	Module         *struct{ Path string }
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string
}

func main() {
	dir := flag.String("C", ".", "the module's directory")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dir, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "layoutcheck:", err)
		os.Exit(1)
	}
}

// errViolations is returned by run when the layout is broken.
var errViolations = errors.New("the layout is broken (docs/layout.md)")

// run checks the module in dir and prints each violation to out.
func run(ctx context.Context, dir string, out io.Writer) error {
	pkgs, err := list(ctx, dir)
	if err != nil {
		return err
	}
	violations, err := check(pkgs)
	if err != nil {
		return err
	}
	for _, v := range violations {
		fmt.Fprintln(out, v)
	}
	if len(violations) > 0 {
		return fmt.Errorf("%w: %d violation(s)", errViolations, len(violations))
	}
	return nil
}

// list runs `go list -json ./...` in dir.
func list(ctx context.Context, dir string) ([]pkg, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-e", "-json=ImportPath,Dir,Module,GoFiles,CgoFiles,IgnoredGoFiles", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %w: %s", dir, err, stderr.Bytes())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(stdout)); dec.More(); {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("go list in %s: %w", dir, err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("go list in %s found no package", dir)
	}
	return excluded(dir, pkgs)
}

// excluded adds to pkgs the directories of dir's module that hold Go files
// but that `./...` does not list because build constraints exclude every
// file; their files are all read as ignored ones.
func excluded(dir string, pkgs []pkg) ([]pkg, error) {
	listed := map[string]bool{}
	for _, p := range pkgs {
		d, err := filepath.EvalSymlinks(p.Dir)
		if err != nil {
			return nil, err
		}
		listed[d] = true
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	if root, err = filepath.Abs(root); err != nil {
		return nil, err
	}
	module := pkgs[0].Module
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil {
			return filepath.SkipDir // another module
		}
		if listed[path] {
			return nil
		}
		files, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil || len(files) == 0 {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		p := pkg{ImportPath: module.Path, Dir: path, Module: module}
		if rel != "." {
			p.ImportPath += "/" + filepath.ToSlash(rel)
		}
		for _, f := range files {
			p.IgnoredGoFiles = append(p.IgnoredGoFiles, filepath.Base(f))
		}
		pkgs = append(pkgs, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walking %s: %w", root, err)
	}
	return pkgs, nil
}

// check returns one line per package outside every area and per import of
// a harness package by a product package, sorted.
func check(pkgs []pkg) ([]string, error) {
	var violations []string
	for _, p := range pkgs {
		// A package with errors (every file excluded by build constraints,
		// a missing import) is still checked: go build reports the errors.
		if p.Module == nil {
			return nil, fmt.Errorf("%s is in no module", p.ImportPath)
		}
		rel, k := classify(p.Module.Path, p.ImportPath)
		if k == "" {
			violations = append(violations, fmt.Sprintf("%s is in no area of the layout: put it under one, or add its directory to hack/layoutcheck's areas and docs/layout.md", rel))
			continue
		}
		if k != product {
			continue
		}
		imports, err := importsOf(p)
		if err != nil {
			return nil, err
		}
		for _, imp := range imports {
			if !inModule(p.Module.Path, imp) {
				continue
			}
			if irel, ik := classify(p.Module.Path, imp); ik == harness {
				violations = append(violations, fmt.Sprintf("%s (product) imports %s (harness): shipped code must not depend on test or bench harnesses", rel, irel))
			}
		}
	}
	slices.Sort(violations)
	return slices.Compact(violations), nil
}

// classify returns path relative to module and the kind of its area, ""
// when it is in none.
func classify(module, path string) (string, kind) {
	rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
	if path == module {
		rel = "."
	}
	best, k := -1, kind("")
	for area, ak := range areas {
		if (rel == area || strings.HasPrefix(rel, area+"/")) && len(area) > best {
			best, k = len(area), ak
		}
	}
	return rel, k
}

func inModule(module, path string) bool {
	return path == module || strings.HasPrefix(path, module+"/")
}

// importsOf returns the imports of every non-test Go file of p, whatever
// its build constraints.
func importsOf(p pkg) ([]string, error) {
	var imports []string
	fset := token.NewFileSet()
	for _, name := range slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles) {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.ImportPath, err)
		}
		for _, spec := range f.Imports {
			path, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", fset.Position(spec.Pos()), err)
			}
			imports = append(imports, path)
		}
	}
	return imports, nil
}
