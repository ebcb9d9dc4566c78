package callers_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/volplane/volplane/pkg/callers"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// How the check finds calls: the module's packages are type-checked
// (go/types over `go list -export` data, so nothing but the go command is
// needed), and every use of a method named like an RPC, whose receiver is
// an interface (a generated client, or a narrow one its consumer
// declared) and that takes that RPC's request type, counts as a call of
// the RPC. Methods of the generated *ServiceServer interfaces are
// handlers, not calls. The generated REST routes (.pb.gw.go) call through
// a client too: they count for the packages that register them
// (Register<Service>Handler...).
//
// A call is made under the identity of the service package it is
// reachable from (its imports, transitively: pkg/watchclient's calls are
// the binder's and the provisioner's), whichever binary runs that package
// (a service's own command, or a tool that runs it in-process with the
// service's certificate). A command's own calls, through the packages it
// imports without going through a service package, are made with the
// command's certificate: the harnesses' as Conformance, and no other
// command may make any.
//
// A static scan sees every call site, exercised by a test or not; a
// registry the clients declare would be only as complete as the
// declarations.

const module = "github.com/volplane/volplane"

// identities are the service packages whose calls the table must match
// exactly, by the identity of the certificate they run with.
var identities = map[string]string{
	module + "/services/watcher":     callers.Watcher,
	module + "/services/binder":      callers.Binder,
	module + "/services/provisioner": callers.Provisioner,
	module + "/services/reclaimer":   callers.Reclaimer,
	module + "/gateway":              callers.Gateway,
}

// harnesses run as Conformance: whatever they call must be allowed to it.
var harnesses = []string{
	module + "/cmd/volplane-conformance",
	module + "/test/cmd/volplane-chaos",
	module + "/test/cmd/volplane-bench",
}

// rpc is one RPC as the scan recognises it.
type rpc struct {
	pkg, method, request string // Go package path, method and request type names
}

func rpcs(t *testing.T) map[rpc]string {
	out := map[rpc]string{}
	for _, fd := range []protoreflect.FileDescriptor{
		watcherv1.File_volplane_watcher_v1_watcher_proto, binderv1.File_volplane_binder_v1_binder_proto,
		provisionerv1.File_volplane_provisioner_v1_provisioner_proto, reclaimerv1.File_volplane_reclaimer_v1_reclaimer_proto,
	} {
		pkg := module + "/proto/" + filepath.Dir(fd.Path())
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				if md.Input().ParentFile() != fd {
					t.Fatalf("%s takes %s from another file: teach the scan", md.FullName(), md.Input().FullName())
				}
				out[rpc{pkg, string(md.Name()), string(md.Input().Name())}] = "/" + string(sd.FullName()) + "/" + string(md.Name())
			}
		}
	}
	return out
}

type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Imports    []string
	Export     string
	Standard   bool
	Module     *struct{ Path string }
}

// scan is what the packages of the module call.
type scan struct {
	// calls are the RPCs each package calls, with a position each.
	calls map[string]map[string]string
	// registers are, per package, the proto packages whose REST handlers it
	// registers.
	registers map[string][]string
	imports   map[string][]string
}

