package cluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// volplaneNS is where the overlay installs volplane.
const volplaneNS = "volplane-system"

// devDriverRoot is the dev CSI driver's data directory on the node (the
// hostPath of deploy/drivers/volplane-csi's controller and node plugin):
// volumes/<volume ID>/ each, and its own record of them under state/.
const devDriverRoot = "/var/lib/volplane-csi"

// wantReplicas are the pods of the installed overlay (cluster-dev) once
// volplane binds, by app label: the base manifests' replica counts. No
// driver: the drivers run in their own pods (driverReplicas).
var wantReplicas = map[string]int{
	"volplane-etcd":        3,
	"volplane-watcher":     2,
	"volplane-binder":      2,
	"volplane-provisioner": 2,
	"volplane-reclaimer":   2,
	"volplane-gateway":     2,
}

// driverReplicas are the pods of the dev driver deployed as a vendor's
// chart does (deploy/drivers/volplane-csi), in driverNS: its controller
// Deployment and its node plugin on the one node.
var driverReplicas = map[string]int{
	"volplane-csi-controller": 2,
	"volplane-csi-node":       1,
}

// clusterDir is the cluster's state directory (make cluster's CLUSTER_DIR).
func clusterDir() string {
	if d := os.Getenv("VOLPLANE_CLUSTER_DIR"); d != "" {
		return d
	}
	return "/var/lib/volplane-cluster"
}

// binDir holds volplane-certs and kubectl-volplane (make test-cluster
// builds them into the tree's bin/).
func binDir(t testing.TB) string {
	if d := os.Getenv("VOLPLANE_BIN"); d != "" {
		return d
	}
	return filepath.Join(repoRoot(t), "bin")
}

// TestCluster is the local cluster's one test of volplane, on one
// fresh cluster (make test-cluster), in phases that build on each other:
//
//   - before: the dev CSI driver deployed as a vendor's chart deploys a
//     driver, with the upstream sidecars built from their pinned modules
//     (deploy/drivers/volplane-csi, the VolumeSnapshot CRDs and the
//     snapshot controller), next to kube-controller-manager's binder and
//     without volplane: workloads write, csi-resizer expands, Delete and
//     Retain, csi-provisioner's image swapped to itself and back, nothing
//     leaks;
//   - install: volplane installed by docs/install.md's steps beside the
//     driver, Ready with its binder at 0 while kube-controller-manager
//     binds; the flip (csi-provisioner's image to volplane-csi-sidecar's,
//     kube-controller-manager's binder off, volplane's on) and the window
//     without a binder; the install's checks;
//   - after: the data of before kept, volumes of before reclaimed by
//     volplane, new claims, restores and clones through the sidecar,
//     expansion through the untouched csi-resizer;
//   - kubernetes-e2e: Kubernetes' own storage e2e tests (e2e.test's
//     External Storage suites) on volplane through the sidecar;
//   - workloads, faults, defects: volplane's own checks, the driver in its
//     own pod (the faults kill it too);
//   - upgrade: the services set to the previous release's image, then
//     upgraded to HEAD one at a time in docs/operations.md's order and
//     rolled back the same way, with claims created and deleted and the
//     REST API polled throughout (only with VOLPLANE_PREV_IMAGE set);
//   - etcd-restore: docs/etcd.md's backup and restore drill, every etcd
//     member's data destroyed while a reclaim is in flight, restored from
//     a snapshot the backup CronJob's Job took (testRestoreDrill);
//   - rollback: volplane notices kube-controller-manager's binder turned
//     back on, then docs/install.md's rollback with csi-provisioner's
//     image back, which deletes the volumes volplane made; nothing leaks;
//   - managed: standalone mode beside kube-controller-manager's binder;
//   - cleanup: nothing left in the driver.
//
// Each phase logs a table of its steps and how long it took. A phase
// runs alone on a cluster in the state its predecessors leave (go test
// -run 'TestCluster/faults' once volplane is installed); workloads,
// faults and defects need only the install.
func TestCluster(t *testing.T) {
	crds := os.Getenv("VOLPLANE_SNAPSHOT_CRDS")
	if crds == "" {
		t.Fatal("VOLPLANE_SNAPSHOT_CRDS is not set: run make test-cluster")
	}
	// The workloads' namespace lives as long as the test, not a phase.
	w := &vendorWorkloads{ns: c.Namespace(t), nonce: randomSuffix()}
	cu := newVendorCutover(t, w)
	start := time.Now()
	var times [][]string
	phase := func(name string, independent bool, steps ...step) bool {
		began, ran := time.Now(), false
		ok := t.Run(name, func(t *testing.T) {
			ran = true
			s := &stepTable{t: t}
			defer s.print()
			for _, st := range steps {
				if !s.run(st.name, st.f) {
					return
				}
			}
		})
		if ran {
			took := time.Since(began).Round(time.Second)
			t.Logf("TestCluster/%s: %v", name, took)
			times = append(times, []string{name, took.String(), map[bool]string{true: "ok", false: "FAIL"}[ok]})
		}
		return ok || independent
	}
	defer func() {
		times = append(times, []string{"total", time.Since(start).Round(time.Second).String(), ""})
		t.Logf("TestCluster's phases:\n%s", table(append([][]string{{"PHASE", "TOOK", "RESULT"}}, times...)))
	}()
	_ = phase("before", false, cu.beforeSteps(crds)...) &&
		phase("install", false,
			step{"install volplane beside the driver (binder at 0) by docs/install.md", cu.install},
			step{"flip: sidecar's image, kcm's binder off, volplane's on", cu.flip},
			step{"docs/install.md's checks: gateway, a claim binds", cu.check}) &&
		phase("after", false,
			step{"the pods of before read their data", cu.dataKept},
			step{"volplane deletes a Delete volume of before, keeps a Retain one", cu.preVolumes},
			step{"new claim, restore, clone through the sidecar", cu.provision},
			step{"expand a claim volplane made 10Mi -> 20Mi (csi-resizer)", cu.expand}) &&
		phase("kubernetes-e2e", true, step{"Kubernetes' storage e2e tests on volplane through the sidecar", e2eStorage}) &&
		// Steps of plain words: a test's name becomes its t.TempDir().
		phase("workloads", true, step{"volplane workloads", quiet(testWorkloads)}) &&
		phase("faults", true, step{"faults under load", quiet(testFaults)}) &&
		phase("defects", true, step{"issue 24 defects", quiet(testDefects)}) &&
		phase("upgrade", true, step{"upgrade from the previous release and back with claims in flight", quiet(testUpgrade)}) &&
		phase("etcd-restore", true, step{"etcd backup and restore drill", quiet(testRestoreDrill)}) &&
		phase("rollback", false,
			step{"kcm's binder back on: volplane notices; docs/install.md's rollback", func(t *testing.T) string { return testCutover(t, cu.in) }},
			step{"csi-provisioner's image back (docs/install.md); it provisions again", cu.rollback},
			step{"csi-provisioner deletes volplane's volumes; driver volumes against PVs", cu.rollbackDeletes}) &&
		phase("managed", false, step{"kcm binds, volplane standalone provisions through the sidecar", cu.managed}) &&
		phase("cleanup", false, step{"delete everything: nothing left in the driver", cu.cleanup})
}

