package provisioner

import (
	"errors"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/sidecar"
)

// nodeRig is discovery with one node-deployed sidecar per node, each in
// front of its own dev driver of capacity gib GiB.
func nodeRig(t *testing.T, nodes map[string]int64) *discoveryRig {
	t.Helper()
	rig := newDiscoveryRig(t, nil)
	rig.allow("csi", "node-sa")
	hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	i := 0
	for node, gib := range nodes {
		o := devcsi.Options{Name: sidecarDriverName, RootDir: t.TempDir(), NodeID: node, Capacity: gib << 30, Logger: discard}
		sc := startSidecarOf(t, o, hosts[i], 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
		pod := "node-plugin-" + node
		p := rig.pod(t, "csi", pod, "node-sa", hosts[i], true)
		p.Spec.NodeName = node
		if _, err := rig.api.CoreV1().Pods("csi").Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		rig.registerNode(t, pod, node, sc, true)
		i++
	}
	eventually(t, "every node's sidecar in the pool", func() bool {
		d := rig.driverInfo(t, sidecarDriverName)
		return d != nil && d.Ready && len(rig.reg.byDriver(sidecarDriverName).sidecars.nodeEndpoints()) == len(nodes)
	})
	return rig
}

// registerNode registers pod's sidecar sc as node's.
func (rig *discoveryRig) registerNode(t *testing.T, pod, node string, sc *testSidecar, immediate bool) {
	t.Helper()
	r := sidecar.Registration{Namespace: "csi", Pod: pod, Driver: sidecarDriverName, Port: sc.port, CertSHA256: sc.hash, Duration: sidecar.LeaseDuration,
		Settings: sidecar.Settings{NodeDeployment: true},
		Node:     node, NodeTopology: map[string]string{devcsi.TopologyKey: node}, NodeImmediateBinding: immediate}
	if _, err := rig.api.CoordinationV1().Leases("csi").Create(t.Context(), r.Lease(time.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

var mountRWO = []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}

// TestNodeDeploymentRoutesEachCallToItsNode: CreateVolume goes to the
// sidecar of the node it is for and nowhere else, GetCapacity to the node
// of its segment, DeleteVolume to the node the PV's affinity names; a
// node without a sidecar gets nothing and the call says which node.
func TestNodeDeploymentRoutesEachCallToItsNode(t *testing.T) {
	rig := nodeRig(t, map[string]int64{"node-a": 10, "node-b": 20})
	d := rig.reg.byDriver(sidecarDriverName)
	ctx := t.Context()
	vol, err := d.controller.CreateVolume(withNode(ctx, "node-b"), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mountRWO,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range map[string]int{"node-a": 0, "node-b": 1} {
		list, err := d.controller.ListVolumes(withNode(ctx, node), &csi.ListVolumesRequest{})
		if err != nil || len(list.GetEntries()) != want {
			t.Errorf("%s's driver lists %v (%v), want %d volumes", node, list.GetEntries(), err, want)
		}
	}
	if _, err := d.controller.CreateVolume(withNode(ctx, "node-c"), &csi.CreateVolumeRequest{Name: "pvc-2", VolumeCapabilities: mountRWO}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node node-c") {
		t.Errorf("CreateVolume for a node without a sidecar: %v, want Unavailable naming node-c", err)
	}
	caps, err := d.controller.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{devcsi.TopologyKey: "node-b"}}})
	if err != nil || caps.GetAvailableCapacity() != 19<<30 {
		t.Errorf("GetCapacity of node-b's segment: %v, %v; want 19 GiB (20 less the volume)", caps, err)
	}
	segs, err := capacityDrivers{reg: rig.reg}.Segments(sidecarDriverName)
	if err != nil || len(segs) != 2 || segs[0][devcsi.TopologyKey] != "node-a" || segs[1][devcsi.TopologyKey] != "node-b" {
		t.Errorf("capacity segments %v, %v; want node-a's and node-b's", segs, err)
	}
	p := &provisioner{drivers: rig.reg, log: discard, prefix: "pvc", timeout: time.Second}
	pv := provisionedPV("pvc-1", vol.GetVolume().GetVolumeId(), corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, nil)
	pv.Spec.CSI.Driver = sidecarDriverName
	pv.Spec.NodeAffinity = nodeAffinity(vol.GetVolume().GetAccessibleTopology())
	if node, err := p.deletionNode(d, pv); node != "node-b" || err != nil {
		t.Errorf("deletion node %q, %v; want node-b", node, err)
	}
	pv.Spec.NodeAffinity = nodeAffinity([]*csi.Topology{{Segments: map[string]string{devcsi.TopologyKey: "node-z"}}})
	if _, err := p.deletionNode(d, pv); status.Code(err) != codes.Unavailable {
		t.Errorf("deletion on a node without a sidecar: %v, want Unavailable (retried)", err)
	}
	pv.Spec.NodeAffinity = nil
	if _, err := p.deletionNode(d, pv); err == nil {
		t.Error("a node-deployed driver's PV without node affinity was routed somewhere")
	}
}

// TestNodeDeploymentPlacesImmediateClaims: an Immediate claim goes to
// the node with the most room that holds it, never to a node whose
// sidecar refuses Immediate claims or outside the class's
// allowedTopologies; one no node can hold names every node and why.
func TestNodeDeploymentPlacesImmediateClaims(t *testing.T) {
	rig := nodeRig(t, map[string]int64{"node-a": 10, "node-b": 20, "node-c": 30})
	d := rig.reg.byDriver(sidecarDriverName)
	p := &provisioner{drivers: rig.reg, log: discard, prefix: "pvc", timeout: time.Second}
	claim := func(gib int64) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data"}}
		c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(gib<<30, resource.BinarySI)}
		return c
	}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: sidecarDriverName}
	if node, err := p.placeImmediate(t.Context(), d, claim(5), class, mountRWO); node != "node-c" || err != nil {
		t.Errorf("5 GiB placed on %q, %v; want node-c, the most room", node, err)
	}
	class.AllowedTopologies = []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: devcsi.TopologyKey, Values: []string{"node-a", "node-b"}}}}}
	if node, err := p.placeImmediate(t.Context(), d, claim(15), class, mountRWO); node != "node-b" || err != nil {
		t.Errorf("15 GiB within node-a and node-b placed on %q, %v; want node-b", node, err)
	}
	_, err := p.placeImmediate(t.Context(), d, claim(25), class, mountRWO)
	for _, want := range []string{"node-a: 10Gi available", "node-b: 20Gi available", "node-c: outside the class's allowedTopologies"} {
		if !errors.Is(err, errNoNodeRoom) || !strings.Contains(err.Error(), want) {
			t.Errorf("25 GiB: %v; want errNoNodeRoom saying %q", err, want)
		}
	}
}

