package nodedeploy

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/prototext"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// Classes of the node-local driver.
const (
	classWFFC      = "local"
	classImmediate = "local-immediate"
)

// members is a StatefulSet of 6 spread over the 3 nodes: the claim of
// member i, and the node the scheduler chose for its pod.
var members = func() []struct{ claim, node string } {
	var out []struct{ claim, node string }
	for i := range 6 {
		out = append(out, struct{ claim, node string }{fmt.Sprintf("data-web-%d", i), nodeNames[i%3]})
	}
	return out
}()

// observed is what one run did with the claims.
type observed struct {
	// node is where each claim's volume is (the driver holding it), and
	// affinity the node its PV's node affinity names.
	node, affinity map[string]string
	// request is the CreateVolume request of each claim's volume, without
	// its name and the extra metadata that name the run's objects.
	request map[string]string
	// pv is each claim's PV as JSON, without what names the run's objects
	// (name, claimRef, volume handle, provisioner identity).
	pv map[string]string
	// calls are how many CreateVolume calls each volume took.
	calls map[string]int
	// immediate is the node an Immediate claim's volume went to, with no
	// node selected.
	immediate string
	// big is what became of a claim too big for its node: the
	// ProvisioningFailed message, and whether the selected node was
	// removed so that the scheduler chooses again.
	bigMessage     string
	bigRescheduled bool
	// capacities are the CSIStorageCapacity objects of the WFFC class:
	// node topology -> capacity.
	capacities map[string]string
}

func TestNodeDeployment(t *testing.T) {
	if _, err := devenv.FindKubeAPIServer(); err != nil {
		t.Skip(err)
	}
	ctx := t.Context()
	c, err := e2e.StartCluster(ctx, "e2e/nodedeploy", e2e.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs(os.Stderr)
		}
	})
	if err := setupCluster(ctx, c); err != nil {
		t.Fatal(err)
	}
	del, wffc, imm := corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer, storagev1.VolumeBindingImmediate
	e2e.CreateClass(t, c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: classWFFC}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del, VolumeBindingMode: &wffc})
	e2e.CreateClass(t, c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: classImmediate}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del, VolumeBindingMode: &imm})

	vp := startVolplane(t, c, stackDir(c, "volplane"))
	var ours observed
	t.Run("volplane", func(t *testing.T) { ours = scenario(t, c, vp, "vp") })
	vp.stop()
	if t.Failed() {
		return
	}
	provBin, kcmBin := os.Getenv("VOLPLANE_CSI_PROVISIONER"), os.Getenv("VOLPLANE_KUBE_CONTROLLER_MANAGER")
	if provBin == "" || kcmBin == "" {
		t.Skip("the side-by-side run needs VOLPLANE_CSI_PROVISIONER and VOLPLANE_KUBE_CONTROLLER_MANAGER (csi-provisioner v6.3.0, kube-controller-manager)")
	}
	up := startUpstream(t, c, stackDir(c, "upstream"), provBin, kcmBin)
	var theirs observed
	t.Run("csi-provisioner", func(t *testing.T) { theirs = scenario(t, c, up, "up") })
	up.stop()
	compare(t, ours, theirs)
}

// scenario runs the claims in namespace ns through s: the StatefulSet's
// claims with the nodes the scheduler chose, a claim too big for its
// node, the capacities published per node, and a deletion.
func scenario(t *testing.T, c *e2e.Cluster, s *stack, ns string) observed {
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o := observed{node: map[string]string{}, affinity: map[string]string{}, request: map[string]string{}, calls: map[string]int{}, pv: map[string]string{}}
	for _, m := range members {
		createClaim(t, c, ns, m.claim, "1Gi", classWFFC, m.node)
	}
	for _, m := range members {
		cl := e2e.ClaimPhase(t, c.Client, ns, m.claim, corev1.ClaimBound, time.Minute)
		pv, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), cl.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.node[m.claim] = holder(t, s, pv.Spec.CSI.VolumeHandle)
		o.affinity[m.claim] = affinityNode(pv)
		o.request[m.claim], o.calls[m.claim] = requestOf(s.drivers[o.node[m.claim]], pv.Name)
		o.pv[m.claim] = pvShape(t, pv)
		if o.node[m.claim] != m.node || o.affinity[m.claim] != m.node {
			t.Errorf("%s (selected node %s): volume on %q, PV affinity %q", m.claim, m.node, o.node[m.claim], o.affinity[m.claim])
		}
	}
	o.bigMessage, o.bigRescheduled = tooBig(t, c, ns)
	o.capacities = capacities(t, c, s)
	deleteOne(t, c, s, ns, members[0].claim, members[0].node)
	o.immediate = immediate(t, c, s, ns)
	if s.name == "volplane" {
		// csi-provisioner's nodes just never claim it: no event.
		name := createdTooBigImmediate(t, c, ns)
		e2e.HasEvent(t, c.Client, ns, "PersistentVolumeClaim", name, "ProvisioningFailed", "no node can take the volume of 20Gi: node-a: ", "", time.Minute)
		if evs, err := e2e.Events(c.Client, ns, "PersistentVolumeClaim", name); err == nil && len(evs) > 0 {
			t.Logf("Immediate claim of 20Gi, no node with room: %s %q", evs[len(evs)-1].Reason, evs[len(evs)-1].Message)
		}
	}
	return o
}

