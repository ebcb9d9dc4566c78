package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every Go identifier a doc names in code font, `pkg.Name` or
// `Type.Method`, exists: pkg is one of the module's packages and declares
// Name, or Type is one of its types with that method or field. A name
// outside the module (`corev1.PersistentVolume`) is not checked. Issue 39
// found docs/design.md naming `watchclient.Slim`, which had become
// `kube.Slim`.
func TestDocsNameIdentifiersThatExist(t *testing.T) {
	idx, err := indexModule("..")
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := filepath.Glob("../docs/*.md")
	more, _ := filepath.Glob("../*/*/README.md")
	docs = append(append(docs, "../README.md"), more...)
	more, _ = filepath.Glob("../*/README.md")
	docs = append(docs, more...)
	ref := regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)\\.([A-Za-z_][A-Za-z0-9_]*)(?:\\(\\))?`")
	checked := 0
	for _, f := range docs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ref.FindAllStringSubmatch(string(b), -1) {
			scope, name := m[1], m[2]
			names, known := idx[scope]
			if !known || notIdentifier[name] || objectPath[scope] {
				continue
			}
			if strings.Contains(name, "_") {
				name = goName(name) // a proto field: `WatchRequest.claim_shard`
			}
			checked++
			if !names[name] {
				t.Errorf("%s names `%s.%s`, but %s has no %s", f, scope, name, scope, name)
			}
		}
	}
	t.Logf("%d names in docs checked", checked)
}

// notIdentifier are the words after a dot that make a file or host
// name, not a Go name: `rebind.go`, `cluster.local`, `e2e.test`.
var notIdentifier = map[string]bool{"go": true, "md": true, "yaml": true, "sh": true, "json": true, "local": true, "proto": true, "test": true}

// objectPath are the first words of a Kubernetes object's field paths
// (`spec.volumeName`), which a type of the module may share a name with.
var objectPath = map[string]bool{"spec": true, "status": true, "metadata": true}

// goName is the Go name protoc-gen-go gives a proto field: claim_shard
// is ClaimShard.
func goName(field string) string {
	var b strings.Builder
	for _, part := range strings.Split(field, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// indexModule maps each package name of the module, and each type name,
// to what it declares: a package's top-level names, a type's methods and
// fields. Two packages of one name share an entry.
func indexModule(root string) (map[string]map[string]bool, error) {
	idx := map[string]map[string]bool{}
	add := func(scope, name string) {
		if idx[scope] == nil {
			idx[scope] = map[string]bool{}
		}
		idx[scope][name] = true
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		indexFile(f, add)
		return nil
	})
	return idx, err
}

// indexFile adds one file's declarations.
func indexFile(f *ast.File, add func(scope, name string)) {
	pkg := f.Name.Name
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				add(pkg, d.Name.Name)
				continue
			}
			if recv := typeName(d.Recv.List[0].Type); recv != "" {
				add(recv, d.Name.Name)
				add(pkg, d.Name.Name) // `coord.ReserveAll` for (*Coordinator).ReserveAll
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					add(pkg, s.Name.Name)
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								add(s.Name.Name, n.Name)
							}
							if len(fl.Names) == 0 {
								add(s.Name.Name, typeName(fl.Type)) // embedded
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						add(pkg, n.Name)
					}
				}
			}
		}
	}
}

// typeName is the name of a receiver's or embedded field's type.
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.IndexExpr:
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}
