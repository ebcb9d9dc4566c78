package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// upstreamProvisioner is csi-provisioner v6.3.0's image, as
	// hack/build-csi-sidecars.sh packs it and vendors' charts name it.
	upstreamProvisioner = "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0"
	// nodePlugin is the dev driver's DaemonSet (deploy/drivers/volplane-csi),
	// which the distributed form gives the provisioner too.
	nodePlugin = "volplane-csi-node"
	// spreadReplicas is the StatefulSet spread over the nodes.
	spreadReplicas = 6
	// hugeSize is more than any node's capacity (the distributed
	// DaemonSet's --node-capacity, 10Gi).
	hugeSize = "20Gi"
)

// placement is where one claim's volume went, as the cluster and the
// node's driver tell it.
type placement struct {
	// Pod is the pod using the claim and Node the node it runs on.
	Pod, Node string
	// PV is the claim's volume, Affinity the node its node affinity
	// admits, Handle the driver's volume ID.
	PV, Affinity, Handle string
	// Requisite and Preferred are the CreateVolume's accessibility
	// requirements, from the driver's "volume created" line.
	Requisite, Preferred string
	// OnHost is the node whose data directory on the host holds the
	// volume ("" none, "a,b" several).
	OnHost string
}

// provisionRun is one provisioner's run of the same claims: the
// StatefulSet's placements by claim, and the too big claim's messages.
type provisionRun struct {
	who    string
	placed map[string]placement
	huge   string
}

// testDistributed is TestMultiNode's distributed provisioning (issue
// 37): the dev driver deployed as deploy/drivers/volplane-csi-distributed
// ships it, kube-controller-manager's binder on. First with upstream's
// csi-provisioner v6.3.0 --node-deployment in each node's DaemonSet pod
// (the image swapped back, as the kustomization allows); then volplane
// installed in standalone mode (deploy/overlays/standalone with the
// components sidecar-drivers and spread, --enable-capacity) and the
// image swapped to volplane-csi-sidecar. Each run: a StatefulSet of 6 on
// the WaitForFirstConsumer class spread over the nodes gets each volume
// on its pod's node (PV node affinity, the volume's directory under that
// node's own root on the host and no other), and a claim too big for any
// node stays Pending with a message. The two runs are logged side by
// side. volplane's run is in ns, whose StatefulSet the drain then
// moves. It reports whether both runs passed.
func testDistributed(t *testing.T, names []string, ns string) bool {
	crds := os.Getenv("VOLPLANE_SNAPSHOT_CRDS")
	if crds == "" {
		t.Skip("VOLPLANE_SNAPSHOT_CRDS is not set: make test-cluster-multi sets it (the driver's VolumeSnapshotClass)")
	}
	kcmBinderOff(t, false)
	var up, vp provisionRun
	t.Run("upstream csi-provisioner --node-deployment", func(t *testing.T) {
		installDistributed(t, crds, names)
		waitCapacities(t, driverNS, names)
		up = provisionOnNodes(t, c.Namespace(t), "csi-provisioner", names, true)
	})
	if t.Failed() {
		t.FailNow()
	}
	// volplane's run is in ns, TestMultiNode's, which outlives this
	// subtest: the drain moves its StatefulSet.
	t.Run("volplane-csi-sidecar --node-deployment", func(t *testing.T) {
		installSpread(t)
		sidecar := strings.Replace(volplaneImage(t), "/volplane:", "/volplane-csi-sidecar:", 1)
		swapNodeProvisioner(t, sidecar)
		waitNodesRegistered(t, names)
		waitCapacities(t, volplaneNS, names)
		vp = provisionOnNodes(t, ns, "volplane", names, false)
	})
	logSideBySide(t, up, vp)
	return !t.Failed()
}

