package binder

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// The binder's state machine without an API server: each row starts from
// PVs, claims and classes, runs one sync (of a claim, "pvc/ns/name", or
// of a volume, "pv/name") against client-go's fake clientset, and checks
// the API requests it made, the Events it recorded and the objects after.
// The rows follow the branches of decide (decide.go) and syncVolume, which
// are those of kube-controller-manager's PV controller (syncClaim and
// syncVolume in pkg/controller/volume/persistentvolume) and of its
// binder_test.go; the end-to-end tests run the same branches against a
// real kube-apiserver.

// state is an object's phase and what it is bound to after the sync
// ("" for nothing); gone means deleted.
type state struct {
	phase string
	to    string // claim: spec.volumeName; volume: claimRef ns/name
	gone  bool
}

type transition struct {
	name    string
	classes []*storagev1.StorageClass
	volumes []*corev1.PersistentVolume
	claims  []*corev1.PersistentVolumeClaim
	sync    string
	// prov is the provisioner service; nil when none is configured.
	prov *recordingProv
	// reclaim is the reclaimer service; nil when none is configured.
	reclaim *recordingReclaimer
	// writes are the API requests, in order: "verb resource[/sub]".
	writes []string
	// events are the reasons recorded, in order.
	events  []string
	after   map[string]state // "pvc/ns/name" or "pv/name"
	wantErr string
	// handedOff are the volumes given to the reclaimer, or the claims to
	// the provisioner.
	handedOff []string
	// journaled are the volumes whose reclaim is journaled in etcd (read
	// before a rebind); nil: no journal.
	journaled []string
}

type recordingReclaimer struct {
	mu  sync.Mutex
	got []string
	// err is the reclaimer's answer to every hand-off.
	err error
}

func (r *recordingReclaimer) Reclaim(_ context.Context, v *corev1.PersistentVolume) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, v.Name)
	return r.err
}

type recordingProv struct {
	serves string
	mu     sync.Mutex
	got    []string
}

func (p *recordingProv) Serves(_ context.Context, name string) bool { return name == p.serves }
func (p *recordingProv) Provision(_ context.Context, c *corev1.PersistentVolumeClaim, _ *storagev1.StorageClass) (provisionResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, claimKey(c))
	return provisionResult{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND}, nil
}

// Object builders for the table.
func pvT(name, size string, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	v := vol(name, size, opts...)
	v.UID = types.UID("pvuid-" + name)
	return v
}

func pvcT(name, size string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := claimWith(size, opts...)
	c.Name, c.UID = name, types.UID("uid-"+name)
	for _, o := range opts { // options may set the name-derived fields
		o(c)
	}
	return c
}

func refTo(name string, uid types.UID) func(*corev1.PersistentVolume) {
	return func(v *corev1.PersistentVolume) {
		v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "ns", Name: name, UID: uid}
	}
}

func pvPhase(p corev1.PersistentVolumePhase) func(*corev1.PersistentVolume) {
	return func(v *corev1.PersistentVolume) { v.Status.Phase = p }
}

// annotate sets one annotation on a volume or a claim.
func annotate(o metav1.Object, k, val string) {
	a := o.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[k] = val
	o.SetAnnotations(a)
}

func pvAnn(k, val string) func(*corev1.PersistentVolume) {
	return func(v *corev1.PersistentVolume) { annotate(v, k, val) }
}

func policy(p corev1.PersistentVolumeReclaimPolicy) func(*corev1.PersistentVolume) {
	return func(v *corev1.PersistentVolume) { v.Spec.PersistentVolumeReclaimPolicy = p }
}

func pvBlock(v *corev1.PersistentVolume) {
	m := corev1.PersistentVolumeBlock
	v.Spec.VolumeMode = &m
}

func pvClass(cls string) func(*corev1.PersistentVolume) {
	return func(v *corev1.PersistentVolume) { v.Spec.StorageClassName = cls }
}

func volumeName(n string) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = n }
}

func claimAnn(k, val string) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) { annotate(c, k, val) }
}

