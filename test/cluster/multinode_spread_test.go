package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// standaloneReplicas are the pods of volplane in standalone mode (no
// binder) by app label: the base's replica counts.
var standaloneReplicas = func() map[string]int {
	m := maps(wantReplicas, "volplane-binder", 0)
	delete(m, "volplane-binder")
	return m
}()

// installSpread installs volplane beside kube-controller-manager's binder
// as docs/install.md's managed clusters do (deploy/overlays/standalone,
// the component sidecar-drivers, two provisioners), spread over the nodes
// by the component deploy/components/spread, with capacity tracking on
// (--enable-capacity: the scheduler reads each node's room), its
// certificates by volplane-certs, and waits for every pod to be Ready.
func installSpread(t *testing.T) {
	work := filepath.Join(clusterDir(), "multinode", "volplane")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	writeKustomization(t, work, `resources: [%s]
components: [%s, %s]
replicas: [{name: volplane-provisioner, count: 2}]
patches:
  - target: {kind: Deployment, name: volplane-provisioner}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/command/-
        value: --enable-capacity
      - op: add
        path: /spec/template/spec/containers/0/command/-
        value: --capacity-namespace=volplane-system
`, "deploy/overlays/standalone", "deploy/components/sidecar-drivers", "deploy/components/spread")
	c.Kubectl(t, "apply", "-k", work)
	certs := exec.CommandContext(t.Context(), filepath.Join(binDir(t), "volplane-certs"),
		"--state-dir", filepath.Join(clusterDir(), "volplane-ca"), "--client-ca-file", filepath.Join(clusterDir(), "pki/ca.crt"))
	secrets, err := certs.Output()
	if err != nil {
		t.Fatalf("volplane-certs: %v", err)
	}
	if out, err := c.Run(t.Context(), string(secrets), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying volplane-certs' Secrets: %v\n%s", err, out)
	}
	start := time.Now()
	waitFor(t, 6*time.Minute, func() string { return notReadyIn(t, volplaneNS, standaloneReplicas) })
	t.Logf("volplane (standalone, spread) Ready in %v", time.Since(start).Round(time.Second))
}

// checkSpread checks that each service's replicas run on distinct nodes
// and etcd's members in distinct zones, and logs kubectl get pods -o wide.
func checkSpread(t *testing.T) {
	t.Logf("kubectl get pods -n %s -o wide:\n%s", volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
	zoneOf := nodeZones(t)
	rows := [][]string{{"SERVICE", "NODES", "ZONES"}}
	apps := make([]string, 0, len(standaloneReplicas))
	for app := range standaloneReplicas {
		apps = append(apps, app)
	}
	sort.Strings(apps)
	for _, app := range apps {
		nodes := podNodes(t, app)
		var zones []string
		for _, n := range nodes {
			zones = append(zones, zoneOf[n])
		}
		rows = append(rows, []string{app, strings.Join(nodes, ","), strings.Join(zones, ",")})
		if len(nodes) != standaloneReplicas[app] || len(slices.Compact(slices.Clone(nodes))) != len(nodes) {
			t.Errorf("%s: replicas on nodes %v, want %d on distinct nodes", app, nodes, standaloneReplicas[app])
		}
		if app == "volplane-etcd" {
			slices.Sort(zones)
			if len(slices.Compact(zones)) != len(nodes) {
				t.Errorf("etcd's members are in zones %v: want one zone each", zones)
			}
		}
	}
	t.Logf("volplane's replicas by node and zone:\n%s", table(rows))
}

// nodeZones maps each node to its zone label.
func nodeZones(t *testing.T) map[string]string {
	nodes, err := c.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		out[n.Name] = n.Labels[zoneLabel]
	}
	return out
}

// podNodes are the nodes of app's scheduled pods in volplane's
// namespace, sorted (a node once per pod).
func podNodes(t *testing.T, app string) []string {
	pods, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
			nodes = append(nodes, p.Spec.NodeName)
		}
	}
	sort.Strings(nodes)
	return nodes
}