// step is one step of a phase of TestCluster: its name, and a function
// that returns what it saw.
type step struct {
	name string
	f    func(t *testing.T) string
}

// quiet makes a test function a step that says nothing (it logs itself).
func quiet(f func(t *testing.T)) func(t *testing.T) string {
	return func(t *testing.T) string { f(t); return "see its log" }
}

// kcmBinderOff checks kube-controller-manager's running command line.
func kcmBinderOff(t testing.TB, off bool) {
	t.Helper()
	out := c.Kubectl(t, "-n", "kube-system", "get", "pods", "-l", "component=kube-controller-manager", "-o",
		"jsonpath={.items[*].spec.containers[0].command}")
	if got := strings.Contains(out, "-persistentvolume-binder-controller"); got != off {
		t.Fatalf("kube-controller-manager's binder off: %v, want %v: %s", got, off, out)
	}
}

// podInfo is what the tests read of a pod.
type podInfo struct {
	Name, App, IP string
	Ready         bool
	Restarts      int32
	Phase         corev1.PodPhase
}

func listPods(t testing.TB, ns, selector string) []podInfo {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var out []podInfo
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		pi := podInfo{Name: p.Name, App: p.Labels["app"], IP: p.Status.PodIP, Phase: p.Status.Phase}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				pi.Ready = true
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			pi.Restarts += cs.RestartCount
		}
		out = append(out, pi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// volplaneNotReady says what of wantReplicas, and of the driver's
// driverReplicas and leader, is not Running and Ready ("" when everything
// is).
func volplaneNotReady(t testing.TB) string {
	missing := notReadyIn(t, volplaneNS, wantReplicas)
	if d := notReadyIn(t, driverNS, driverReplicas); d != "" {
		missing = strings.TrimPrefix(missing+"; the driver: "+d, "; ")
	}
	if l := driverLeaderNotReady(t); l != "" {
		missing = strings.TrimPrefix(missing+"; "+l, "; ")
	}
	return missing
}

// notReadyIn says which of the pods of ns, counted by app label, are not
// Ready, or are not as many as want says ("" when all are).
func notReadyIn(t testing.TB, ns string, want map[string]int) string {
	have := map[string]int{}
	var notReady []string
	for _, p := range listPods(t, ns, "") {
		if p.App == "volplane-etcd-backup" {
			continue // the backup CronJob's runs (docs/etcd.md): short-lived pods, no component
		}
		if !p.Ready {
			notReady = append(notReady, p.Name)
			continue
		}
		have[p.App]++
	}
	var missing []string
	for app, n := range want {
		if have[app] != n {
			missing = append(missing, fmt.Sprintf("%s %d/%d", app, have[app], n))
		}
	}
	if len(missing) == 0 && len(notReady) == 0 {
		return ""
	}
	sort.Strings(missing)
	return fmt.Sprintf("Ready: %s; not Ready: %v", strings.Join(missing, ", "), notReady)
}

// requireVolplaneReady waits for every component's pods, at the
// manifests' replica counts, and the driver's to be Ready.
func requireVolplaneReady(t testing.TB) {
	t.Helper()
	waitFor(t, 5*time.Minute, func() string { return volplaneNotReady(t) })
}

// podByApp returns the Ready pods of one component.
func podsOf(t testing.TB, app string) []podInfo {
	t.Helper()
	return listPods(t, volplaneNS, "app="+app)
}

// httpGet GETs url (plaintext: the debug and metrics ports) and returns
// the status and body.
func httpGet(ctx context.Context, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Gateway is a forwarded port to the REST gateway (kubectl port-forward,
// as docs/install.md does): the host cannot reach ClusterIPs on this
// cluster, and the gateway's certificate names localhost, not its pods'
// addresses.
type Gateway struct {
	URL, CAFile string
	client      *http.Client
}

// gateway forwards a free local port to the gateway's Service until the
// test ends.
func gateway(t testing.TB) *Gateway {
	t.Helper()
	ca := c.Kubectl(t, "-n", volplaneNS, "get", "secret", "volplane-gateway-tls", "-o", `jsonpath={.data.ca\.crt}`)
	pem, err := decodeBase64(ca)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "gateway-ca.crt")
	if err := os.WriteFile(caFile, pem, 0o644); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, c.KubectlBin, "--kubeconfig", c.Kubeconfig, "-n", volplaneNS,
		"port-forward", "svc/volplane-gateway", ":443")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case port <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case p := <-port:
		g := &Gateway{URL: "https://localhost:" + p, CAFile: caFile,
			client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
		return g
	case <-time.After(30 * time.Second):
		t.Fatal("kubectl port-forward to the gateway: no port after 30s")
	}
	return nil
}

// Readyz is the gateway's /readyz: status and body.
func (g *Gateway) Readyz(ctx context.Context) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.URL+"/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Plugin runs bin/kubectl-volplane against the gateway with the admin
// kubeconfig (a client certificate of the cluster CA, which the gateway
// trusts by docs/install.md's certificate step).
func (g *Gateway) Plugin(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args = append(args, "--kubeconfig", c.Kubeconfig, "--gateway", g.URL, "--certificate-authority", g.CAFile)
	cmd := exec.CommandContext(ctx, filepath.Join(binDirOrDefault(), "kubectl-volplane"), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl volplane %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func binDirOrDefault() string {
	if d := os.Getenv("VOLPLANE_BIN"); d != "" {
		return d
	}
	root, _ := filepath.Abs(filepath.Join("..", "..", "bin"))
	return root
}

// waitPlugin retries a plugin command until it works (the forwarded
// port's first connections, a gateway pod restarting).
func (g *Gateway) waitPlugin(t testing.TB, args ...string) string {
	t.Helper()
	var out string
	waitFor(t, time.Minute, func() string {
		var err error
		if out, err = g.Plugin(t.Context(), args...); err != nil {
			return err.Error()
		}
		return ""
	})
	return out
}

// backingVolumes lists the dev driver's volumes on the node.
func backingVolumes(t testing.TB) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(devDriverRoot, "volumes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

// volumeHandles maps the dev driver's PVs' volume handles to their names.
func volumeHandles(t testing.TB) map[string]string {
	t.Helper()
	pvs, err := c.Client.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == "hostpath.csi.volplane.io" {
			out[pv.Spec.CSI.VolumeHandle] = pv.Name
		}
	}
	return out
}

// table formats rows with aligned columns.
func table(rows [][]string) string {
	widths := map[int]int{}
	for _, r := range rows {
		for i, cell := range r {
			widths[i] = max(widths[i], len(cell))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, cell := range r {
			if i > 0 {
				b.WriteString("   ")
			}
			fmt.Fprintf(&b, "%-*s", widths[i], cell)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// metricValue sums the samples of a metric whose line contains every one
// of match (label pairs) in a Prometheus text exposition.
func metricValue(exposition, name string, match ...string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, m := range match {
			if !strings.Contains(line, m) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimSpace(s))
}
