package provisioner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// Node deployment (csi-provisioner's --node-deployment): a node-local
// driver runs volplane-csi-sidecar in its DaemonSet, and each sidecar
// registers its node and that node's topology segment. Such a driver's
// pool routes each call to one node's sidecar:
//
//   - CreateVolume to the node the claim's volume is placed on: the
//     selected node (WaitForFirstConsumer), or for an Immediate claim the
//     node placeImmediate chose (journaled with the request, so a retry
//     goes to the same node);
//   - DeleteVolume to the node whose segment the PV's node affinity
//     admits;
//   - GetCapacity to the node whose segment the query names;
//   - anything else (Probe, GetPluginInfo, capabilities) to any sidecar.
//
// A node without a registered sidecar gets no call: the call fails with
// Unavailable naming the node, and is retried.

// nodeKey carries the node a call is for in its context.
type nodeKey struct{}

// withNode is ctx for a call to node's sidecar.
func withNode(ctx context.Context, node string) context.Context {
	if node == "" {
		return ctx
	}
	return context.WithValue(ctx, nodeKey{}, node)
}

// nodeOf is the node a call is for, "" for any.
func nodeOf(ctx context.Context) string {
	n, _ := ctx.Value(nodeKey{}).(string)
	return n
}

// nodeDeployed reports whether the pool's sidecars are node-deployed:
// any of them registered a node.
func (p *sidecarPool) nodeDeployed() bool {
	for _, ep := range p.endpoints() {
		if ep.node != "" {
			return true
		}
	}
	return false
}

// nodeEndpoints are the node-deployed endpoints, by node name.
func (p *sidecarPool) nodeEndpoints() []*sidecarEndpoint {
	var out []*sidecarEndpoint
	for _, ep := range p.endpoints() {
		if ep.node != "" {
			out = append(out, ep)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].node < out[j].node })
	return out
}

// onNode is the endpoint of node's sidecar, nil when none is registered.
func (p *sidecarPool) onNode(node string) *sidecarEndpoint {
	for _, ep := range p.nodeEndpoints() {
		if ep.node == node {
			return ep
		}
	}
	return nil
}

// route is the endpoint a call goes to: the context's node's, else for a
// capacity query of a node-deployed driver the node of its segment, else
// the next one in turn.
func (p *sidecarPool) route(ctx context.Context, args any) (*sidecarEndpoint, error) {
	if node := nodeOf(ctx); node != "" {
		if ep := p.onNode(node); ep != nil {
			return ep, nil
		}
		return nil, status.Errorf(codes.Unavailable, "no volplane-csi-sidecar of driver %s is registered on node %s (--node-deployment)", p.name, node)
	}
	if q, ok := args.(*csi.GetCapacityRequest); ok && q.GetAccessibleTopology() != nil && p.nodeDeployed() {
		seg := q.GetAccessibleTopology().GetSegments()
		for _, ep := range p.nodeEndpoints() {
			if equalSegments(ep.topology, seg) {
				return ep, nil
			}
		}
		return nil, status.Errorf(codes.Unavailable, "no volplane-csi-sidecar of driver %s is registered on a node of topology %s (--node-deployment)", p.name, segmentString(seg))
	}
	return p.pick()
}

func equalSegments(a, b map[string]string) bool {
	return len(a) == len(b) && subset(a, b)
}

// nodeDeployed reports whether d is a discovered driver whose sidecars
// are node-deployed.
func (d *driver) nodeDeployed() bool { return d.sidecars != nil && d.sidecars.nodeDeployed() }

// nodeView is the cluster as a node-deployed sidecar sees it, as
// csi-provisioner --node-deployment sees it: one Node, labelled with the
// segment the driver's NodeGetInfo reported, whose CSINode lists the
// driver with that segment's keys. Topology requirements built over it
// name that node's segment (within the class's allowedTopologies).
type nodeView struct {
	driver string
	ep     *sidecarEndpoint
}

var _ nodes = nodeView{}

func (v nodeView) Node(name string) (*corev1.Node, error) {
	if name != v.ep.node {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, name)
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: v.ep.topology}}, nil
}

func (v nodeView) CSINode(name string) (*storagev1.CSINode, error) {
	if name != v.ep.node {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}, name)
	}
	return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: v.driver, NodeID: name, TopologyKeys: sortedKeys(v.ep.topology)}}}}, nil
}

func (v nodeView) CSINodes() ([]*storagev1.CSINode, error) {
	cn, err := v.CSINode(v.ep.node)
	return []*storagev1.CSINode{cn}, err
}

