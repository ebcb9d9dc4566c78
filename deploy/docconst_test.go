package deploy

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// constReader reads the values of the module's constants and variables
// from their source, for the docs' <!-- const: dir.Name --> markers.
type constReader struct {
	root string
	pkgs map[string]map[string]ast.Expr // dir -> name -> value expression
}

func newConstReader(root string) *constReader {
	return &constReader{root: root, pkgs: map[string]map[string]ast.Expr{}}
}

// value is a marker's value: "services/binder.Name", the constant or
// variable Name declared in services/binder, optionally "* N" (a value
// the code derives, as a burst of twice the QPS).
func (r *constReader) value(ref string) (float64, error) {
	ref, factor, scaled := strings.Cut(ref, " * ")
	dir, name, ok := cutLast(strings.TrimSpace(ref), ".")
	if !ok {
		return 0, fmt.Errorf("const marker %q: want dir.Name", ref)
	}
	v, err := r.eval(dir, name, 0)
	if err != nil {
		return 0, err
	}
	if v.Kind() == constant.String {
		return 0, fmt.Errorf("%s is a string, %s", ref, v)
	}
	f, _ := constant.Float64Val(constant.ToFloat(v))
	if scaled {
		k, err := strconv.ParseFloat(strings.TrimSpace(factor), 64)
		if err != nil {
			return 0, fmt.Errorf("const marker %q: %v", ref, err)
		}
		f *= k
	}
	return f, nil
}

// text is a marker's constant as a string: a string's value, a
// number's digits.
func (r *constReader) text(ref string) (string, error) {
	dir, name, ok := cutLast(strings.TrimSpace(ref), ".")
	if !ok {
		return "", fmt.Errorf("const marker %q: want dir.Name", ref)
	}
	v, err := r.eval(dir, name, 0)
	if err != nil {
		return "", err
	}
	if v.Kind() == constant.String {
		return constant.StringVal(v), nil
	}
	return v.ExactString(), nil
}

// cutLast cuts s at its last sep.
func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// decls are the top-level constants and variables of a package
// directory with a value, parsed once.
func (r *constReader) decls(dir string) (map[string]ast.Expr, error) {
	if d, ok := r.pkgs[dir]; ok {
		return d, nil
	}
	files, err := filepath.Glob(filepath.Join(r.root, dir, "*.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no Go package %s", dir)
	}
	d := map[string]ast.Expr{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		addValues(file, d)
	}
	r.pkgs[dir] = d
	return d, nil
}

// addValues adds a file's top-level names that have one value each.
func addValues(file *ast.File, d map[string]ast.Expr) {
	for _, decl := range file.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i < len(vs.Values) {
					d[n.Name] = vs.Values[i]
				}
			}
		}
	}
}

// timeUnits are package time's durations, in nanoseconds.
var timeUnits = map[string]int64{"Nanosecond": 1, "Microsecond": 1e3, "Millisecond": 1e6, "Second": 1e9, "Minute": 60e9, "Hour": 3600e9}

// eval evaluates name in dir: literals, names of the same package,
// time's units, conversions and arithmetic.
func (r *constReader) eval(dir, name string, depth int) (constant.Value, error) {
	d, err := r.decls(dir)
	if err != nil {
		return nil, err
	}
	e, ok := d[name]
	if !ok {
		return nil, fmt.Errorf("%s declares no constant or variable %s with a value", dir, name)
	}
	if depth > 20 {
		return nil, fmt.Errorf("%s.%s: too deep", dir, name)
	}
	return r.expr(dir, e, depth+1)
}

// expr evaluates one expression of dir's package.
func (r *constReader) expr(dir string, e ast.Expr, depth int) (constant.Value, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		return constant.MakeFromLiteral(e.Value, e.Kind, 0), nil
	case *ast.Ident:
		return r.eval(dir, e.Name, depth)
	case *ast.ParenExpr:
		return r.expr(dir, e.X, depth)
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && x.Name == "time" && timeUnits[e.Sel.Name] != 0 {
			return constant.MakeInt64(timeUnits[e.Sel.Name]), nil
		}
	case *ast.CallExpr: // a conversion: time.Duration(5), float64(x)
		if len(e.Args) == 1 {
			return r.expr(dir, e.Args[0], depth)
		}
	case *ast.UnaryExpr:
		x, err := r.expr(dir, e.X, depth)
		if err != nil {
			return nil, err
		}
		return constant.UnaryOp(e.Op, x, 0), nil
	case *ast.BinaryExpr:
		return r.binary(dir, e, depth)
	}
	return nil, fmt.Errorf("%s: cannot evaluate %T", dir, e)
}

// binary evaluates x op y; integer division stays integral, as in Go.
func (r *constReader) binary(dir string, e *ast.BinaryExpr, depth int) (constant.Value, error) {
	x, err := r.expr(dir, e.X, depth)
	if err != nil {
		return nil, err
	}
	y, err := r.expr(dir, e.Y, depth)
	if err != nil {
		return nil, err
	}
	op := e.Op
	if op == token.QUO && x.Kind() == constant.Int && y.Kind() == constant.Int {
		op = token.QUO_ASSIGN
	}
	if op == token.SHL || op == token.SHR {
		s, _ := constant.Uint64Val(y)
		return constant.Shift(x, op, uint(s)), nil
	}
	return constant.BinaryOp(x, op, y), nil
}
