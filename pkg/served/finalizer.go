package served

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// Owns is sig-storage-lib-external-provisioner v13's
// isProvisionerForVolume over the served set: a provisioned volume by its
// provisioned-by (or migrated-to) annotation, a static CSI volume by its
// driver, any other static one by migrated-to.
func (s Set) Owns(v *corev1.PersistentVolume) bool {
	if by, ok := v.Annotations[kube.AnnDynamicallyProvisioned]; ok {
		return s.Has(by) || s.Has(v.Annotations[kube.AnnMigratedTo])
	}
	if v.Spec.CSI != nil {
		return s.Has(v.Spec.CSI.Driver)
	}
	return s.Has(v.Annotations[kube.AnnMigratedTo])
}

// ProtectionFinalizers returns the finalizers of a volume of a served
// provisioner as the library's handleProtectionFinalizer leaves them
// (external-provisioner v6.3.0 runs it with AddFinalizer(true)), and
// whether they changed: the external-provisioner finalizer is added to a
// Bound volume with policy Delete that is not being deleted, and removed
// from one whose policy is Retain or Recycle. Anything else, any volume
// of another provisioner, and every volume while the set is not known, is
// left alone.
func (s Set) ProtectionFinalizers(v *corev1.PersistentVolume) ([]string, bool) {
	if !s.Known || !s.Owns(v) {
		return v.Finalizers, false
	}
	has := slices.Contains(v.Finalizers, kube.FinalizerExternalProvisioner)
	switch policy := v.Spec.PersistentVolumeReclaimPolicy; {
	case policy == corev1.PersistentVolumeReclaimDelete && !has && v.DeletionTimestamp == nil && v.Status.Phase == corev1.VolumeBound:
		return append(slices.Clone(v.Finalizers), kube.FinalizerExternalProvisioner), true
	case (policy == corev1.PersistentVolumeReclaimRetain || policy == corev1.PersistentVolumeReclaimRecycle) && has:
		return slices.DeleteFunc(slices.Clone(v.Finalizers), func(f string) bool { return f == kube.FinalizerExternalProvisioner }), true
	}
	return v.Finalizers, false
}
