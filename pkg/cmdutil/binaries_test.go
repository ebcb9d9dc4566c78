package cmdutil_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// badValue is, per binary, a command line with a value its flag refuses.
var badValue = map[string][]string{
	"binder":               {"--workers=x"},
	"provisioner":          {"--timeout=x"},
	"reclaimer":            {"--workers", "x"},
	"watcher":              {"--history-size=x"},
	"gateway":              {"--max-request-bytes=x"},
	"volplane-csi":         {"--capacity=x"},
	"volplane-csi-sidecar": {"--timeout=x"},
	"volplane-etcd-member": {"--status-port=x"},
	"volplane-etcd-backup": {"--keep=x"},
	"volplane-etcd":        {"-listen-client-url"}, // a flag without its value
	"volplane-certs":       {"--validity=x"},
	"volplane-bench":       {"-n", "x"},
	"volplane-chaos":       {"--seed=x"},
	"volplane-dev":         {"--workers=x"},
	"volplane-conformance": {"watcher", "--timeout=x"},
	"volplane-e2e-report":  {"--nope"},
}

// notCmdutil are main packages whose command line is not a Command: the
// kubectl plugin (on cobra, as kubectl's), and the image builder, pause
// and workload helpers of hack/ and test/ (but the harness commands of
// test/cmd are: harnessCmd).
var notCmdutil = regexp.MustCompile(`/cmd/kubectl-volplane$|^github.com/volplane/volplane/(hack|test)/`)

var harnessCmd = regexp.MustCompile(`^github.com/volplane/volplane/test/cmd/`)

// Every volplane binary answers --version with its name and build, opens
// --help with what it is, and answers a bad value with one line and exit
// code 2, not the whole usage.
func TestEveryBinaryCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	out, err := exec.Command("go", "list", "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "github.com/volplane/volplane/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if !notCmdutil.MatchString(p) || harnessCmd.MatchString(p) {
			pkgs = append(pkgs, p)
		}
	}
	dir := t.TempDir()
	build := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	versionLine := regexp.MustCompile(`^(\S+( \S+)?) v\S+ \(commit \S+, go\S+\)\n$`)
	for _, pkg := range pkgs {
		name := path.Base(pkg)
		t.Run(name, func(t *testing.T) {
			bin := filepath.Join(dir, name)
			run := func(args ...string) (stdout, stderr string, code int) {
				var o, e bytes.Buffer
				cmd := exec.Command(bin, args...)
				cmd.Stdout, cmd.Stderr = &o, &e
				err := cmd.Run()
				var exit *exec.ExitError
				switch {
				case errors.As(err, &exit):
					code = exit.ExitCode()
				case err != nil:
					t.Fatal(err)
				}
				return o.String(), e.String(), code
			}
			if o, e, code := run("--version"); code != 0 || !versionLine.MatchString(o) || !strings.HasPrefix(o, name+" ") || e != "" {
				t.Errorf("--version: exit %d, stdout %q, stderr %q", code, o, e)
			}
			o, e, code := run("--help")
			if code != 0 || e != "" || !strings.HasPrefix(o, name+" ") || !strings.Contains(o, "\nUsage:\n") || !strings.Contains(o, "General flags:") {
				t.Errorf("--help: exit %d, stderr %q, stdout:\n%s", code, e, o)
			}
			if first, _, _ := strings.Cut(o, "\nUsage:"); len(first) < 150 {
				t.Errorf("--help's description is %d characters: %q", len(first), first)
			}
			args, ok := badValue[name]
			if !ok {
				t.Fatalf("no bad value for %s in badValue", name)
			}
			o, e, code = run(args...)
			if code != 2 || o != "" || strings.Count(e, "\n") != 1 || !strings.Contains(e, "--help") {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line on stderr", args, code, o, e)
			}
		})
	}
	for name := range badValue {
		if !slices.ContainsFunc(pkgs, func(p string) bool { return path.Base(p) == name }) {
			t.Errorf("%s is in badValue but is no main package", name)
		}
	}
}