// installDistributed applies the snapshot CRDs and
// deploy/drivers/volplane-csi-distributed with csi-provisioner's image
// in the provisioner container, and waits for the node plugin on every
// node and the CSINodes listing the driver.
func installDistributed(t *testing.T, crds string, names []string) {
	dir, err := filepath.EvalSymlinks(crds)
	if err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "apply", "-f", dir)
	c.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/volumesnapshotclasses.snapshot.storage.k8s.io")
	work := filepath.Join(clusterDir(), "multinode", "driver")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(upstreamProvisioner, ":v")
	writeKustomization(t, work, "resources: [%s]\nimages: [{name: ghcr.io/volplane/volplane-csi-sidecar, newName: "+name+", newTag: v"+tag+"}]\n",
		"deploy/drivers/volplane-csi-distributed")
	c.Kubectl(t, "apply", "-k", work)
	c.Kubectl(t, "-n", driverNS, "rollout", "status", "daemonset/"+nodePlugin, "--timeout=3m")
	waitFor(t, 2*time.Minute, func() string {
		csinodes, err := c.Client.StorageV1().CSINodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		var with []string
		for _, n := range csinodes.Items {
			for _, d := range n.Spec.Drivers {
				if d.Name == devDriverName {
					with = append(with, n.Name)
				}
			}
		}
		if len(with) != len(names) {
			return fmt.Sprintf("CSINodes listing %s: %v, want %v", devDriverName, with, names)
		}
		return ""
	})
	t.Logf("the driver's DaemonSet, csi-provisioner's image:\n%s", c.Kubectl(t, "get", "pods", "-n", driverNS, "-o", "wide"))
}

// waitCapacities waits for one CSIStorageCapacity of the
// WaitForFirstConsumer class per node in ns (csi-provisioner publishes
// them in the driver's namespace, volplane's provisioner in its own) and
// logs them.
func waitCapacities(t *testing.T, ns string, names []string) {
	waitFor(t, 3*time.Minute, func() string {
		list, err := c.Client.StorageV1().CSIStorageCapacities(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		var nodes []string
		for _, o := range list.Items {
			if o.StorageClassName == classWFFC && o.NodeTopology != nil && o.Capacity != nil {
				nodes = append(nodes, o.NodeTopology.MatchLabels["topology.hostpath.csi.volplane.io/node"])
			}
		}
		sort.Strings(nodes)
		if !slices.Equal(nodes, names) {
			return fmt.Sprintf("CSIStorageCapacities of %s in %s for nodes %v, want %v", classWFFC, ns, nodes, names)
		}
		return ""
	})
	t.Logf("kubectl get csistoragecapacities -n %s:\n%s", ns, c.Kubectl(t, "get", "csistoragecapacities", "-n", ns,
		"-o", `custom-columns=NAME:.metadata.name,CLASS:.storageClassName,NODE:.nodeTopology.matchLabels.topology\.hostpath\.csi\.volplane\.io/node,CAPACITY:.capacity`))
}

// spreadStatefulSet is a StatefulSet of spreadReplicas on the
// WaitForFirstConsumer class whose pods the scheduler must spread evenly
// over the nodes (maxSkew 1, DoNotSchedule), each writing its name into
// its volume.
func spreadStatefulSet(name, nonce string) string {
	spread := fmt.Sprintf("      topologySpreadConstraints:\n"+
		"        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: %s}}}\n", name)
	return strings.Replace(statefulSet(name, classWFFC, nonce, spreadReplicas), "      containers:\n", spread+"      containers:\n", 1)
}

// provisionOnNodes runs the StatefulSet and the too big claim in ns with
// whoever provisions now (who), checks every placement, and, with clean,
// deletes both and waits until their volumes are gone from the drivers.
func provisionOnNodes(t *testing.T, ns, who string, names []string, clean bool) provisionRun {
	nonce := randomSuffix()
	c.Apply(t, ns, spreadStatefulSet("spread", nonce))
	readIDs(t, ns, "spread", nonce, spreadReplicas)
	run := provisionRun{who: who, placed: map[string]placement{}}
	perNode := map[string]int{}
	for i := range spreadReplicas {
		claim := fmt.Sprintf("data-spread-%d", i)
		p := placeOf(t, ns, claim, fmt.Sprintf("spread-%d", i), names)
		run.placed[claim] = p
		perNode[p.Node]++
		if p.Affinity != p.Node || p.OnHost != p.Node {
			t.Errorf("%s: claim %s's pod runs on %s, its PV %s admits %q, its volume %s is under the host's directories of %q",
				who, claim, p.Node, p.PV, p.Affinity, p.Handle, p.OnHost)
		}
	}
	for _, n := range names {
		if perNode[n] != spreadReplicas/len(names) {
			t.Errorf("%s: pods per node %v, want %d on each", who, perNode, spreadReplicas/len(names))
		}
	}
	run.huge = tooBig(t, ns)
	if clean {
		c.Kubectl(t, "delete", "statefulset", "-n", ns, "spread", "--wait=true")
		c.Kubectl(t, "delete", "pod,pvc", "-n", ns, "--all", "--wait=true")
		waitFor(t, 3*time.Minute, func() string {
			if h := volumeHandles(t); len(h) > 0 {
				return fmt.Sprintf("%s: PVs of the driver left: %v", who, h)
			}
			return ""
		})
	}
	return run
}

// placeOf reads where claim's volume went: its pod's node, its PV's node
// affinity, the driver's log line for it on the pod's node, and which
// nodes' data directories on the host hold it.
func placeOf(t *testing.T, ns, claim, pod string, names []string) placement {
	po, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvName, handle := claimVolume(t, ns, claim)
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := placement{Pod: pod, Node: po.Spec.NodeName, PV: pvName, Handle: handle, Affinity: affinityNodes(pv)}
	p.Requisite, p.Preferred = createLine(t, p.Node, handle)
	var on []string
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(clusterDir(), "nodes", n, "root", devDriverRoot, "volumes", handle)); err == nil {
			on = append(on, n)
		}
	}
	if _, err := os.Stat(filepath.Join(devDriverRoot, "volumes", handle)); err == nil {
		on = append(on, "the host itself")
	}
	p.OnHost = strings.Join(on, ",")
	return p
}

