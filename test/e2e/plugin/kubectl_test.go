package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/test/harness/e2e"
)

// complete runs `__complete args...`, what kubectl_complete-volplane runs
// for kubectl, and returns the completions.
func complete(t *testing.T, kc string, args ...string) []string {
	t.Helper()
	out, _, err := plugin(t, kc, append([]string{cobra.ShellCompRequestCmd}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var comps []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(l, ":") {
			comps = append(comps, strings.SplitN(l, "\t", 2)[0])
		}
	}
	return comps
}

// What a kubectl user expects of the plugin, against the real stack:
// -o jsonpath, go-template, name, --no-headers, help per command, shell
// completion scripts and completion of names from the API server and the
// gateway.
func TestPluginAsKubectl(t *testing.T) {
	ctx := t.Context()
	ns := e2e.Namespace(t, cluster.client)
	kc := users(t, ns)
	for _, name := range []string{"alpha", "beta"} {
		// No class and no volume: Pending for good.
		if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, name, "1Gi", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e2e.Eventually(t, time.Minute, func() string {
		out, _, err := plugin(t, kc, append(gatewayFlags(), "claims", "-o", "jsonpath={.claims[*].name}")...)
		if err != nil || out != "alpha beta" {
			return fmt.Sprintf("claims: %v %q", err, out)
		}
		return ""
	})
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"jsonpath":          {[]string{"claims", "-o", `jsonpath={range .claims[*]}{.namespace}/{.name} {.phase}{"\n"}{end}`}, ns + "/alpha Pending\n" + ns + "/beta Pending\n"},
		"go-template":       {[]string{"claims", "-o", "go-template={{range .claims}}{{.name}},{{end}}"}, "alpha,beta,"},
		"name":              {[]string{"claims", "-o", "name"}, "persistentvolumeclaim/alpha\npersistentvolumeclaim/beta\n"},
		"explain, name":     {[]string{"explain", "pvc", "beta", "-o", "name"}, "persistentvolumeclaim/beta\n"},
		"explain, jsonpath": {[]string{"explain", "pvc", "alpha", "-o", "jsonpath={.decision}"}, "DECISION_NO_MATCH"},
	} {
		t.Run(name, func(t *testing.T) {
			out, errOut, err := plugin(t, kc, append(gatewayFlags(), tc.args...)...)
			if err != nil || out != tc.want {
				t.Errorf("%v: %v %q, want %q\n%s", tc.args, err, out, tc.want, errOut)
			}
		})
	}
	t.Run("--no-headers", func(t *testing.T) {
		rows := table(t, kc, "claims", "--no-headers")
		if len(rows) != 2 || rows[0][0] != "alpha" || rows[1][0] != "beta" || rows[0][1] != "Pending" {
			t.Errorf("claims --no-headers: %q", rows)
		}
		rows = table(t, kc, "claims", "--no-headers", "-o", "wide")
		if len(rows) != 2 || len(rows[0]) != 11 {
			t.Errorf("claims --no-headers -o wide: %q", rows)
		}
	})
	t.Run("help per command", func(t *testing.T) {
		root, _, err := plugin(t, kc, "--help")
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range [][]string{{"claims"}, {"explain"}, {"sync"}, {"reclaims", "retry"}, {"orphans", "delete"}, {"volumes", "delete-backing"}} {
			out, _, err := plugin(t, kc, append(slices.Clone(cmd), "--help")...)
			if err != nil || out == root || !strings.Contains(out, "Usage:\n  kubectl volplane "+strings.Join(cmd, " ")) || !strings.Contains(out, "Examples:\n") {
				t.Errorf("%v --help: %v\n%s", cmd, err, out)
			}
		}
	})
	t.Run("completion scripts", func(t *testing.T) {
		for shell, want := range map[string]string{"bash": "__start_kubectl-volplane", "zsh": "#compdef kubectl-volplane", "fish": "complete -c kubectl-volplane"} {
			out, _, err := plugin(t, kc, "completion", shell)
			if err != nil || !strings.Contains(out, want) {
				t.Errorf("completion %s: %v, lacks %q", shell, err, want)
			}
		}
	})
	t.Run("completion", func(t *testing.T) {
		// Namespaces from the API server (the viewer may not list them:
		// the admin's context).
		if got := complete(t, kc, append(gatewayFlags(), "claims", "--context", "admin", "-n", ns[:len(ns)-2])...); !slices.Contains(got, ns) {
			t.Errorf("-n: %q, want %s", got, ns)
		}
		// Claims from the gateway, in the context's namespace.
		if got := complete(t, kc, append(gatewayFlags(), "explain", "pvc", "")...); !slices.Equal(got, []string{"alpha", "beta"}) {
			t.Errorf("explain pvc: %q", got)
		}
		if got := complete(t, kc, append(gatewayFlags(), "sync", "pvc/a")...); !slices.Equal(got, []string{"pvc/alpha"}) {
			t.Errorf("sync pvc/a: %q", got)
		}
		if got := complete(t, kc, append(gatewayFlags(), "claims", "-o", "jsonp")...); !slices.Equal(got, []string{"jsonpath=", "jsonpath-as-json=", "jsonpath-file="}) {
			t.Errorf("-o: %q", got)
		}
		// A credential the gateway refuses completes nothing, quietly.
		if got := complete(t, kc, append(gatewayFlags(), "--user", "nobody", "explain", "pvc", "")...); len(got) != 0 {
			t.Errorf("as nobody: %q", got)
		}
	})
}

// explain of a claim with candidates: the decision and its reason, the
// claim, the candidates table with the rule that rejects each, the
// provisioning side of a class that does not exist; nothing unset.
func TestPluginExplainLayout(t *testing.T) {
	ctx := t.Context()
	ns := e2e.Namespace(t, cluster.client)
	kc := users(t, ns)
	class := "explain-" + ns
	for name, v := range map[string]struct {
		size string
		mode corev1.PersistentVolumeAccessMode
	}{"small": {"512Mi", corev1.ReadWriteOnce}, "rox": {"2Gi", corev1.ReadOnlyMany}} {
		pv := e2e.Volume("explain-"+name+"-"+ns, v.size, class)
		pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{v.mode}
		if _, err := cluster.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
		})
	}
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, "waiting", "1Gi", class), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out string
	e2e.Eventually(t, time.Minute, func() string {
		var err error
		out, _, err = plugin(t, kc, append(gatewayFlags(), "explain", "pvc", "waiting")...)
		if err != nil {
			return err.Error()
		}
		if !strings.Contains(out, "Candidates (2):") {
			return "not both candidates yet:\n" + out
		}
		return ""
	})
	lines := strings.Split(out, "\n")
	if lines[0] != "Decision:  Provision" || !strings.HasPrefix(lines[1], "Reason:    no volume fits, and StorageClass \""+class+"\" does not exist") || lines[2] != "" {
		t.Errorf("explain does not open with the decision and its reason:\n%s", out)
	}
	for key, want := range map[string]string{"Claim": ns + "/waiting", "Status": "Pending", "Request": "1Gi", "Access Modes": "RWO", "StorageClass": class, "  StorageClass": class + " (not found)"} {
		if got := field(out, key); got != want {
			t.Errorf("%s: %q, want %q:\n%s", key, got, want, out)
		}
	}
	_, tbl, _ := strings.Cut(out, "Candidates (2):\n")
	tbl, _, _ = strings.Cut(tbl, "\n\n")
	var rows [][]string
	for _, l := range strings.Split(tbl, "\n") {
		if !strings.HasPrefix(l, "  ") {
			t.Errorf("table line %q is not indented", l)
		}
		rows = append(rows, splitColumns(l))
	}
	if want := []string{"RANK", "VOLUME", "CAPACITY", "ACCESS MODES", "CLASS", "REJECTED BY", "MESSAGE"}; len(rows) != 3 || !slices.Equal(rows[0], want) {
		t.Fatalf("candidates table %q, want the header %q and two rows", rows, want)
	}
	for vol, want := range map[string][]string{"explain-small-" + ns: {"512Mi", "RWO", class, "Capacity"}, "explain-rox-" + ns: {"2Gi", "ROX", class, "AccessModes"}} {
		r := row(rows, 1, vol)
		if r == nil || !slices.Equal(r[2:6], want) || r[6] == "" {
			t.Errorf("candidate %s: %q, want %q and a message", vol, r, want)
		}
	}
	noUnsetFields(t, out)
}