// TestNodeDeploymentRefusesAnotherNodesRegistration: a sidecar may
// register only the node its pod runs on: a registration naming another
// node is not used, so no claim of that node goes to it.
func TestNodeDeploymentRefusesAnotherNodesRegistration(t *testing.T) {
	rig := nodeRig(t, map[string]int64{"node-a": 10})
	sc := startSidecarOf(t, devcsi.Options{Name: sidecarDriverName, RootDir: t.TempDir(), NodeID: "node-b", Logger: discard}, "127.0.0.2", 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
	p := rig.pod(t, "csi", "impostor", "node-sa", "127.0.0.2", true)
	p.Spec.NodeName = "node-a"
	if _, err := rig.api.CoreV1().Pods("csi").Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rig.registerNode(t, "impostor", "node-b", sc, true)
	eventually(t, "the refusal logged", func() bool {
		return strings.Contains(rig.logs.String(), `the registration is for node \"node-b\" (--node-deployment), but the pod runs on node \"node-a\"`)
	})
	if ep := rig.reg.byDriver(sidecarDriverName).sidecars.onNode("node-b"); ep != nil {
		t.Errorf("node-b routed to %s", ep.pod)
	}
}

// TestNodeDeploymentUndoesOnTheNodeOfTheRequest: a provisioning undone
// (its claim gone before the PV), or a volume discarded before its PV,
// asks the node its journal record names, where the volume is, and no
// other node: the volume there is deleted, and no other node's driver
// makes one or answers NotFound for it. make chaos-cluster found a volume
// left with neither PV nor record when the undo went to the next node in
// turn.
func TestNodeDeploymentUndoesOnTheNodeOfTheRequest(t *testing.T) {
	rig := nodeRig(t, map[string]int64{"node-a": 10, "node-b": 10})
	d := rig.reg.byDriver(sidecarDriverName)
	ctx := t.Context()
	p := &provisioner{drivers: rig.reg, journal: rig.journal, log: discard, prefix: "pvc", timeout: 5 * time.Second, member: "provisioner-0"}
	for range 4 { // the next node in turn would have been node-a at least once
		req := &csi.CreateVolumeRequest{Name: "pvc-gone", VolumeCapabilities: mountRWO, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}}
		if _, err := d.controller.CreateVolume(withNode(ctx, "node-b"), req); err != nil {
			t.Fatal(err)
		}
		raw, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := rig.journal.Acquire(ctx, kindProvision, "pvc-gone", p.member); err != nil {
			t.Fatal(err)
		}
		if err := p.undo(ctx, d, "pvc-gone", provisionOp{Request: raw, Node: "node-b"}, "the claim is gone"); err != nil {
			t.Fatal(err)
		}
		for _, node := range []string{"node-a", "node-b"} {
			list, err := d.controller.ListVolumes(withNode(ctx, node), &csi.ListVolumesRequest{})
			if err != nil || len(list.GetEntries()) != 0 {
				t.Fatalf("%s's driver lists %v (%v) after the undo, want no volume", node, list.GetEntries(), err)
			}
		}
	}
	// The same for a volume made and then discarded before its PV.
	for range 4 {
		vol, err := d.controller.CreateVolume(withNode(ctx, "node-b"), &csi.CreateVolumeRequest{Name: "pvc-gone", VolumeCapabilities: mountRWO})
		if err != nil {
			t.Fatal(err)
		}
		if err := rig.journal.Acquire(ctx, kindProvision, "pvc-gone", p.member); err != nil {
			t.Fatal(err)
		}
		if _, err := p.discard(ctx, d, "pvc-gone", provisionOp{Node: "node-b"}, vol.GetVolume().GetVolumeId(), "the claim is gone"); err != nil {
			t.Fatal(err)
		}
		if list, err := d.controller.ListVolumes(withNode(ctx, "node-b"), &csi.ListVolumesRequest{}); err != nil || len(list.GetEntries()) != 0 {
			t.Fatalf("node-b's driver lists %v (%v) after the discard, want no volume", list.GetEntries(), err)
		}
	}
	if _, ok, err := rig.journal.Get(ctx, kindProvision, "pvc-gone"); ok || err != nil {
		t.Errorf("the record is still there after the undo (%v)", err)
	}
}