// pdbWatch samples volplane's PodDisruptionBudgets while a drain runs and
// keeps, per budget, the fewest healthy pods seen and its minimum.
type pdbWatch struct {
	mu      sync.Mutex
	fewest  map[string]int32
	desired map[string]int32
	samples int
}

// watchPDBs samples the budgets every 200ms until ctx ends.
func watchPDBs(ctx context.Context, t *testing.T) *pdbWatch {
	w := &pdbWatch{fewest: map[string]int32{}, desired: map[string]int32{}}
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			list, err := c.Client.PolicyV1().PodDisruptionBudgets(volplaneNS).List(ctx, metav1.ListOptions{})
			if err == nil {
				w.mu.Lock()
				w.samples++
				for _, b := range list.Items {
					if f, ok := w.fewest[b.Name]; !ok || b.Status.CurrentHealthy < f {
						w.fewest[b.Name] = b.Status.CurrentHealthy
					}
					w.desired[b.Name] = b.Status.DesiredHealthy
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// check fails the test for each budget whose healthy pods fell below its
// minimum, and logs the fewest seen.
func (w *pdbWatch) check(t *testing.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rows := [][]string{{"PDB", "MIN AVAILABLE", "FEWEST HEALTHY SEEN"}}
	names := make([]string, 0, len(w.fewest))
	for n := range w.fewest {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		rows = append(rows, []string{n, fmt.Sprint(w.desired[n]), fmt.Sprint(w.fewest[n])})
		if w.fewest[n] < w.desired[n] {
			t.Errorf("PodDisruptionBudget %s: %d healthy pods seen, below its minimum %d", n, w.fewest[n], w.desired[n])
		}
	}
	t.Logf("volplane's PodDisruptionBudgets during the drains (%d samples):\n%s", w.samples, table(rows))
}

// drainNode runs kubectl drain on node (DaemonSets ignored, emptyDir data
// deleted: etcd's members are on emptyDir and replace themselves) and
// returns its output and error.
func drainNode(ctx context.Context, node string, timeout time.Duration) (string, error) {
	return c.Run(ctx, "", "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
		"--timeout="+timeout.String())
}

// testDrain drains the node holding the most of volplane's pods while a
// claim binds, checks that every service is Ready again elsewhere (etcd
// at two members: the third has no other node), then drains a second
// node, whose etcd member the budget must keep (the drain gives up on
// it), uncordons both, and waits until volplane, etcd and the spread
// StatefulSet in ns are whole again. Every budget is sampled throughout.
func testDrain(t *testing.T, names []string, ns string) {
	first, second := drainOrder(t, names)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	w := watchPDBs(ctx, t)
	defer func() {
		c.Kubectl(t, "uncordon", first)
		c.Kubectl(t, "uncordon", second)
	}()
	claimNS := c.Namespace(t)
	out, err := drainWithClaim(t, claimNS, "during-first", first, 5*time.Minute)
	t.Logf("kubectl drain %s:\n%s", first, out)
	if err != nil {
		t.Fatalf("kubectl drain %s: %v", first, err)
	}
	want := maps(standaloneReplicas, "volplane-etcd", 2)
	waitFor(t, 5*time.Minute, func() string { return readyCounts(t, want) })
	t.Logf("after draining %s: kubectl get pods -n %s -o wide:\n%s", first, volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
	out, err = drainWithClaim(t, claimNS, "during-second", second, 45*time.Second)
	t.Logf("kubectl drain %s (etcd down to 2 members: its budget allows none to go):\n%s", second, out)
	// kubectl writes its eviction retries ("Cannot evict pod as it would
	// violate the pod's disruption budget") to stderr, which Run returns
	// in the error.
	if err == nil || !strings.Contains(err.Error(), "disruption budget") {
		t.Errorf("kubectl drain %s did not stop at etcd's PodDisruptionBudget: %v", second, err)
	}
	if got := len(readyPods(t, "volplane-etcd")); got != 2 {
		t.Errorf("after the second drain %d etcd members are Ready, want 2", got)
	}
	c.Kubectl(t, "uncordon", first)
	c.Kubectl(t, "uncordon", second)
	waitFor(t, 6*time.Minute, func() string { return notReadyIn(t, volplaneNS, standaloneReplicas) })
	stop()
	w.check(t)
	// Claim "after" was read once its pod ran (drainWithClaim); its pod
	// is a bare pod, which the second drain (--force) deletes when it is
	// on that node, so the data that must outlive both drains is the
	// StatefulSet's, whose pods come back.
	readSpread(t, ns)
	t.Logf("uncordoned: kubectl get pods -n %s -o wide:\n%s", volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
}

// drainOrder picks the node with the most of volplane's pods first (ties
// by name), and another as second.
func drainOrder(t *testing.T, names []string) (first, second string) {
	count := map[string]int{}
	for app := range standaloneReplicas {
		for _, n := range podNodes(t, app) {
			count[n]++
		}
	}
	sorted := slices.Clone(names)
	sort.SliceStable(sorted, func(i, j int) bool { return count[sorted[i]] > count[sorted[j]] })
	t.Logf("volplane's pods per node %v: drain %s, then %s", count, sorted[0], sorted[1])
	return sorted[0], sorted[1]
}

// drainWithClaim drains node while a claim (name, WaitForFirstConsumer,
// with a pod) is created, and waits until the claim's pod reads its data
// once the drain returned; then a claim "after" is created too (the
// first time). It returns the drain's output and error.
func drainWithClaim(t *testing.T, ns, name, node string, timeout time.Duration) (string, error) {
	type result struct {
		out string
		err error
	}
	// Cordoned first, so that the claim's pod is not placed on the node
	// the drain then empties.
	c.Kubectl(t, "cordon", node)
	done := make(chan result, 1)
	go func() {
		out, err := drainNode(t.Context(), node, timeout)
		done <- result{out, err}
	}()
	c.Apply(t, ns, claimManifest(name, classWFFC, "10Mi", "", "")+"---"+claimPod(name, name, name))
	r := <-done
	readClaim(t, ns, name, name)
	if name == "during-first" {
		c.Apply(t, ns, claimManifest("after", classWFFC, "10Mi", "", "")+"---"+claimPod("after", "after", "after"))
		readClaim(t, ns, "after", "after")
	}
	return r.out, r.err
}

// readyCounts says which apps do not have exactly want's Ready pods in
// volplane's namespace ("" when all do); pods not Ready are allowed.
func readyCounts(t *testing.T, want map[string]int) string {
	var missing []string
	for app, n := range want {
		if got := len(readyPods(t, app)); got != n {
			missing = append(missing, fmt.Sprintf("%s %d/%d", app, got, n))
		}
	}
	sort.Strings(missing)
	return strings.Join(missing, ", ")
}

// readyPods are app's Ready pods in volplane's namespace.
func readyPods(t *testing.T, app string) []podInfo {
	return slices.DeleteFunc(podsOf(t, app), func(p podInfo) bool { return !p.Ready })
}

// readSpread waits for the spread StatefulSet's pods in ns, those the
// drains evicted among them, and checks each reads its own name from its
// volume.
func readSpread(t *testing.T, ns string) {
	for i := range spreadReplicas {
		pod := fmt.Sprintf("spread-%d", i)
		c.WaitPodReady(t, ns, pod, 3*time.Minute)
		if got := c.Exec(t, ns, pod, "volplane-workload", "cat", "/data/id"); !strings.HasPrefix(got, pod+" ") {
			t.Errorf("pod %s reads %q from its volume after the drains", pod, got)
		}
	}
}
