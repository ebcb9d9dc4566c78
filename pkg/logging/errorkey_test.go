package logging

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// logMethods are the slog.Logger methods (and package functions) that take
// key/value pairs.
var logMethods = map[string]bool{
	"Debug": true, "Info": true, "Warn": true, "Error": true,
	"DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true,
	"Log": true, "With": true,
}

// slogAttrs are the slog functions that make one attribute from a key.
var slogAttrs = map[string]bool{"Any": true, "String": true, "Group": true}

// Errors are logged under one key, ErrorKey, everywhere: a log call in the
// tree with another key for an error ("err") fails this test, so that an
// operator's query for error= finds every one.
func TestOneKeyForErrors(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "vendor", "testdata", "node_modules", "bin":
				return filepath.SkipDir
			}
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".pb.go") || strings.HasSuffix(path, ".pb.gw.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			var keys []ast.Expr
			switch {
			case logMethods[sel.Sel.Name]:
				keys = call.Args
			case slogAttrs[sel.Sel.Name] && isIdent(sel.X, "slog") && len(call.Args) > 0:
				keys = call.Args[:1]
			}
			for _, a := range keys {
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, _ := strconv.Unquote(lit.Value); s == "err" {
						t.Errorf("%s: an error logged under %q; use %q (logging.ErrorKey)", fset.Position(lit.Pos()), s, ErrorKey)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d files: is the tree at %s?", checked, root)
	}
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// The check above catches what it claims to.
func TestOneKeyForErrorsSeesTheOtherKey(t *testing.T) {
	src := `package x
func f() { log.Warn("x", "volume", v, "err", err); l := slog.Any("err", err); log.With("err", e).Info("y") }`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	ast.Inspect(f, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (logMethods[sel.Sel.Name] || (slogAttrs[sel.Sel.Name] && isIdent(sel.X, "slog"))) {
				for _, a := range call.Args {
					if lit, ok := a.(*ast.BasicLit); ok && lit.Value == `"err"` {
						found++
					}
				}
			}
		}
		return true
	})
	if found != 3 {
		t.Fatalf("found %d, want 3", found)
	}
}
