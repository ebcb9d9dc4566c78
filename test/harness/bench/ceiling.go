package bench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
)

// ceiling is the bare client: what the apiserver (and the dev CSI driver)
// can do at most for the binds of a run, measured the same way on the
// same kind of fresh control plane. It has no watch, cache, queue, etcd or
// matching: each claim is handed to it as its create returns, and one of
// Workers goroutines (the binder's default, 128) makes exactly the
// requests volplane makes for it, in volplane's order, protobuf-encoded,
// each on the object the previous write returned:
//
// Static binding (claim-i takes volume i), the four writes of
// services/binder/bind.go:
//  1. PUT the volume: claimRef (with the claim's UID and resourceVersion)
//     and pv.kubernetes.io/bound-by-controller;
//  2. PUT the volume's status: Bound;
//  3. PUT the claim: volumeName, bound-by-controller and bind-completed;
//  4. PUT the claim's status: Bound, access modes and capacity.
//
// Dynamic provisioning, the five writes and three Events of the binder
// (services/binder/sync.go provisionClaim) and the provisioner
// (services/provisioner/provision.go):
//  1. PUT the claim: the storage-provisioner annotations;
//  2. Event ExternalProvisioning, Event Provisioning;
//  3. CSI CreateVolume over the driver's unix socket (name pvc-<claim UID>);
//  4. POST the volume (CSI source, node affinity, claimRef, provisioned-by,
//     the external-provisioner finalizer);
//  5. Event ProvisioningSucceeded;
//  6. PUT the volume's status: Bound;
//  7. PUT the claim: volumeName, bound-by-controller, bind-completed;
//  8. PUT the claim's status: Bound.
//
// Events are posted off the workers (as the services' event recorders
// post them off theirs), at most Workers at once. Left out, because they
// are not the apiserver's or the driver's work: volplane's etcd
// reservations and provisioning journal, and the provisioner's re-reads
// of the claim before CreateVolume and before the PV.
type ceiling struct {
	client  kubernetes.Interface
	volumes []*corev1.PersistentVolume // static: claim-i binds volumes[i]
	csi     csi.ControllerClient       // dynamic
	conn    *grpc.ClientConn
	queue   chan *corev1.PersistentVolumeClaim
	slots   chan struct{} // events in flight
	events  sync.WaitGroup
	workers sync.WaitGroup
	cancel  context.CancelFunc
	fail    func(error)
}

// newCeiling starts workers goroutines binding the claims add hands them,
// up to capacity claims; csiSock, when set, is the dev driver's socket
// (dynamic provisioning). A failed request is reported to fail.
func newCeiling(client kubernetes.Interface, workers, capacity int, csiSock string, fail func(error)) (*ceiling, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &ceiling{client: client, queue: make(chan *corev1.PersistentVolumeClaim, capacity), slots: make(chan struct{}, workers), cancel: cancel, fail: fail}
	if csiSock != "" {
		conn, err := grpcutil.DialCSI("unix://" + csiSock)
		if err != nil {
			cancel()
			return nil, err
		}
		c.conn, c.csi = conn, csi.NewControllerClient(conn)
	}
	// Open the connection (TLS, HTTP/2) before the measured phase, as
	// volplane's binder has opened its own by then.
	if _, err := client.CoreV1().Namespaces().Get(ctx, benchNamespace, metav1.GetOptions{}); err != nil {
		c.stop()
		return nil, fmt.Errorf("ceiling: %w", err)
	}
	for range workers {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case claim := <-c.queue:
					var err error
					if c.csi != nil {
						err = c.provision(ctx, claim)
					} else {
						err = c.bind(ctx, claim)
					}
					if err != nil && ctx.Err() == nil {
						c.fail(fmt.Errorf("ceiling: claim %s: %w", claim.Name, err))
					}
				}
			}
		}()
	}
	return c, nil
}

// add hands the ceiling a claim just created; it never blocks.
func (c *ceiling) add(claim *corev1.PersistentVolumeClaim) {
	select {
	case c.queue <- claim:
	default:
		c.fail(fmt.Errorf("ceiling: more claims than the %d expected", cap(c.queue)))
	}
}

// drain waits until every Event is posted.
func (c *ceiling) drain() { c.events.Wait() }

func (c *ceiling) stop() {
	c.cancel()
	c.workers.Wait()
	c.events.Wait()
	if c.conn != nil {
		c.conn.Close()
	}
}

// bind makes the four writes of a static bind.
func (c *ceiling) bind(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	i, err := strconv.Atoi(strings.TrimPrefix(claim.Name, "claim-"))
	if err != nil || i < 0 || i >= len(c.volumes) {
		return fmt.Errorf("no volume for claim %s", claim.Name)
	}
	v := c.volumes[i].DeepCopy()
	v.Spec.ClaimRef = claimRef(claim)
	metav1.SetMetaDataAnnotation(&v.ObjectMeta, kube.AnnBoundByController, "yes")
	if v, err = c.client.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{}); err != nil {
		return err
	}
	return c.finish(ctx, claim, v)
}

