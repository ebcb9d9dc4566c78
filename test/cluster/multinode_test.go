package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// zoneLabel is the well-known label of a node's zone.
const zoneLabel = "topology.kubernetes.io/zone"

// nodeNet is the bridge the nodes of a cluster of several meet on
// (hack/cluster/lib.sh's node_net): every node's address is in it.
var nodeNet = netip.MustParsePrefix("10.250.0.0/24")

// TestMultiNode checks the cluster of several nodes (make
// test-cluster-multi; hack/cluster/nodes.sh): $VOLPLANE_CLUSTER_NODES
// nodes Ready, each with its address on the cluster's bridge, spread over
// three zones; a pod on the first node reaching, by the Service's name, its
// ClusterIP and the pod's address, a server pod on the last node; and a
// DaemonSet's hostPath being each node's own: every pod finds its own
// node's file and none of another's, and on the host the files are below
// each node's directory, not in the host's. Then, with the upstream CSI
// sidecars imported ($VOLPLANE_SNAPSHOT_CRDS set), distributed
// provisioning of the dev driver by csi-provisioner --node-deployment and
// by volplane-csi-sidecar side by side (testDistributed), volplane's
// replicas on distinct nodes and etcd's in distinct zones (checkSpread),
// real drains that every PodDisruptionBudget holds while claims bind
// (testDrain), and a node holding an etcd member, alone in its zone,
// killed as by a power loss while claims bind (hack/cluster/node.sh),
// given the out-of-service taint once NotReady, and brought back
// (testKillNode). Last, a seeded storm of faults while claims come and
// go, and its table of invariants (testChaos; make chaos-cluster runs
// only the subtests it needs and this one).
func TestMultiNode(t *testing.T) {
	want, _ := strconv.Atoi(os.Getenv("VOLPLANE_CLUSTER_NODES"))
	if want < 2 {
		t.Skip("not a cluster of several nodes: make test-cluster-multi sets VOLPLANE_CLUSTER_NODES")
	}
	var names []string
	t.Run("nodes Ready in their zones", func(t *testing.T) {
		names = checkNodes(t, want)
	})
	if len(names) != want {
		t.Fatalf("no %d Ready nodes: nothing else to check", want)
	}
	ns := c.Namespace(t)
	t.Run("Service across nodes", func(t *testing.T) {
		checkServiceAcrossNodes(t, ns, names[0], names[len(names)-1])
	})
	t.Run("hostPath per node", func(t *testing.T) {
		checkHostPathPerNode(t, ns, names)
	})
	// The namespace of volplane's run of the StatefulSet is this test's,
	// not the subtest's: the drain moves its pods and reads them back.
	spreadNS := c.Namespace(t)
	var distributed bool
	t.Run("distributed provisioning", func(t *testing.T) {
		distributed = testDistributed(t, names, spreadNS)
	})
	if !distributed {
		return
	}
	t.Run("volplane spread over nodes and zones", checkSpread)
	t.Run("drain", func(t *testing.T) {
		testDrain(t, names, spreadNS)
	})
	t.Run("kill a node", func(t *testing.T) {
		testKillNode(t, names, spreadNS)
	})
	t.Run("chaos", func(t *testing.T) {
		testChaos(t, names)
	})
}

// checkNodes waits for want Ready nodes and checks their addresses and
// zones; it returns their names, sorted, and logs the nodes as `kubectl get
// nodes -L topology.kubernetes.io/zone -o wide` shows them.
func checkNodes(t *testing.T, want int) []string {
	var nodes []corev1.Node
	waitFor(t, 3*time.Minute, func() string {
		list, err := c.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		nodes = list.Items
		ready := 0
		for _, n := range nodes {
			if nodeReady(n) {
				ready++
			}
		}
		if len(nodes) != want || ready != want {
			return fmt.Sprintf("%d nodes, %d Ready; want %d Ready", len(nodes), ready, want)
		}
		return ""
	})
	t.Logf("kubectl get nodes -L %s -o wide:\n%s", zoneLabel, c.Kubectl(t, "get", "nodes", "-L", zoneLabel, "-o", "wide"))
	var names []string
	zones := map[string]int{}
	for _, n := range nodes {
		names = append(names, n.Name)
		zone := n.Labels[zoneLabel]
		if zone == "" {
			t.Errorf("node %s has no %s label", n.Name, zoneLabel)
		}
		zones[zone]++
		ip, ok := internalIP(n)
		if !ok || !nodeNet.Contains(ip) {
			t.Errorf("node %s's InternalIP %v is not on the cluster's bridge %v", n.Name, ip, nodeNet)
		}
	}
	if len(zones) != min(want, 3) {
		t.Errorf("nodes per zone %v: want %d zones", zones, min(want, 3))
	}
	slices.Sort(names)
	return names
}

func nodeReady(n corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func internalIP(n corev1.Node) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip, err := netip.ParseAddr(a.Address)
			return ip, err == nil
		}
	}
	return netip.Addr{}, false
}

