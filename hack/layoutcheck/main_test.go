package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module writes a module example.com/m of the given files (path: Go
// source) into a temporary directory and returns it.
func module(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["go.mod"] = "module example.com/m\n\ngo 1.26\n"
	for name, src := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Go sources of the fixtures: a harness package, and product packages.
const (
	harnessPkg   = "package h\n\nimport _ \"example.com/m/pkg/a\"\n"
	productPkg   = "package a\n"
	importsH     = "package %s\n\nimport _ \"example.com/m/test/harness/h\"\n"
	testImportsH = "package a_test\n\nimport (\n\t\"testing\"\n\n\t_ \"example.com/m/test/harness/h\"\n)\n\nfunc TestA(t *testing.T) {}\n"
)

func src(format, name string) string { return strings.Replace(format, "%s", name, 1) }

// TestCheck runs the checker on fixture modules: each tries a way for a
// product package to depend on a harness, or a package to escape the
// layout, and the checker must name it.
func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  []string // substrings of the violations, in order
	}{{
		name: "harness imports product, product tests import harness",
		files: map[string]string{
			"pkg/a/a.go":            productPkg,
			"pkg/a/a_test.go":       testImportsH,
			"test/harness/h/h.go":   harnessPkg,
			"test/cmd/dev/main.go":  "package main\n\nimport _ \"example.com/m/test/harness/h\"\n\nfunc main() {}\n",
			"hack/tool/main.go":     "package main\n\nimport _ \"example.com/m/pkg/a\"\n\nfunc main() {}\n",
			"deploy/deploy_test.go": "package deploy\n\nimport _ \"example.com/m/test/harness/h\"\n",
		},
	}, {
		name: "a service imports a harness",
		files: map[string]string{
			"pkg/a/a.go":               productPkg,
			"test/harness/h/h.go":      harnessPkg,
			"services/binder/sync.go":  src(importsH, "binder"),
			"services/binder/other.go": "package binder\n",
		},
		want: []string{"services/binder (product) imports test/harness/h (harness)"},
	}, {
		name: "a shipped command imports a harness",
		files: map[string]string{
			"pkg/a/a.go":          productPkg,
			"test/harness/h/h.go": harnessPkg,
			"cmd/tool/main.go":    "package main\n\nimport _ \"example.com/m/test/harness/h\"\n\nfunc main() {}\n",
		},
		want: []string{"cmd/tool (product) imports test/harness/h (harness)"},
	}, {
		name: "a file built only on another platform imports a harness",
		files: map[string]string{
			"pkg/a/a.go":          productPkg,
			"test/harness/h/h.go": harnessPkg,
			"internal/x/x.go":     "package x\n",
			"internal/x/x_plan9.go": "//go:build plan9\n\n" +
				src(importsH, "x"),
		},
		want: []string{"internal/x (product) imports test/harness/h (harness)"},
	}, {
		name: "a package whose every file is excluded imports a harness",
		files: map[string]string{
			"pkg/a/a.go":          productPkg,
			"test/harness/h/h.go": harnessPkg,
			"gateway/g.go":        "//go:build ignore\n\n" + src(importsH, "gateway"),
		},
		want: []string{"gateway (product) imports test/harness/h (harness)"},
	}, {
		name: "a product package imports hack",
		files: map[string]string{
			"hack/tool/tool.go": "package tool\n",
			"pkg/a/a.go":        "package a\n\nimport _ \"example.com/m/hack/tool\"\n",
		},
		want: []string{"pkg/a (product) imports hack/tool (harness)"},
	}, {
		name: "packages outside every area",
		files: map[string]string{
			"m.go":         "package m\n",
			"tools/t/t.go": "package t\n",
			"pkg/a/a.go":   productPkg,
		},
		want: []string{". is in no area", "tools/t is in no area"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := module(t, tt.files)
			pkgs, err := list(t.Context(), dir)
			if err != nil {
				t.Fatal(err)
			}
			got, err := check(pkgs)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("violations:\n%s\nwant %d: %q", strings.Join(got, "\n"), len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestRunFails checks that the command's run reports a broken layout as an
// error (make verify fails) and prints the violation.
func TestRunFails(t *testing.T) {
	dir := module(t, map[string]string{
		"test/harness/h/h.go": "package h\n",
		"pkg/a/a.go":          src(importsH, "a"),
	})
	var out strings.Builder
	err := run(t.Context(), dir, &out)
	if !errors.Is(err, errViolations) {
		t.Fatalf("run = %v, want %v", err, errViolations)
	}
	if !strings.Contains(out.String(), "pkg/a (product) imports test/harness/h (harness)") {
		t.Errorf("output %q does not name the import", out.String())
	}
	clean := module(t, map[string]string{"pkg/a/a.go": productPkg})
	if err := run(t.Context(), clean, &out); err != nil {
		t.Errorf("run on a clean module = %v", err)
	}
}

// TestAreasAreDocumented keeps docs/layout.md and the areas together: each
// area is named there as a top-level directory.
func TestAreasAreDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "layout.md"))
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for area := range areas {
		if !strings.Contains(string(doc), "\n"+area+"/") {
			missing = append(missing, area)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("docs/layout.md does not describe %v at the start of a line", missing)
	}
}
