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
// cluster-dev overlay's hostPath): volumes/<volume ID>/ each.
const devDriverRoot = "/var/lib/volplane-csi"

// wantReplicas are the pods the installed overlay runs, by app label: the
// base manifests' replica counts, and the node plugin on the one node.
var wantReplicas = map[string]int{
	"volplane-etcd":        3,
	"volplane-watcher":     2,
	"volplane-binder":      2,
	"volplane-provisioner": 2,
	"volplane-reclaimer":   2,
	"volplane-gateway":     2,
	"volplane-csi-node":    1,
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

// TestCluster installs volplane into the running cluster by
// docs/install.md's steps (kube-controller-manager's binder turned off
// on the way) and checks, in order, that: every component runs as pods
// with the manifests' probes, RBAC and replica counts; workloads keep
// their data; faults of every volplane pod, the kubelet and the runtime
// lose nothing; the defects of issue 24 are fixed; volplane notices
// kube-controller-manager's binder turned back on, and the rollback of
// docs/install.md works.
//
// Each part runs alone too, on a cluster where volplane is installed
// (go test -run 'TestCluster/workloads'): only install and cutover change
// what is installed.
func TestCluster(t *testing.T) {
	dir := clusterDir()
	workDir := filepath.Join(dir, "install")
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		t.Fatal(err)
	}
	in := newInstall(t, map[string]string{
		"PATH":            filepath.Dir(c.KubectlBin) + ":" + binDir(t) + ":" + os.Getenv("PATH"),
		"KUBECONFIG":      c.Kubeconfig,
		"OVERLAY":         filepath.Join(repoRoot(t), "deploy/overlays/cluster-dev"),
		"VOLPLANE_CA_DIR": filepath.Join(dir, "volplane-ca"),
		"CLUSTER_CA":      filepath.Join(dir, "pki/ca.crt"),
		"KCM_MANIFEST":    filepath.Join(dir, "manifests/kube-controller-manager.yaml"),
	})
	in.dir = workDir
	timed := func(name string, f func(t *testing.T)) bool {
		start, ran := time.Now(), false
		ok := t.Run(name, func(t *testing.T) { ran = true; f(t) })
		if ran {
			t.Logf("TestCluster/%s: %v", name, time.Since(start).Round(time.Second))
		}
		return ok
	}
	if !timed("install", func(t *testing.T) { testInstall(t, in) }) {
		return
	}
	timed("workloads", testWorkloads)
	timed("faults", testFaults)
	timed("defects", testDefects)
	timed("cutover", func(t *testing.T) { testCutover(t, in) })
}

// testInstall runs docs/install.md's install: kube-controller-manager's
// binder off, the overlay and the certificates, the checks.
func testInstall(t *testing.T, in *Install) {
	in.Run(t, "prerequisites")
	in.Run(t, "find-sidecars")
	if out := c.Kubectl(t, "-n", "kube-system", "get", "pods", "-l", "component=kube-controller-manager", "-o",
		"jsonpath={.items[*].spec.containers[0].command}"); strings.Contains(out, "-persistentvolume-binder-controller") {
		t.Logf("kube-controller-manager's binder is already off (make cluster's default): the cutover step leaves it so")
	}
	in.Run(t, "kcm-binder-off")
	in.Run(t, "kcm-wait")
	kcmBinderOff(t, true)
	start := time.Now()
	in.Run(t, "apply")
	in.Run(t, "rollout")
	t.Logf("installed (apply to every component rolled out) in %v", time.Since(start).Round(time.Second))
	requireVolplaneReady(t)
	t.Logf("kubectl get pods -n %s -o wide:\n%s", volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
	in.Run(t, "gateway")
	in.Run(t, "check-claim")
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

// volplaneNotReady says what of wantReplicas is not Running and Ready
// ("" when everything is).
func volplaneNotReady(t testing.TB) string {
	have := map[string]int{}
	var notReady []string
	for _, p := range listPods(t, volplaneNS, "") {
		if !p.Ready {
			notReady = append(notReady, p.Name)
			continue
		}
		have[p.App]++
	}
	var missing []string
	for app, n := range wantReplicas {
		if have[app] != n {
			missing = append(missing, fmt.Sprintf("%s %d/%d", app, have[app], n))
		}
	}
	if len(missing) == 0 {
		return ""
	}
	sort.Strings(missing)
	return fmt.Sprintf("Ready: %s; not Ready: %v", strings.Join(missing, ", "), notReady)
}

// requireVolplaneReady waits for every component's pods, at the
// manifests' replica counts, to be Ready.
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