// checkServiceAcrossNodes runs a server pod on node to, behind a Service,
// and a client pod on node from, and has the client fetch from the server
// by the Service's name, its ClusterIP and the server pod's address: each
// answer is the server's node name.
func checkServiceAcrossNodes(t *testing.T, ns, from, to string) {
	c.Apply(t, ns, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: echo, labels: {app: echo}}
spec:
  nodeSelector: {kubernetes.io/hostname: %[1]s}
  containers:
  - name: echo
    image: %[3]s
    imagePullPolicy: Never
    args: [serve, ":8080", "$(NODE_NAME)"]
    env: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  containers:
  - name: client
    image: %[3]s
    imagePullPolicy: Never
    args: [hold]
`, to, from, c.WorkloadImage))
	c.WaitPodReady(t, ns, "echo", 3*time.Minute)
	c.WaitPodReady(t, ns, "client", 3*time.Minute)
	placed := c.Kubectl(t, "get", "pods", "-n", ns, "-o", `jsonpath={range .items[*]}{.metadata.name}{" "}{.spec.nodeName}{" "}{.status.podIP}{"\n"}{end}`)
	t.Logf("pods:\n%s", placed)
	podIP := c.Kubectl(t, "get", "pod", "-n", ns, "echo", "-o", "jsonpath={.status.podIP}")
	clusterIP := c.Kubectl(t, "get", "service", "-n", ns, "echo", "-o", "jsonpath={.spec.clusterIP}")
	for _, url := range []string{
		"http://echo/",
		"http://echo." + ns + ".svc.cluster.local/",
		"http://" + clusterIP + "/",
		"http://" + podIP + ":8080/",
	} {
		// The Service's rules reach the client's node's kube-proxy a
		// moment after the server is Ready: poll, do not sleep.
		waitFor(t, time.Minute, func() string {
			out, err := c.Run(t.Context(), "", "exec", "-n", ns, "client", "--", "volplane-workload", "get", url)
			if err != nil {
				return fmt.Sprintf("%s from %s: %v", url, from, err)
			}
			if out != to {
				return fmt.Sprintf("%s from %s answered %q, want %q (the server's node)", url, from, out, to)
			}
			return ""
		})
		t.Logf("%s, from a pod on %s: answered by the pod on %s", url, from, to)
	}
}

// checkHostPathPerNode runs a DaemonSet whose pods each write a file named
// after their node into the same hostPath directory, then checks that each
// pod sees its own node's file and no other's, and that on the host each
// file lies in its node's directory (hack/cluster/nodes.sh), none in the
// host's own.
func checkHostPathPerNode(t *testing.T, ns string, names []string) {
	dir := "/var/lib/volplane-node/smoke-" + ns
	c.Apply(t, ns, fmt.Sprintf(`
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: marker}
spec:
  selector: {matchLabels: {app: marker}}
  template:
    metadata: {labels: {app: marker}}
    spec:
      containers:
      - name: marker
        image: %[2]s
        imagePullPolicy: Never
        args: [hold, -write, "/host/$(NODE_NAME)=$(NODE_NAME)"]
        env: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
        volumeMounts: [{name: host, mountPath: /host}]
      volumes:
      - {name: host, hostPath: {path: %[1]s, type: DirectoryOrCreate}}
`, dir, c.WorkloadImage))
	pods := map[string]string{} // node: pod
	waitFor(t, 3*time.Minute, func() string {
		list, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app=marker"})
		if err != nil {
			return err.Error()
		}
		clear(pods)
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
				pods[p.Spec.NodeName] = p.Name
			}
		}
		if len(pods) != len(names) {
			return fmt.Sprintf("DaemonSet pods Running on %d nodes, want %d", len(pods), len(names))
		}
		return ""
	})
	for _, node := range names {
		pod := pods[node]
		waitFor(t, time.Minute, func() string {
			out, err := c.Run(t.Context(), "", "exec", "-n", ns, pod, "--", "volplane-workload", "cat", "/host/"+node)
			if err != nil || out != node {
				return fmt.Sprintf("pod %s on %s: its own file: %q %v", pod, node, out, err)
			}
			return ""
		})
		for _, other := range names {
			if other == node {
				continue
			}
			out, err := c.Run(t.Context(), "", "exec", "-n", ns, pod, "--", "volplane-workload", "cat", "/host/"+other)
			if err == nil || !strings.Contains(err.Error(), "no such file") {
				t.Errorf("pod %s on %s reads %s's file in the hostPath %s: %q %v", pod, node, other, dir, out, err)
			}
		}
		t.Logf("%s: the hostPath %s holds %s's file and no other node's", node, dir, node)
	}
	checkHostPathOnHost(t, dir, names)
}

// checkHostPathOnHost checks, on the host, that each node's file lies in
// that node's directory and that the host's own directory has none.
func checkHostPathOnHost(t *testing.T, dir string, names []string) {
	state := os.Getenv("VOLPLANE_CLUSTER_DIR")
	if state == "" {
		t.Log("VOLPLANE_CLUSTER_DIR unset: the host's side of the hostPaths is not checked")
		return
	}
	for _, node := range names {
		entries, err := os.ReadDir(filepath.Join(state, "nodes", node, "root", dir))
		if err != nil {
			t.Errorf("node %s's directory on the host: %v", node, err)
			continue
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		if !slices.Equal(got, []string{node}) {
			t.Errorf("node %s's %s on the host holds %v, want only %s", node, dir, got, node)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the host's own %s exists (%v): a node wrote outside its own directory", dir, err)
	}
}