// affinityNodes are the values of the PV's required node affinity, the
// nodes it admits, comma-separated.
func affinityNodes(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	var vals []string
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			vals = append(vals, e.Values...)
		}
	}
	return strings.Join(vals, ",")
}

// createLine finds the "volume created" line of volume handle in the
// driver's log on node and returns its accessibility requirements.
func createLine(t *testing.T, node, handle string) (requisite, preferred string) {
	pods, err := c.Client.CoreV1().Pods(driverNS).List(t.Context(), metav1.ListOptions{
		LabelSelector: "app=" + nodePlugin, FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the node plugin on %s: %d pods, %v", node, len(pods.Items), err)
	}
	logs := c.Kubectl(t, "logs", "-n", driverNS, pods.Items[0].Name, "-c", "csi-node")
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "volume created") && strings.Contains(l, "volume="+handle) {
			return logValue(l, "requisite"), logValue(l, "preferred")
		}
	}
	t.Errorf("no \"volume created\" line of %s in the driver's log on %s", handle, node)
	return "?", "?"
}

// logValue is key's value in a slog text line (quoted or not).
func logValue(line, key string) string {
	_, rest, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	if strings.HasPrefix(rest, `"`) {
		end := strings.Index(rest[1:], `"`)
		if end < 0 {
			return rest[1:]
		}
		return rest[1 : end+1]
	}
	v, _, _ := strings.Cut(rest, " ")
	return v
}

// tooBig creates a claim of hugeSize on the WaitForFirstConsumer class
// with a pod, waits until the scheduler says why the pod cannot go
// anywhere, checks that the claim is Pending, and returns the pod's and
// the claim's Events.
func tooBig(t *testing.T, ns string) string {
	c.Apply(t, ns, claimManifest("huge", classWFFC, hugeSize, "", "")+"---"+claimPod("huge", "huge", ""))
	var msgs string
	waitFor(t, 2*time.Minute, func() string {
		msgs = eventsOf(t, ns, "huge")
		if !strings.Contains(msgs, "FailedScheduling") {
			return "no FailedScheduling event for pod huge yet: " + msgs
		}
		return ""
	})
	if p := claimPhase(t, ns, "huge"); p != "Pending" {
		t.Errorf("claim huge of %s is %s, want Pending", hugeSize, p)
	}
	return msgs
}

// eventsOf are the reasons and messages of the Events of the objects
// called name in ns, one a line.
func eventsOf(t *testing.T, ns, name string) string {
	list, err := c.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range list.Items {
		lines = append(lines, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Kind, e.Reason, e.Message))
	}
	sort.Strings(lines)
	return strings.Join(slices.Compact(lines), "\n")
}