func claimPhase(p corev1.PersistentVolumeClaimPhase) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) { c.Status.Phase = p }
}

func claimClass(cls string) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = &cls }
}

func claimBlock(c *corev1.PersistentVolumeClaim) {
	m := corev1.PersistentVolumeBlock
	c.Spec.VolumeMode = &m
}

func labelSelector(c *corev1.PersistentVolumeClaim) {
	c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
}

// The four writes of a complete bind, in the binder's order.
var bindWrites = []string{"update persistentvolumes", "update persistentvolumes/status", "update persistentvolumeclaims", "update persistentvolumeclaims/status"}

func TestTransitions(t *testing.T) {
	for _, tc := range transitions() {
		t.Run(tc.name, func(t *testing.T) { runTransition(t, tc) })
	}
}

// transitions are the table's rows, made anew for each caller.
func transitions() []transition {
	imm, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	// A claim the controller bound: its status shows the volume's modes
	// and capacity (1Gi RWO, as every volume of the table).
	boundClaim := func(name, volume string) *corev1.PersistentVolumeClaim {
		return pvcT(name, "1Gi", volumeName(volume), claimPhase(corev1.ClaimBound),
			claimAnn(kube.AnnBindCompleted, "yes"), claimAnn(kube.AnnBoundByController, "yes"),
			func(c *corev1.PersistentVolumeClaim) {
				c.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
				c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
			})
	}
	return []transition{
		// Claims without a volume.
		{name: "unbound claim binds the smallest fitting volume",
			volumes: []*corev1.PersistentVolume{pvT("big", "10Gi"), pvT("fit", "2Gi"), pvT("small", "1Gi")},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "2Gi")}, sync: "pvc/ns/data",
			writes: bindWrites,
			after:  map[string]state{"pvc/ns/data": {phase: "Bound", to: "fit"}, "pv/fit": {phase: "Bound", to: "ns/data"}, "pv/big": {phase: "Available"}}},
		{name: "no volume, no class: FailedBinding, Pending",
			volumes: []*corev1.PersistentVolume{pvT("other", "1Gi")},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", claimClass(""), claimPhase(""))}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims/status"}, events: []string{kube.EventFailedBinding},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/other": {phase: "Available"}}},
		{name: "already Pending, nothing fits: no write",
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", claimClass(""))}, sync: "pvc/ns/data",
			events: []string{kube.EventFailedBinding},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}}},
		{name: "class mismatch does not bind",
			volumes: []*corev1.PersistentVolume{pvT("other-class", "1Gi", pvClass("x"))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", claimClass(""))}, sync: "pvc/ns/data",
			events: []string{kube.EventFailedBinding},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/other-class": {phase: "Available"}}},
		{name: "volume mode mismatch does not bind",
			volumes: []*corev1.PersistentVolume{pvT("block", "1Gi", pvBlock, pvClass(""))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", claimClass(""))}, sync: "pvc/ns/data",
			events: []string{kube.EventFailedBinding},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/block": {phase: "Available"}}},
		{name: "block claim, filesystem volume: no bind",
			volumes: []*corev1.PersistentVolume{pvT("fs", "1Gi", pvClass(""))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", claimClass(""), claimBlock)}, sync: "pvc/ns/data",
			events: []string{kube.EventFailedBinding},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/fs": {phase: "Available"}}},
		{name: "selector picks the labelled volume",
			volumes: []*corev1.PersistentVolume{pvT("plain", "1Gi"), pvT("gold", "5Gi", func(v *corev1.PersistentVolume) { v.Labels = map[string]string{"tier": "gold"} })},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", labelSelector)}, sync: "pvc/ns/data",
			writes: bindWrites,
			after:  map[string]state{"pvc/ns/data": {phase: "Bound", to: "gold"}, "pv/plain": {phase: "Available"}}},
		{name: "a volume pre-bound to the claim wins over a better fit",
			volumes: []*corev1.PersistentVolume{pvT("small", "1Gi"), pvT("pre", "9Gi", refTo("data", ""))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: bindWrites,
			after:  map[string]state{"pvc/ns/data": {phase: "Bound", to: "pre"}, "pv/pre": {phase: "Bound", to: "ns/data"}, "pv/small": {phase: "Available"}}},
		{name: "WaitForFirstConsumer without a node waits",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)},
			volumes: []*corev1.PersistentVolume{pvT("free", "1Gi")},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			events: []string{kube.EventWaitForFirstConsumer},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/free": {phase: "Available"}}},
		// As upstream: the PV controller never binds a free volume to a
		// delayed claim (the scheduler pre-binds one); with a node
		// selected and none pre-bound, it provisions.
		{name: "WaitForFirstConsumer with a selected node provisions, even with a free volume",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)},
			volumes: []*corev1.PersistentVolume{pvT("free", "1Gi")},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", claimAnn(kube.AnnSelectedNode, "n1"))}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/free": {phase: "Available"}}},
		{name: "no class: the default class is assigned",
			classes: []*storagev1.StorageClass{class("std", "p", imm, true)},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = nil })}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}}},
		{name: "nothing fits, class of another provisioner: ExternalProvisioning, annotated",
			classes: []*storagev1.StorageClass{class("c", "example.com/nfs", imm, false)},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}}},
		{name: "nothing fits, class volplane serves: handed to the provisioner",
			classes: []*storagev1.StorageClass{class("c", "p", imm, false)},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			prov:   &recordingProv{serves: "p"},
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}}, handedOff: []string{"ns/data"}},
		{name: "nothing fits, class missing: ProvisioningFailed",
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			events: []string{kube.EventProvisioningFailed},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending"}}},

		// Claims that name their volume (spec.volumeName, pre-bound by the user).
		{name: "pre-bound claim, volume free: bound (the claim gets bind-completed)",
			volumes: []*corev1.PersistentVolume{pvT("small", "1Gi"), pvT("wanted", "5Gi")},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", volumeName("wanted"))}, sync: "pvc/ns/data",
			writes: bindWrites,
			after:  map[string]state{"pvc/ns/data": {phase: "Bound", to: "wanted"}, "pv/wanted": {phase: "Bound", to: "ns/data"}, "pv/small": {phase: "Available"}}},
		{name: "pre-bound claim, volume missing: Pending",
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", volumeName("later"), claimPhase(""))}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims/status"},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending", to: "later"}}},
		{name: "pre-bound claim, volume too small: VolumeMismatch",
			volumes: []*corev1.PersistentVolume{pvT("small", "1Gi")},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "5Gi", volumeName("small"))}, sync: "pvc/ns/data",
			events: []string{kube.EventVolumeMismatch},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending", to: "small"}, "pv/small": {phase: "Available"}}},
		{name: "pre-bound claim, volume bound elsewhere: FailedBinding",
			volumes: []*corev1.PersistentVolume{pvT("taken", "1Gi", refTo("other", "uid-other"), pvPhase(corev1.VolumeBound))},
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", volumeName("taken")),
				boundClaim("other", "taken")}, sync: "pvc/ns/data",
			events: []string{kube.EventFailedBinding},
			after:  map[string]state{"pvc/ns/data": {phase: "Pending", to: "taken"}, "pv/taken": {phase: "Bound", to: "ns/other"}}},

		// Bound claims (bind-completed).
		{name: "bound claim, all in place: no write",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeBound), pvAnn(kube.AnnBoundByController, "yes"))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "v")}, sync: "pvc/ns/data",
			after: map[string]state{"pvc/ns/data": {phase: "Bound", to: "v"}, "pv/v": {phase: "Bound", to: "ns/data"}}},
		{name: "bound claim, volume missing: Lost",
			claims: []*corev1.PersistentVolumeClaim{boundClaim("data", "gone")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims/status"}, events: []string{kube.EventClaimLost},
			after: map[string]state{"pvc/ns/data": {phase: "Lost", to: "gone"}}},
		{name: "bound claim lost its volumeName: Lost",
			claims: []*corev1.PersistentVolumeClaim{boundClaim("data", "")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims/status"}, events: []string{kube.EventClaimLost},
			after: map[string]state{"pvc/ns/data": {phase: "Lost"}}},
		{name: "half-done bind (claim written, volume not): the volume is bound again",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi")},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "v")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumes", "update persistentvolumes/status"},
			after:  map[string]state{"pvc/ns/data": {phase: "Bound", to: "v"}, "pv/v": {phase: "Bound", to: "ns/data"}}},
		{name: "two claims on one volume: the wrong one is Misbound, Lost",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("other", "uid-other"), pvPhase(corev1.VolumeBound))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "v"), boundClaim("other", "v")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims/status"}, events: []string{kube.EventClaimMisbound},
			after: map[string]state{"pvc/ns/data": {phase: "Lost", to: "v"}, "pv/v": {phase: "Bound", to: "ns/other"}}},

		// Volumes.
		{name: "new volume without a claim: Available",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", pvPhase(corev1.VolumePending))}, sync: "pv/v",
			writes: []string{"update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Available"}}},
		{name: "volume pre-bound by the user to a claim (no UID): Available until the claim binds it",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", ""), pvPhase(corev1.VolumePending))}, sync: "pv/v",
			writes: []string{"update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Available", to: "ns/data"}}},
		{name: "volume bound, claim names it: Bound",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeAvailable))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "v")}, sync: "pv/v",
			writes: []string{"update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Bound", to: "ns/data"}}},
		{name: "volume's claim is gone, Retain: Released, handed to the reclaimer",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("gone", "uid-gone"), pvPhase(corev1.VolumeBound), policy(corev1.PersistentVolumeReclaimRetain))},
			sync:    "pv/v", reclaim: &recordingReclaimer{},
			writes: []string{"get persistentvolumeclaims", "update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Released", to: "ns/gone"}}, handedOff: []string{"v"}},
		{name: "volume's claim was recreated (another UID): Released",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeBound), policy(corev1.PersistentVolumeReclaimDelete))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pv/v", reclaim: &recordingReclaimer{},
			writes: []string{"get persistentvolumeclaims", "update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Released", to: "ns/data"}, "pvc/ns/data": {phase: "Pending"}}, handedOff: []string{"v"}},
		{name: "unknown reclaim policy: Failed with VolumeUnknownReclaimPolicy",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("gone", "uid-gone"), pvPhase(corev1.VolumeReleased), policy("Shred"))},
			sync:    "pv/v", reclaim: &recordingReclaimer{},
			writes: []string{"update persistentvolumes/status"}, events: []string{kube.EventVolumeUnknownReclaim},
			after: map[string]state{"pv/v": {phase: "Failed", to: "ns/gone"}}},
		{name: "claim bound to another volume, volume bound by the controller: given back",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeBound), pvAnn(kube.AnnBoundByController, "yes"))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "w")}, sync: "pv/v",
			writes: []string{"update persistentvolumes", "update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Available"}}},
		// As upstream: a volume the user pre-bound keeps pointing at the
		// claim (its UID cleared) and waits, Available.
		{name: "claim bound to another volume, volume pre-bound by the user: unbound but still named",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeBound), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "w")}, sync: "pv/v",
			writes: []string{"update persistentvolumes", "update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Available", to: "ns/data"}}},
		{name: "provisioned for a claim that got another volume, Delete: Released and reclaimed",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeBound),
				pvAnn(kube.AnnDynamicallyProvisioned, "p"), policy(corev1.PersistentVolumeReclaimDelete))},
			claims: []*corev1.PersistentVolumeClaim{boundClaim("data", "w")}, sync: "pv/v", reclaim: &recordingReclaimer{},
			writes: []string{"update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Released", to: "ns/data"}}, handedOff: []string{"v"}},
		// As kube-controller-manager (isVolumeReleased: a claim bound to
		// another volume releases this one): a volume the in-tree host-path
		// plugin provisioned goes the same way (with the in-tree deletion
		// finalizer first, as upstream); the reclaimer finds no deleter for
		// it and marks it Failed (VolumeFailedDelete).
		{name: "host-path provisioned for a claim that got another volume, Delete: Released and reclaimed",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeBound),
				pvAnn(kube.AnnDynamicallyProvisioned, kube.PluginHostPath), policy(corev1.PersistentVolumeReclaimDelete))},
			claims: []*corev1.PersistentVolumeClaim{boundClaim("data", "w")}, sync: "pv/v", reclaim: &recordingReclaimer{},
			writes: []string{"update persistentvolumes", "update persistentvolumes/status"},
			after:  map[string]state{"pv/v": {phase: "Released", to: "ns/data"}, "pvc/ns/data": {phase: "Bound", to: "w"}}, handedOff: []string{"v"}},
		// A hand-off the reclaimer refuses for the state of the volume or
		// its claims (FailedPrecondition) ends the sync without an error:
		// no retry with backoff, the volume is handed over again when it
		// or its claim changes, and at the resync.
		{name: "claim bound to another volume, the reclaimer refuses the hand-off: Released, no retry",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeReleased),
				pvAnn(kube.AnnDynamicallyProvisioned, "p"), policy(corev1.PersistentVolumeReclaimDelete))},
			claims: []*corev1.PersistentVolumeClaim{boundClaim("data", "w")}, sync: "pv/v",
			reclaim: &recordingReclaimer{err: status.Error(codes.FailedPrecondition, `claim ns/data (uid uid-data) still exists: volume "v" is not released`)},
			writes:  []string{"get persistentvolumeclaims"}, // a Released volume's claim is read from the API
			after:   map[string]state{"pv/v": {phase: "Released", to: "ns/data"}, "pvc/ns/data": {phase: "Bound", to: "w"}}, handedOff: []string{"v"}},
		{name: "the reclaimer unreachable: the sync fails (retried with backoff)",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("gone", "uid-gone"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimDelete))},
			sync:    "pv/v", reclaim: &recordingReclaimer{err: status.Error(codes.Unavailable, "connection refused")},
			wantErr: "connection refused",
			after:   map[string]state{"pv/v": {phase: "Released", to: "ns/gone"}}, handedOff: []string{"v"}},
		// volplane's guard (refuseRebind; docs/chaos.md counts such flips
		// as a violation): a Released volume is
		// never bound again to the claim it was released from, even when a
		// claim of that UID shows up bound to it (a stale cache); the API
		// is asked, and an administrator decides.
		{name: "Released volume whose claim shows up alive: not bound again",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "v")}, sync: "pv/v", reclaim: &recordingReclaimer{},
			writes: []string{"get persistentvolumeclaims", "get persistentvolumeclaims"},
			after:  map[string]state{"pv/v": {phase: "Released", to: "ns/data"}, "pvc/ns/data": {phase: "Bound", to: "v"}}},
		{name: "Released volume, its bound claim synced: not bound again",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{boundClaim("data", "v")}, sync: "pvc/ns/data",
			writes: []string{"get persistentvolumeclaims"},
			after:  map[string]state{"pv/v": {phase: "Released", to: "ns/data"}, "pvc/ns/data": {phase: "Bound", to: "v"}}},

		// Rebinding a Released volume to its recreated claim (rebind.go),
		// opt-in with volplane.io/rebind-released on the class or volume.
		{name: "rebind on: the recreated claim gets its Released Retain volume back",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain)),
				pvT("free", "1Gi")},
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data", journaled: []string{},
			writes: append([]string{"get persistentvolumeclaims"}, bindWrites...), events: []string{EventVolumeRebound, EventVolumeRebound},
			after: map[string]state{"pvc/ns/data": {phase: "Bound", to: "v"}, "pv/v": {phase: "Bound", to: "ns/data"}, "pv/free": {phase: "Available"}}},
		{name: "rebind on for the volume alone (its annotation), none on the class: rebound",
			classes: []*storagev1.StorageClass{rebindClass("")},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain),
				pvAnn(AnnRebindReleased, RebindSameClaimName))},
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: append([]string{"get persistentvolumeclaims"}, bindWrites...), events: []string{EventVolumeRebound, EventVolumeRebound},
			after: map[string]state{"pvc/ns/data": {phase: "Bound", to: "v"}, "pv/v": {phase: "Bound", to: "ns/data"}}},
		// Off (the default): exactly kube-controller-manager's behaviour,
		// as the row "volume's claim was recreated" above: the claim is
		// provisioned, the volume stays Released.
		{name: "rebind off: the recreated claim is provisioned, the volume stays Released",
			classes: []*storagev1.StorageClass{rebindClass("")},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		{name: "rebind on for the class, Never on the volume: not rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain),
				pvAnn(AnnRebindReleased, RebindNever))},
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		{name: "rebind on, a claim of another name: not rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data-1", "1Gi")}, sync: "pvc/ns/data-1",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data-1": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		{name: "rebind on, a claim of that name in another namespace: not rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi", func(c *corev1.PersistentVolumeClaim) { c.Namespace = "other" })},
			sync:    "pvc/other/data",
			writes:  []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/other/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		{name: "rebind on, the recreated claim asks for more than the volume has: not rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "2Gi")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		{name: "rebind on, a Recycle volume (its data may be scrubbed): not rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRecycle))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		{name: "rebind on, a Delete volume: not rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimDelete))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: []string{"update persistentvolumeclaims"}, events: []string{kube.EventExternalProvisioning},
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		// A Retain volume whose reclaim is journaled (its policy was
		// changed while a Delete ran): the data may be going; the claim is
		// told and synced again with backoff, nothing is written.
		{name: "rebind on, a reclaim of the volume is journaled: refused, nothing written",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data", journaled: []string{"v"},
			writes: []string{"get persistentvolumeclaims"}, events: []string{EventVolumeRebindRefused}, wantErr: "rebind refused",
			after: map[string]state{"pvc/ns/data": {phase: "Pending"}, "pv/v": {phase: "Released", to: "ns/data"}}},
		// A rebind interrupted after the claimRef was written: the claim's
		// next sync finishes it (and says so: the first Events may not have
		// been recorded).
		{name: "rebind on, interrupted after the claimRef: finished",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain),
				pvAnn(kube.AnnBoundByController, "yes"))},
			claims: []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data",
			writes: []string{"get persistentvolumeclaims", "update persistentvolumes/status", "update persistentvolumeclaims", "update persistentvolumeclaims/status"},
			events: []string{EventVolumeRebound, EventVolumeRebound},
			after:  map[string]state{"pvc/ns/data": {phase: "Bound", to: "v"}, "pv/v": {phase: "Bound", to: "ns/data"}}},
		{name: "claim not yet bound, volume modes differ: VolumeMismatch on both, no write",
			volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-data"), pvPhase(corev1.VolumeAvailable), pvBlock)},
			claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pv/v",
			events: []string{kube.EventVolumeMismatch, kube.EventVolumeMismatch},
			after:  map[string]state{"pv/v": {phase: "Available", to: "ns/data"}, "pvc/ns/data": {phase: "Pending"}}},
	}
}