func (v nodeView) Nodes() ([]*corev1.Node, error) {
	n, err := v.Node(v.ep.node)
	return []*corev1.Node{n}, err
}

// nodesFor is the topology view of a request for node: the cluster's
// for a driver served cluster-wide, node's own for a node-deployed one.
// A node without a registered sidecar is an error that keeps the claim
// waiting for it (with a ProvisioningFailed event that says so), as
// csi-provisioner's claims wait for the provisioner of their node.
func (p *provisioner) nodesFor(d *driver, node string) (nodes, error) {
	if !d.nodeDeployed() || node == "" {
		return p.nodes, nil
	}
	ep := d.sidecars.onNode(node)
	if ep == nil {
		return nil, fmt.Errorf("selected node %q has no registered volplane-csi-sidecar of driver %s (--node-deployment): waiting for it", node, d.name())
	}
	return nodeView{driver: d.name(), ep: ep}, nil
}

// errNoNodeRoom is the error of an Immediate claim that no node of a
// node-deployed driver can take.
var errNoNodeRoom = errors.New("no node can take the volume")

// placeImmediate chooses the node of an Immediate claim of a
// node-deployed driver, in one step where csi-provisioner's nodes race
// for the claim after random delays (--node-deployment-base-delay): of
// the nodes whose sidecar allows Immediate claims and whose segment the
// class's allowedTopologies admit, the one with the most room
// (GetCapacity, when the driver has it) that holds the request; ties go
// to the first node by name. The claim is not annotated: the PV's node
// affinity says where the volume is. None: errNoNodeRoom, naming each
// node and why.
func (p *provisioner) placeImmediate(ctx context.Context, d *driver, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, caps []*csi.VolumeCapability) (string, error) {
	want := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	best, bestRoom := "", int64(-1)
	var why []string
	for _, ep := range d.sidecars.nodeEndpoints() {
		switch {
		case !ep.immediate:
			why = append(why, ep.node+": its sidecar has --node-deployment-immediate-binding=false")
			continue
		case len(class.AllowedTopologies) > 0 && !allowed(ep.topology, class.AllowedTopologies):
			why = append(why, ep.node+": outside the class's allowedTopologies")
			continue
		}
		room := int64(1<<63 - 1)
		if d.has(csi.ControllerServiceCapability_RPC_GET_CAPACITY) {
			resp, err := d.controller.GetCapacity(withNode(ctx, ep.node), &csi.GetCapacityRequest{VolumeCapabilities: caps,
				Parameters: driverParameters(class, claim, "", false), AccessibleTopology: &csi.Topology{Segments: ep.topology}})
			if err != nil {
				why = append(why, fmt.Sprintf("%s: GetCapacity: %v", ep.node, status.Convert(err).Message()))
				continue
			}
			if room = resp.GetAvailableCapacity(); room < want.Value() {
				why = append(why, fmt.Sprintf("%s: %s available", ep.node, resource.NewQuantity(room, resource.BinarySI)))
				continue
			}
		}
		if room > bestRoom {
			best, bestRoom = ep.node, room
		}
	}
	if best == "" {
		if len(why) == 0 {
			why = []string{"no volplane-csi-sidecar of the driver is registered on any node"}
		}
		return "", fmt.Errorf("%w of %s: %s", errNoNodeRoom, want.String(), strings.Join(why, "; "))
	}
	return best, nil
}

// deletionNode is the node whose sidecar deletes pv's volume, for a
// node-deployed driver: the one whose segment pv's node affinity admits
// (csi-provisioner --node-deployment deletes only the volumes accessible
// on its node). "" for a driver served cluster-wide.
func (p *provisioner) deletionNode(d *driver, pv *corev1.PersistentVolume) (string, error) {
	if !d.nodeDeployed() {
		return "", nil
	}
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return "", fmt.Errorf("volume %s of node-deployed driver %s has no node affinity, so no node's sidecar can be told to delete it", pv.Name, d.name())
	}
	for _, ep := range d.sidecars.nodeEndpoints() {
		ok, err := corev1helpers.MatchNodeSelectorTerms(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: ep.topology}}, pv.Spec.NodeAffinity.Required)
		if err == nil && ok {
			return ep.node, nil
		}
	}
	return "", status.Errorf(codes.Unavailable, "no volplane-csi-sidecar of driver %s is registered on a node where volume %s is accessible", d.name(), pv.Name)
}
