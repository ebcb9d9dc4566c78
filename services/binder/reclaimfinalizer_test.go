package binder

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
)

// The external-provisioner finalizer by sig-storage-lib-external-provisioner
// v13's handleProtectionFinalizer (AddFinalizer on), for volumes of the
// provisioners and drivers volplane serves only.
func TestReclaimFinalizers(t *testing.T) {
	const drv = "hostpath.csi.volplane.io"
	set := served.Set{Known: true, Drivers: map[string]bool{drv: true}, Provisioners: map[string]bool{drv: true, "fast": true}}
	now := metav1.Now()
	vol := func(policy corev1.PersistentVolumeReclaimPolicy, phase corev1.PersistentVolumePhase, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
		v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "v", Finalizers: []string{kube.FinalizerPVProtection}},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: policy,
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: drv, VolumeHandle: "h"}}},
			Status: corev1.PersistentVolumeStatus{Phase: phase}}
		for _, o := range opts {
			o(v)
		}
		return v
	}
	with := func(v *corev1.PersistentVolume) {
		v.Finalizers = append(v.Finalizers, kube.FinalizerExternalProvisioner)
	}
	deleting := func(v *corev1.PersistentVolume) { v.DeletionTimestamp = &now }
	by := func(name string) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) {
			metav1.SetMetaDataAnnotation(&v.ObjectMeta, kube.AnnDynamicallyProvisioned, name)
		}
	}
	driver := func(name string) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) { v.Spec.CSI.Driver = name }
	}
	hostPath := func(v *corev1.PersistentVolume) {
		v.Spec.CSI = nil
		v.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/x"}
	}
	ext, prot := kube.FinalizerExternalProvisioner, kube.FinalizerPVProtection
	for _, tc := range []struct {
		name    string
		v       *corev1.PersistentVolume
		set     served.Set
		want    []string
		changed bool
	}{
		{"static CSI, Delete, Bound: added", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound), set, []string{prot, ext}, true},
		{"static CSI, Delete, Available: not yet", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeAvailable), set, []string{prot}, false},
		{"static CSI, Delete, Released: not added", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeReleased), set, []string{prot}, false},
		{"static CSI, Delete, Bound, being deleted: not added", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, deleting), set, []string{prot}, false},
		{"static CSI, Delete, Released, has it: kept", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeReleased, with), set, []string{prot, ext}, false},
		{"static CSI, Retain: removed", vol(corev1.PersistentVolumeReclaimRetain, corev1.VolumeBound, with), set, []string{prot}, true},
		{"static CSI, Recycle: removed", vol(corev1.PersistentVolumeReclaimRecycle, corev1.VolumeReleased, with), set, []string{prot}, true},
		{"static CSI, Retain, being deleted: removed", vol(corev1.PersistentVolumeReclaimRetain, corev1.VolumeBound, with, deleting), set, []string{prot}, true},
		{"static CSI, Retain, without: nothing", vol(corev1.PersistentVolumeReclaimRetain, corev1.VolumeBound), set, []string{prot}, false},
		{"provisioned, policy turned Retain: removed", vol(corev1.PersistentVolumeReclaimRetain, corev1.VolumeBound, with, by(drv)), set, []string{prot}, true},
		{"provisioned, policy turned Delete: added", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, by(drv)), set, []string{prot, ext}, true},
		{"provisioned under a mapped name", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, by("fast"), driver("other.csi")), set, []string{prot, ext}, true},
		{"another driver's static volume: left alone", vol(corev1.PersistentVolumeReclaimRetain, corev1.VolumeBound, with, driver("other.csi")), set, []string{prot, ext}, false},
		{"another provisioner's volume of a served driver: left alone", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, by("other.io")), set, []string{prot}, false},
		{"in-tree provisioned: left alone", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, by("kubernetes.io/rbd"), hostPath), set, []string{prot}, false},
		{"in-tree migrated to a served driver", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, by("kubernetes.io/rbd"), hostPath, func(v *corev1.PersistentVolume) {
			metav1.SetMetaDataAnnotation(&v.ObjectMeta, kube.AnnMigratedTo, drv)
		}), set, []string{prot, ext}, true},
		{"static hostPath: left alone", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound, hostPath), set, []string{prot}, false},
		{"served set not known: left alone", vol(corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound), served.Set{}, []string{prot}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.v.Finalizers)
			got, changed := reclaimFinalizers(tc.v, tc.set)
			if !slices.Equal(got, tc.want) || changed != tc.changed {
				t.Errorf("finalizers %v changed %v, want %v %v", got, changed, tc.want, tc.changed)
			}
			if !slices.Equal(tc.v.Finalizers, before) {
				t.Errorf("the volume's own finalizers were modified: %v", tc.v.Finalizers)
			}
		})
	}
}