// createdTooBigImmediate creates an Immediate claim no node has room for
// and returns its name.
func createdTooBigImmediate(t *testing.T, c *e2e.Cluster, ns string) string {
	t.Helper()
	createClaim(t, c, ns, "big-immediate", "20Gi", classImmediate, "")
	return "big-immediate"
}

// immediate creates a claim of Immediate binding (no node selected) and
// returns the node its volume went to.
func immediate(t *testing.T, c *e2e.Cluster, s *stack, ns string) string {
	t.Helper()
	createClaim(t, c, ns, "scratch", "1Gi", classImmediate, "")
	cl := e2e.ClaimPhase(t, c.Client, ns, "scratch", corev1.ClaimBound, time.Minute)
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), cl.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := holder(t, s, pv.Spec.CSI.VolumeHandle)
	if a := affinityNode(pv); a != node {
		t.Errorf("Immediate claim: volume on %s, PV affinity %q", node, a)
	}
	return node
}

// pvShape is pv's labels, annotations, finalizers and spec as JSON, less
// what differs between runs by name or time alone: the PV's and the
// claim's names and UIDs, the volume handle, the provisioner's identity
// attribute and the driver's creation-time attribute; and less
// kubernetes.io/pv-protection, which kube-controller-manager's protection
// controller adds (it runs beside csi-provisioner only, here).
func pvShape(t *testing.T, pv *corev1.PersistentVolume) string {
	t.Helper()
	spec := pv.Spec.DeepCopy()
	spec.ClaimRef = nil
	if spec.CSI != nil {
		spec.CSI.VolumeHandle = ""
		delete(spec.CSI.VolumeAttributes, "storage.kubernetes.io/csiProvisionerIdentity")
		delete(spec.CSI.VolumeAttributes, "volplane.io/creation-time")
	}
	fin := slices.DeleteFunc(slices.Clone(pv.Finalizers), func(f string) bool { return f == "kubernetes.io/pv-protection" })
	b, err := json.Marshal(struct {
		Labels, Annotations map[string]string
		Finalizers          []string
		Spec                *corev1.PersistentVolumeSpec
	}{pv.Labels, pv.Annotations, fin, spec})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// createClaim creates a claim of size in class, with the node the
// scheduler chose (none: "").
func createClaim(t *testing.T, c *e2e.Cluster, ns, name, size, class, node string) {
	t.Helper()
	cl := e2e.Claim(ns, name, size, class)
	if node != "" {
		cl.Annotations = map[string]string{kube.AnnSelectedNode: node}
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), cl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// holder is the node whose driver holds the volume handle, failing when
// it is not exactly one.
func holder(t *testing.T, s *stack, handle string) string {
	t.Helper()
	var on []string
	for _, n := range nodeNames {
		if slices.Contains(s.drivers[n].volumes(t), handle) {
			on = append(on, n)
		}
	}
	if len(on) != 1 {
		t.Errorf("volume %s is in the state directory of %v, want exactly one node's", handle, on)
		return strings.Join(on, "+")
	}
	return on[0]
}

// affinityNode is the node value of pv's required node affinity.
func affinityNode(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	var vals []string
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			vals = append(vals, e.Key+" "+string(e.Operator)+" "+strings.Join(e.Values, ","))
		}
	}
	if len(vals) == 1 && strings.HasPrefix(vals[0], devcsi.TopologyKey+" In ") {
		return strings.TrimPrefix(vals[0], devcsi.TopologyKey+" In ")
	}
	return strings.Join(vals, "; ")
}

// requestOf is the last CreateVolume request of volume name, as text
// without its name (each run's PV names differ), and how many calls the
// volume took.
func requestOf(d *driver, name string) (string, int) {
	reqs := d.createsOf(name)
	if len(reqs) == 0 {
		return "(none)", 0
	}
	r := reqs[len(reqs)-1]
	return prototext.MarshalOptions{}.Format(&csi.CreateVolumeRequest{
		CapacityRange: r.CapacityRange, VolumeCapabilities: r.VolumeCapabilities, Parameters: r.Parameters, AccessibilityRequirements: r.AccessibilityRequirements}), len(reqs)
}