func runTransition(t *testing.T, tc transition) {
	ctx := context.Background()
	c, client, recorder := setUpTransition(t, tc)
	err := syncTransition(ctx, t, c, tc)
	if tc.wantErr == "" && err != nil {
		t.Fatalf("sync: %v", err)
	}
	if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
		t.Fatalf("sync: %v, want an error with %q", err, tc.wantErr)
	}

	// The transitions copy before they change an object: the parts the
	// cached objects share are as they were interned.
	if err := c.store.shared.check(); err != nil {
		t.Error(err)
	}

	if writes := requests(client); !slices.Equal(writes, tc.writes) {
		t.Errorf("requests %q, want %q", writes, tc.writes)
	}
	if reasons := reasons(recorder); !slices.Equal(reasons, tc.events) {
		t.Errorf("events %q, want %q", reasons, tc.events)
	}
	for key, want := range tc.after {
		if got := stateOf(ctx, t, client, key); got != want {
			t.Errorf("%s after the sync: %+v, want %+v", key, got, want)
		}
	}
	var handed []string
	if tc.reclaim != nil {
		handed = append(handed, tc.reclaim.got...)
	}
	if tc.prov != nil {
		tc.prov.mu.Lock()
		handed = append(handed, tc.prov.got...)
		tc.prov.mu.Unlock()
	}
	if !slices.Equal(handed, tc.handedOff) {
		t.Errorf("handed off %q, want %q", handed, tc.handedOff)
	}
}