// logSideBySide logs the two runs' placements claim by claim, and their
// too big claims' messages.
func logSideBySide(t *testing.T, up, vp provisionRun) {
	rows := [][]string{{"CLAIM", "NODE (" + up.who + ")", "PV AFFINITY", "ON HOST", "NODE (" + vp.who + ")", "PV AFFINITY", "ON HOST",
		"REQUISITE (" + up.who + ")", "REQUISITE (" + vp.who + ")", "PREFERRED (" + up.who + ")", "PREFERRED (" + vp.who + ")"}}
	for i := range spreadReplicas {
		claim := fmt.Sprintf("data-spread-%d", i)
		u, v := up.placed[claim], vp.placed[claim]
		rows = append(rows, []string{claim, u.Node, u.Affinity, u.OnHost, v.Node, v.Affinity, v.OnHost, u.Requisite, v.Requisite, u.Preferred, v.Preferred})
		if u.Requisite != "" && v.Requisite != "" && (strings.ReplaceAll(u.Requisite, u.Node, "NODE") != strings.ReplaceAll(v.Requisite, v.Node, "NODE") ||
			strings.ReplaceAll(u.Preferred, u.Node, "NODE") != strings.ReplaceAll(v.Preferred, v.Node, "NODE")) {
			t.Errorf("claim %s: the CreateVolume requirements differ beyond the node: %s %s (%s) against %s %s (%s)",
				claim, u.Requisite, u.Preferred, up.who, v.Requisite, v.Preferred, vp.who)
		}
	}
	t.Logf("the StatefulSet of %d on %s, spread over the nodes, by each provisioner:\n%s", spreadReplicas, classWFFC, table(rows))
	t.Logf("claim huge (%s, more than any node's capacity), its pod's and its Events:\n  %s:\n    %s\n  %s:\n    %s", hugeSize,
		up.who, strings.ReplaceAll(up.huge, "\n", "\n    "), vp.who, strings.ReplaceAll(vp.huge, "\n", "\n    "))
}

// volplaneImage is the volplane image the node plugin's driver container
// runs (hack/cluster imports it with the sidecar's, of the same VERSION).
func volplaneImage(t *testing.T) string {
	return c.Kubectl(t, "get", "daemonset", "-n", driverNS, nodePlugin, "-o", `jsonpath={.spec.template.spec.containers[?(@.name=="csi-node")].image}`)
}

// swapNodeProvisioner sets the DaemonSet's csi-provisioner image and
// waits for the rollout on every node; csi-provisioner's own
// CSIStorageCapacity objects, which it leaves behind, are deleted.
func swapNodeProvisioner(t *testing.T, image string) {
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, provisionerSidecar, image)
	c.Kubectl(t, "patch", "daemonset", "-n", driverNS, nodePlugin, "--type=strategic", "-p", patch)
	c.Kubectl(t, "-n", driverNS, "rollout", "status", "daemonset/"+nodePlugin, "--timeout=3m")
	c.Kubectl(t, "delete", "csistoragecapacities", "-n", driverNS, "--all")
	t.Logf("the driver's DaemonSet, %s:\n%s", image, c.Kubectl(t, "get", "pods", "-n", driverNS, "-o", "wide"))
}

// waitNodesRegistered waits until every provisioner replica logged a
// registration of the driver's sidecar on each node.
func waitNodesRegistered(t *testing.T, names []string) {
	waitFor(t, 3*time.Minute, func() string {
		pods := podsOf(t, "volplane-provisioner")
		if len(pods) == 0 {
			return "no provisioner pods"
		}
		for _, p := range pods {
			out, _ := c.Run(t.Context(), "", "logs", "-n", volplaneNS, p.Name)
			var nodes []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "volplane-csi-sidecar registered") && strings.Contains(l, "driver="+devDriverName) {
					nodes = append(nodes, logValue(l, "node"))
				}
			}
			slices.Sort(nodes)
			if nodes = slices.Compact(nodes); !slices.Equal(nodes, names) {
				return fmt.Sprintf("provisioner %s has the sidecars of nodes %v, want %v", p.Name, nodes, names)
			}
		}
		return ""
	})
}