// tooBig creates a claim of twice a node's capacity on node-a and waits
// for the ProvisioningFailed event with the driver's answer (the first
// one, else any other) and the selected node's removal.
func tooBig(t *testing.T, c *e2e.Cluster, ns string) (string, bool) {
	t.Helper()
	createClaim(t, c, ns, "big", "20Gi", classWFFC, "node-a")
	var msg string
	rescheduled := false
	e2e.Eventually(t, time.Minute, func() string {
		evs, err := e2e.Events(c.Client, ns, "PersistentVolumeClaim", "big")
		if err != nil {
			return err.Error()
		}
		// The driver's answer, among the ProvisioningFailed events: the
		// provisioner that removes the selected node may also report a
		// conflict on the claim it saves (csi-provisioner's "Error saving
		// claim: ... the object has been modified"), and retry.
		for _, e := range evs {
			if e.Reason == "ProvisioningFailed" && (msg == "" || !strings.Contains(msg, "ResourceExhausted")) {
				msg = e.Message
			}
		}
		cl, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "big", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		_, selected := cl.Annotations[kube.AnnSelectedNode]
		rescheduled = !selected
		if !strings.Contains(msg, "ResourceExhausted") || !rescheduled {
			return fmt.Sprintf("ProvisioningFailed %q, selected node still set: %v", msg, selected)
		}
		return ""
	})
	if !strings.Contains(msg, "ResourceExhausted") {
		t.Errorf("ProvisioningFailed of a claim too big for its node: %q, want the driver's ResourceExhausted", msg)
	}
	return msg, rescheduled
}

// capacities waits for a CSIStorageCapacity object of the WFFC class per
// node and returns node topology -> capacity.
func capacities(t *testing.T, c *e2e.Cluster, s *stack) map[string]string {
	t.Helper()
	out := map[string]string{}
	e2e.Eventually(t, time.Minute, func() string {
		list, err := c.Client.StorageV1().CSIStorageCapacities(s.capacityNamespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		clear(out)
		for _, o := range list.Items {
			if o.StorageClassName != classWFFC || o.NodeTopology == nil || o.Capacity == nil {
				continue
			}
			out[metav1.FormatLabelSelector(o.NodeTopology)] = o.Capacity.String()
		}
		if len(out) != len(nodeNames) {
			return fmt.Sprintf("capacities of class %s in %s: %v", classWFFC, s.capacityNamespace, out)
		}
		return ""
	})
	return out
}

// deleteOne deletes a claim and waits for its PV and for its volume to
// leave its node's state directory.
func deleteOne(t *testing.T, c *e2e.Cluster, s *stack, ns, claim, node string) {
	t.Helper()
	cl, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), cl.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), claim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, time.Minute, func() string {
		_, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("PV %s still there (%v)", pv.Name, err)
		}
		if slices.Contains(s.drivers[node].volumes(t), pv.Spec.CSI.VolumeHandle) {
			return "volume still in " + node + "'s state directory"
		}
		return ""
	})
}

// compare prints both runs side by side and fails where they differ.
func compare(t *testing.T, ours, theirs observed) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-12s %-8s %-18s %-18s %-12s %s\n", "claim", "selected", "volplane node/PV", "csi-prov node/PV", "calls vp/up", "CreateVolume request")
	for _, m := range members {
		same := "same"
		if ours.request[m.claim] != theirs.request[m.claim] {
			same = fmt.Sprintf("DIFFERENT:\n  volplane:        %s\n  csi-provisioner: %s", ours.request[m.claim], theirs.request[m.claim])
			t.Errorf("%s: CreateVolume requests differ", m.claim)
		}
		fmt.Fprintf(&b, "%-12s %-8s %-18s %-18s %-12s %s\n", m.claim, m.node, ours.node[m.claim]+"/"+ours.affinity[m.claim],
			theirs.node[m.claim]+"/"+theirs.affinity[m.claim], fmt.Sprintf("%d/%d", ours.calls[m.claim], theirs.calls[m.claim]), same)
		if ours.node[m.claim] != theirs.node[m.claim] || ours.affinity[m.claim] != theirs.affinity[m.claim] {
			t.Errorf("%s: nodes differ", m.claim)
		}
		if ours.pv[m.claim] != theirs.pv[m.claim] {
			t.Errorf("%s: PVs differ:\n volplane:        %s\n csi-provisioner: %s", m.claim, ours.pv[m.claim], theirs.pv[m.claim])
		}
	}
	fmt.Fprintf(&b, "request of data-web-1 (both): %s\n", ours.request["data-web-1"])
	fmt.Fprintf(&b, "PV of data-web-1 (volplane): %s\n", ours.pv["data-web-1"])
	fmt.Fprintf(&b, "too big (20Gi on node-a):\n  volplane:        rescheduled=%v %q\n  csi-provisioner: rescheduled=%v %q\n",
		ours.bigRescheduled, ours.bigMessage, theirs.bigRescheduled, theirs.bigMessage)
	if ours.bigRescheduled != theirs.bigRescheduled {
		t.Error("the claim too big for its node is rescheduled by one and not the other")
	}
	fmt.Fprintf(&b, "Immediate claim, no node selected: volplane placed it on %s (the most room), csi-provisioner's nodes raced and %s won\n", ours.immediate, theirs.immediate)
	fmt.Fprintf(&b, "CSIStorageCapacity of class %s, per node:\n", classWFFC)
	var keys []string
	for k := range ours.capacities {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-50s volplane %-8s csi-provisioner %s\n", k, ours.capacities[k], theirs.capacities[k])
		if _, ok := theirs.capacities[k]; !ok {
			t.Errorf("capacity of %s published by volplane only", k)
		}
	}
	t.Log(b.String())
}