// setUpTransition makes a controller whose cache and fake API server hold
// the row's objects.
func setUpTransition(t *testing.T, tc transition) (*controller, *fake.Clientset, *record.FakeRecorder) {
	ctx := context.Background()
	client := fake.NewClientset()
	recorder := record.NewFakeRecorder(100)
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorder)
	if tc.prov != nil {
		c.provisioner = tc.prov
	}
	if tc.reclaim != nil {
		c.reclaimer = tc.reclaim
	}
	if tc.journaled != nil {
		c.journal = journalOf(tc.journaled...)
	}
	for _, sc := range tc.classes {
		created, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.store.putClass(created)
	}
	for _, v := range tc.volumes {
		created, err := client.CoreV1().PersistentVolumes().Create(ctx, v, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.store.putVolume(created.DeepCopy())
	}
	for _, cl := range tc.claims {
		created, err := client.CoreV1().PersistentVolumeClaims(cl.Namespace).Create(ctx, cl, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.store.putClaim(created.DeepCopy())
	}
	c.Synced()
	client.ClearActions()
	return c, client, recorder
}

// syncTransition runs the row's sync, and waits for the provisioning
// attempt it started off the workers.
func syncTransition(ctx context.Context, t *testing.T, c *controller, tc transition) error {
	var err error
	switch kind, key, _ := strings.Cut(tc.sync, "/"); kind {
	case "pvc":
		err = c.syncClaim(ctx, c.store.claim(key))
	case "pv":
		err = c.syncVolume(ctx, c.store.volume(key))
	default:
		t.Fatalf("bad sync %q", tc.sync)
	}
	if kind, key, _ := strings.Cut(tc.sync, "/"); kind == "pvc" && tc.prov != nil {
		for deadline := time.Now().Add(10 * time.Second); c.provisions.busy(key); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the provisioning attempt did not finish")
			}
		}
	}
	return err
}