func scanModule(t *testing.T, roots []string) *scan {
	t.Helper()
	if testing.Short() {
		t.Skip("type-checks the services' packages (go list -export builds their dependencies)")
	}
	cmd := exec.Command("go", append([]string{"list", "-e", "-deps", "-export", "-json=ImportPath,Dir,GoFiles,CgoFiles,Imports,Export,Standard,Module"}, roots...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*listed{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = &p
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := pkgs[path]
		if !ok || p.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(p.Export)
	})
	known := rpcs(t)
	s := &scan{calls: map[string]map[string]string{}, registers: map[string][]string{}, imports: map[string][]string{}}
	for path, p := range pkgs {
		s.imports[path] = p.Imports
		if p.Module == nil || p.Module.Path != module {
			continue
		}
		if len(p.CgoFiles) > 0 {
			t.Fatalf("%s uses cgo: teach the scan", path)
		}
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
		if _, err := (&types.Config{Importer: imp}).Check(path, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		for sel, selection := range info.Selections {
			if m := rpcOf(selection, known); m != "" {
				if s.calls[path] == nil {
					s.calls[path] = map[string]string{}
				}
				s.calls[path][m] = fset.Position(sel.Pos()).String()
			}
		}
		for id, obj := range info.Uses {
			fn, ok := obj.(*types.Func)
			if !ok || fn.Pkg() == nil || !strings.HasPrefix(fn.Pkg().Path(), module+"/proto/") {
				continue
			}
			if n := id.Name; strings.HasPrefix(n, "Register") && strings.Contains(n, "ServiceHandler") && !strings.HasSuffix(n, "HandlerServer") {
				s.registers[path] = append(s.registers[path], fn.Pkg().Path())
			}
		}
	}
	return s
}

// rpcOf is the full method name of the RPC a method selection calls, or "".
func rpcOf(sel *types.Selection, known map[rpc]string) string {
	if sel.Kind() != types.MethodVal || !types.IsInterface(sel.Recv()) {
		return ""
	}
	if n, ok := types.Unalias(sel.Recv()).(*types.Named); ok && strings.HasSuffix(n.Obj().Name(), "ServiceServer") {
		return "" // a generated handler interface: in-process, not a call
	}
	sig := sel.Obj().Type().(*types.Signature)
	for i := range sig.Params().Len() {
		ptr, ok := sig.Params().At(i).Type().(*types.Pointer)
		if !ok {
			continue
		}
		named, ok := types.Unalias(ptr.Elem()).(*types.Named)
		if !ok || named.Obj().Pkg() == nil {
			continue
		}
		if m, ok := known[rpc{named.Obj().Pkg().Path(), sel.Obj().Name(), named.Obj().Name()}]; ok {
			return m
		}
	}
	return ""
}

// callsOf is every RPC made under root's identity, each with where: the
// calls of root and of the packages it imports, transitively, except
// those reached through another service package.
func (s *scan) callsOf(root string) map[string]string {
	deps := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		if _, service := identities[p]; deps[p] || (service && p != root) {
			return
		}
		deps[p] = true
		for _, q := range s.imports[p] {
			walk(q)
		}
	}
	walk(root)
	out := map[string]string{}
	for p := range deps {
		if strings.HasPrefix(p, module+"/proto/") {
			continue // counted below, for the binaries that register the routes
		}
		for m, at := range s.calls[p] {
			out[m] = at
		}
		for _, proto := range s.registers[p] {
			for m, at := range s.calls[proto] {
				out[m] = at + " (a REST route registered in " + p + ")"
			}
		}
	}
	return out
}

// TestTableMatchesTheCallSites fails when a service calls an RPC the table
// does not allow it, when the table allows a service an RPC no code of it
// calls, when a harness calls what Conformance may not, and when another
// command calls a volplane RPC at all.
func TestTableMatchesTheCallSites(t *testing.T) {
	// The shipped commands (cmd/) and the harness commands (test/cmd/).
	var cmds []string
	for _, dir := range []string{"cmd", "test/cmd"} {
		found, err := filepath.Glob(filepath.Join("..", "..", dir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		if len(found) == 0 {
			t.Fatalf("no command under %s: the layout changed, update this test", dir)
		}
		for _, c := range found {
			cmds = append(cmds, dir+"/"+filepath.Base(c))
		}
	}
	// The services' own commands, and every other command.
	others := []string{module + "/services/watcher/cmd/watcher", module + "/services/binder/cmd/binder",
		module + "/services/provisioner/cmd/provisioner", module + "/services/reclaimer/cmd/reclaimer", module + "/gateway/cmd/gateway"}
	for _, c := range cmds {
		p := module + "/" + c
		if !slices.Contains(harnesses, p) {
			others = append(others, p)
		}
	}
	roots := append(append(append([]string{}, harnesses...), others...), keys(identities)...)
	s := scanModule(t, roots)
	table := callers.Default()

	for _, m := range rpcs(t) {
		if len(table[m]) == 0 {
			t.Errorf("%s has no table entry", m)
		}
	}
	for root, id := range identities {
		calls := s.callsOf(root)
		for m, at := range calls {
			if !slices.Contains(table[m], id) {
				t.Errorf("%s calls %s (%s) but the table does not allow it", id, m, at)
			}
		}
		for m, ids := range table {
			if slices.Contains(ids, id) {
				if _, ok := calls[m]; !ok {
					t.Errorf("the table allows %s to call %s, but no code of %s does", id, m, root)
				}
			}
		}
	}
	for _, main := range harnesses {
		for m, at := range s.callsOf(main) {
			if !table.Allowed(m, callers.Conformance) {
				t.Errorf("%s calls %s (%s) but the table does not allow %s to", main, m, at, callers.Conformance)
			}
		}
	}
	for _, main := range others {
		for m, at := range s.callsOf(main) {
			t.Errorf("%s calls %s (%s): give it an identity (a certificate name) and table entries", main, m, at)
		}
	}
}

// TestTheScanSeesCalls keeps the scan honest: calls known to exist are
// found where they are.
func TestTheScanSeesCalls(t *testing.T) {
	s := scanModule(t, []string{module + "/services/binder", module + "/gateway", module + "/services/reclaimer"})
	for root, want := range map[string][]string{
		module + "/services/binder": {
			provisionerv1.ProvisionerService_Provision_FullMethodName,  // services/binder/provision.go
			reclaimerv1.ReclaimerService_Reclaim_FullMethodName,        // services/binder/run.go
			watcherv1.WatcherService_Watch_FullMethodName,              // pkg/watchclient
			binderv1.BinderService_SyncClaim_FullMethodName,            // forwarded to a peer
			provisionerv1.ProvisionerService_PlanVolume_FullMethodName, // MatchClaim
		},
		module + "/gateway": {
			provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName, // a REST route
			watcherv1.WatcherService_Watch_FullMethodName,
		},
		module + "/services/reclaimer": {
			provisionerv1.ProvisionerService_DeleteVolume_FullMethodName,
			reclaimerv1.ReclaimerService_RetryReclaim_FullMethodName, // forwarded
		},
	} {
		calls := s.callsOf(root)
		for _, m := range want {
			if _, ok := calls[m]; !ok {
				t.Errorf("the scan misses %s's call of %s; it found %v", root, m, sorted(calls))
			}
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(m map[string]string) []string { return keys(m) }