// finish makes the last three writes of a bind, from the volume's phase.
func (c *ceiling) finish(ctx context.Context, claim *corev1.PersistentVolumeClaim, v *corev1.PersistentVolume) error {
	v = v.DeepCopy()
	v.Status.Phase = corev1.VolumeBound
	v, err := c.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	cl := claim.DeepCopy()
	cl.Spec.VolumeName = v.Name
	metav1.SetMetaDataAnnotation(&cl.ObjectMeta, kube.AnnBoundByController, "yes")
	metav1.SetMetaDataAnnotation(&cl.ObjectMeta, kube.AnnBindCompleted, "yes")
	if cl, err = c.client.CoreV1().PersistentVolumeClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{}); err != nil {
		return err
	}
	cl.Status.Phase = corev1.ClaimBound
	cl.Status.AccessModes = v.Spec.AccessModes
	cl.Status.Capacity = v.Spec.Capacity
	_, err = c.client.CoreV1().PersistentVolumeClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	return err
}

// provision makes the writes, Events and CSI call of a dynamic bind.
func (c *ceiling) provision(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	cl := claim.DeepCopy()
	metav1.SetMetaDataAnnotation(&cl.ObjectMeta, kube.AnnBetaStorageProvisioner, devcsi.DefaultName)
	metav1.SetMetaDataAnnotation(&cl.ObjectMeta, kube.AnnStorageProvisioner, devcsi.DefaultName)
	cl, err := c.client.CoreV1().PersistentVolumeClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	c.event(ctx, cl, kube.ControllerComponent, kube.EventExternalProvisioning,
		fmt.Sprintf("Waiting for a volume to be created either by the external provisioner '%s' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.", devcsi.DefaultName))
	c.event(ctx, cl, devcsi.DefaultName, kube.EventProvisioning, fmt.Sprintf("External provisioner is provisioning volume for claim %q", cl.Namespace+"/"+cl.Name))
	name := "pvc-" + string(cl.UID)
	size := cl.Spec.Resources.Requests[corev1.ResourceStorage]
	node := []*csi.Topology{{Segments: map[string]string{devcsi.TopologyKey: benchNode}}}
	resp, err := c.csi.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:          name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size.Value()},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters:                map[string]string{},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: node, Preferred: node},
	})
	if err != nil {
		return fmt.Errorf("CreateVolume: %w", err)
	}
	v, err := c.client.CoreV1().PersistentVolumes().Create(ctx, provisionedVolume(name, cl, resp.GetVolume()), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	c.event(ctx, cl, devcsi.DefaultName, kube.EventProvisioningSucceeded, "Successfully provisioned volume "+name)
	return c.finish(ctx, cl, v)
}

// provisionedVolume is the PV the provisioner makes for claim from the
// driver's answer.
func provisionedVolume(name string, claim *corev1.PersistentVolumeClaim, vol *csi.Volume) *corev1.PersistentVolume {
	capacity := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if vol.GetCapacityBytes() > 0 {
		capacity = *resource.NewQuantity(vol.GetCapacityBytes(), resource.BinarySI)
	}
	var affinity *corev1.VolumeNodeAffinity
	for _, t := range vol.GetAccessibleTopology() {
		keys := make([]string, 0, len(t.GetSegments()))
		for k := range t.GetSegments() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var term corev1.NodeSelectorTerm
		for _, k := range keys {
			term.MatchExpressions = append(term.MatchExpressions, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{t.GetSegments()[k]}})
		}
		if affinity == nil {
			affinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{}}
		}
		affinity.Required.NodeSelectorTerms = append(affinity.Required.NodeSelectorTerms, term)
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{kube.AnnDynamicallyProvisioned: devcsi.DefaultName},
			Finalizers:  []string{kube.FinalizerExternalProvisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:                   claim.Spec.AccessModes,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: capacity},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              benchClass,
			VolumeMode:                    claim.Spec.VolumeMode,
			NodeAffinity:                  affinity,
			ClaimRef:                      claimRef(claim),
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: devcsi.DefaultName, VolumeHandle: vol.GetVolumeId(), FSType: "ext4", VolumeAttributes: vol.GetVolumeContext(),
			}},
		},
	}
}

func claimRef(claim *corev1.PersistentVolumeClaim) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace,
		Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion}
}

// event posts a Normal Event about claim off the worker, as client-go's
// recorder makes it (a new Event, count 1).
func (c *ceiling) event(ctx context.Context, claim *corev1.PersistentVolumeClaim, component, reason, message string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%v.%x", claim.Name, now.UnixNano()), Namespace: claim.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace,
			Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion},
		Reason: reason, Message: message, Source: corev1.EventSource{Component: component},
		FirstTimestamp: now, LastTimestamp: now, Count: 1, Type: corev1.EventTypeNormal,
	}
	c.slots <- struct{}{}
	c.events.Add(1)
	go func() {
		defer func() { <-c.slots; c.events.Done() }()
		if _, err := c.client.CoreV1().Events(claim.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			c.fail(fmt.Errorf("ceiling: event %s on claim %s: %w", reason, claim.Name, err))
		}
	}()
}