// requests are the API requests the client saw, "verb resource[/sub]",
// lists and watches left out.
func requests(client *fake.Clientset) []string {
	var writes []string
	for _, a := range client.Actions() {
		r := a.GetResource().Resource
		if a.GetSubresource() != "" {
			r += "/" + a.GetSubresource()
		}
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		writes = append(writes, a.GetVerb()+" "+r)
	}
	return writes
}

// reasons are the reasons of the Events recorded since the last call.
func reasons(recorder *record.FakeRecorder) []string {
	var reasons []string
	for len(recorder.Events) > 0 {
		f := strings.Fields(<-recorder.Events)
		if len(f) > 1 {
			reasons = append(reasons, f[1])
		}
	}
	return reasons
}

// stateOf is the state of "pvc/ns/name" or "pv/name" in the API server.
func stateOf(ctx context.Context, t *testing.T, client *fake.Clientset, key string) state {
	kind, name, _ := strings.Cut(key, "/")
	var got state
	switch kind {
	case "pvc":
		ns, n, _ := strings.Cut(name, "/")
		cl, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, n, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			got.gone = true
		case err != nil:
			t.Fatal(err)
		default:
			got = state{phase: string(cl.Status.Phase), to: cl.Spec.VolumeName}
		}
	case "pv":
		v, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			got.gone = true
		case err != nil:
			t.Fatal(err)
		default:
			got.phase = string(v.Status.Phase)
			if v.Spec.ClaimRef != nil {
				got.to = v.Spec.ClaimRef.Namespace + "/" + v.Spec.ClaimRef.Name
			}
		}
	}
	return got
}
