package reclaimer

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// TestShouldDelete is the library's shouldDelete table (with
// AddFinalizer(true), as external-provisioner runs it) over the volumes
// of served and other provisioners.
func TestShouldDelete(t *testing.T) {
	const mine = "csi.example.com"
	set := served.Set{Known: true, Drivers: map[string]bool{mine: true}, Provisioners: map[string]bool{mine: true}}
	now := metav1.Now()
	pv := func(mut ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
		v := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pvc-1", Annotations: map[string]string{kube.AnnDynamicallyProvisioned: mine},
				Finalizers: []string{kube.FinalizerExternalProvisioner}},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: "c", UID: "u"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: mine, VolumeHandle: "h"}}},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
		}
		for _, m := range mut {
			m(v)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		v    *corev1.PersistentVolume
		set  served.Set
		want bool
	}{
		{"released delete", pv(), set, true},
		{"failed", pv(func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeFailed }), set, false},
		{"bound", pv(func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeBound }), set, false},
		{"available", pv(func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeAvailable }), set, false},
		{"retain", pv(func(v *corev1.PersistentVolume) {
			v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		}), set, false},
		{"recycle: kube-controller-manager's", pv(func(v *corev1.PersistentVolume) {
			v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRecycle
		}), set, false},
		{"other provisioner", pv(func(v *corev1.PersistentVolume) { v.Annotations[kube.AnnDynamicallyProvisioned] = "other.example.com" }), set, false},
		{"static CSI volume of a served driver", pv(func(v *corev1.PersistentVolume) { delete(v.Annotations, kube.AnnDynamicallyProvisioned) }), set, true},
		{"static CSI volume of another driver", pv(func(v *corev1.PersistentVolume) {
			delete(v.Annotations, kube.AnnDynamicallyProvisioned)
			v.Spec.CSI.Driver = "other.example.com"
		}), set, false},
		{"deleting, finalizer held", pv(func(v *corev1.PersistentVolume) { v.DeletionTimestamp = &now }), set, true},
		{"deleting, finalizer gone", pv(func(v *corev1.PersistentVolume) {
			v.DeletionTimestamp = &now
			v.Finalizers = nil
		}), set, false},
		{"no claim UID", pv(func(v *corev1.PersistentVolume) { v.Spec.ClaimRef.UID = "" }), set, false},
		{"served set unknown", pv(), served.Set{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := shouldDelete(tc.v, tc.set); got != tc.want {
				t.Errorf("shouldDelete = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStandaloneNeedsTheProvisioner(t *testing.T) {
	o := Options{Standalone: true}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--provisioner-address") {
		t.Errorf("validate without --provisioner-address: %v", err)
	}
}

// In standalone mode a failed deletion is an Event at each attempt, as
// external-provisioner's, and the phase stays kube-controller-manager's
// (Released).
func TestStandaloneFailureIsAnEventOnly(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{standalone: true})
	v := releasedPV("static", corev1.PersistentVolumeReclaimDelete, withHostPath("/data/static"))
	kc.addPV(v)
	r.start(t, v)
	want := "host_path deleter only supports /tmp/.+ but received provided /data/static"
	for i := range 2 {
		if rec := r.step(t, "static"); rec.State != reclaimerv1.State_STATE_FAILED {
			t.Fatalf("attempt %d: record %v", i, rec)
		}
		if got := kc.pv("static"); got.Status.Phase != corev1.VolumeReleased {
			t.Errorf("attempt %d: phase %s, want Released (kube-controller-manager's)", i, got.Status.Phase)
		}
		if events := r.drain(); !slices.Equal(events, []string{"Warning VolumeFailedDelete " + want}) {
			t.Errorf("attempt %d: events %q", i, events)
		}
	}
}
