package skew

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/chaos"
	"github.com/volplane/volplane/test/harness/devenv"
)

// services are the components the matrix sets one at a time, in the
// order docs/operations.md upgrades them (servers before their clients).
var services = []string{"watcher", "provisioner", "reclaimer", "binder", "gateway"}

// Storage classes of the checks: static hostPath volumes, and the dev CSI
// driver's volumes deleted with their claims.
const (
	staticClass  = "skew-static"
	dynamicClass = "skew-dynamic"
)

// exitNoCommit is hack/build-prev.sh's exit status when the clone lacks
// the commit.
const exitNoCommit = 3

// row is one configuration of the matrix: the services at the previous
// release (the others at HEAD).
type row struct {
	name string
	prev map[string]bool
}

// rows are the matrix: every service at HEAD and every one at the
// previous release (baselines, which tell a skew failure from a harness
// one), then each service alone at the previous release, then each alone
// at HEAD, then the two states of an upgrade in the documented order (a
// rollback in the reverse order) that neither of those covers: the first
// two and the first three services at HEAD.
func rows() []row {
	all := map[string]bool{}
	for _, s := range services {
		all[s] = true
	}
	out := []row{{name: "all at HEAD", prev: map[string]bool{}}}
	for _, s := range services {
		out = append(out, row{name: s + " at prev", prev: map[string]bool{s: true}})
	}
	out = append(out, row{name: "all at prev", prev: all})
	for _, s := range services {
		others := map[string]bool{}
		for _, o := range services {
			others[o] = o != s
		}
		out = append(out, row{name: s + " at HEAD", prev: others})
	}
	for _, k := range []int{2, 3} {
		later := map[string]bool{}
		for _, s := range services[k:] {
			later[s] = true
		}
		out = append(out, row{name: fmt.Sprintf("upgrade step %d", k), prev: later})
	}
	return out
}

// TestSkewMatrix runs every row of the matrix on one cluster, switching
// from row to row only the services whose release changes, one at a
// time, as a rolling upgrade or rollback does; every row's claims stay
// (Bound) through the rows after it.
func TestSkewMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two releases of the services as processes against a real kube-apiserver and etcd")
	}
	if _, err := devenv.FindKubeAPIServer(); err != nil {
		t.Skip(err)
	}
	commit, prevBin := buildPrev(t)
	ctx := t.Context()
	headBin := t.TempDir()
	t0 := time.Now()
	if err := chaos.Build(ctx, headBin); err != nil {
		t.Fatal(err)
	}
	t.Logf("HEAD's binaries built in %s", time.Since(t0).Round(time.Second))
	compareFlags(t, headBin, prevBin)
	m := startMatrix(t, headBin, prevBin)
	defer m.c.Stop()
	start := time.Now()
	var results []result
	all := rows()
	m.last = len(all) - 1
	for i, r := range all {
		res := m.run(i, r)
		results = append(results, res)
		t.Logf("row %d, %s: %s", i, r.name, res.summary())
	}
	var b bytes.Buffer
	printMatrix(&b, commit, results)
	t.Logf("skew matrix (previous release %s, %s for %d rows):\n%s", commit, time.Since(start).Round(time.Second), len(results), b.String())
	for _, res := range results {
		if res.failed() {
			t.Errorf("%s: %s", res.row.name, strings.Join(res.errs, "; "))
		}
	}
}

// startMatrix starts the cluster the rows run on, every service at HEAD,
// and the StorageClasses of the checks.
func startMatrix(t *testing.T, headBin, prevBin string) *matrix {
	t.Helper()
	full, err := os.ReadFile(filepath.Join(prevBin, "commit"))
	if err != nil || len(full) < 12 {
		t.Fatalf("%s/commit (hack/build-prev.sh writes it): %q %v", prevBin, full, err)
	}
	dir := t.TempDir()
	// A collector nobody listens at: with an --otlp-endpoint the reclaimer
	// at HEAD journals each reclaim's trace_parent (reclaimer.proto's field
	// 20, new since the previous release), so the previous release's
	// reclaimer takes over records that carry it (leaveInFlight). Each
	// reclaimer's stop then spends 5s trying to flush its spans
	// (pkg/replica), the longest step of a switch.
	collector, err := devenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c, err := chaos.StartCluster(t.Context(), chaos.ClusterOptions{Dir: dir, BinDir: headBin, Watchers: 1, Binders: 1, Provisioners: 1,
		Reclaimers: 1, Gateway: true, Args: map[string][]string{"reclaimer-1": {"--otlp-endpoint", "http://" + collector}}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster started in %s", time.Since(t0).Round(time.Second))
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	m := &matrix{t: t, c: c, head: headBin, prev: prevBin, prevCommit: string(full[:12]), book: chaos.NewBook()}
	m.setup()
	return m
}

// buildPrev builds (or finds cached) the previous release's services and
// returns its commit and their directory; it skips the test when the
// clone's history lacks the commit.
func buildPrev(t *testing.T) (commit, dir string) {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "hack", "prev-release"))
	if err != nil {
		t.Fatal(err)
	}
	commit = strings.TrimSpace(string(b))
	cache := os.Getenv("VOLPLANE_CACHE")
	if cache == "" {
		home, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, "volplane")
	}
	dir = filepath.Join(cache, "prev-"+commit)
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "build-prev.sh"), commit, dir)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == exitNoCommit {
		t.Skipf("SKIPPED: %s", strings.TrimSpace(string(out)))
	}
	if err != nil {
		t.Fatalf("hack/build-prev.sh: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	return commit, dir
}

// setup makes the namespace-free objects every row uses.
func (m *matrix) setup() {
	m.t.Helper()
	del := corev1.PersistentVolumeReclaimDelete
	immediate := storagev1.VolumeBindingImmediate
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: staticClass}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &immediate},
		{ObjectMeta: metav1.ObjectMeta{Name: dynamicClass}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del, VolumeBindingMode: &immediate},
	} {
		if _, err := m.c.Client.StorageV1().StorageClasses().Create(m.t.Context(), sc, metav1.CreateOptions{}); err != nil {
			m.t.Fatal(err)
		}
	}
}

// printMatrix writes the results as a table: each service's release, then
// each check's outcome and the row's time.
func printMatrix(w *bytes.Buffer, commit string, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := append([]string{"ROW"}, services...)
	for _, c := range checks {
		head = append(head, strings.ToUpper(c.name))
	}
	fmt.Fprintln(tw, strings.Join(append(head, "TIME"), "\t"))
	for _, res := range results {
		cols := []string{res.row.name}
		for _, s := range services {
			cols = append(cols, res.versions[s])
		}
		cols = append(cols, res.cells...)
		fmt.Fprintln(tw, strings.Join(append(cols, res.took.Round(100*time.Millisecond).String()), "\t"))
	}
	tw.Flush()
	fmt.Fprintf(w, "prev = %s (hack/prev-release), HEAD = this tree; each service's release is read from its own startup log line.\n", commit)
}

// dumpLogs prints the end of every process's log.
func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if len(b) > 6<<10 {
			b = b[len(b)-6<<10:]
		}
		t.Logf("---- %s (end) ----\n%s", filepath.Base(l), b)
	}
}
