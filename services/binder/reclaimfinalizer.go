package binder

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
)

// The external-provisioner finalizer (HonorPVReclaimPolicy) on every
// volume of a driver volplane's provisioner serves, as
// sig-storage-lib-external-provisioner v13's handleProtectionFinalizer
// keeps it for external-provisioner v6.3.0 (which runs it with
// AddFinalizer(true)) at each sync of a volume: volplane's provisioner
// puts it on the volumes it provisions with policy Delete, and this keeps
// it right when the policy changes and on volumes it did not provision
// (CSI volumes of its drivers an administrator created). The reclaimer's
// deletion removes it once the backing volume is gone.

// servedNow is the provisioner's served drivers as last known, never
// waiting for the provisioner (provisionerClient).
type servedNow interface {
	ServedNow(ctx context.Context) served.Set
}

// ServedNow answers from the cache; until the provisioner has answered,
// an unknown set (and a refresh in the background).
func (p *provisionerClient) ServedNow(ctx context.Context) served.Set {
	done, cancel := context.WithCancel(ctx)
	cancel() // Get returns at once with what it has
	return p.served.Get(done)
}

// ownedByServedProvisioner is the library's isProvisionerForVolume: a
// provisioned volume by its provisioned-by (or migrated-to) annotation, a
// static CSI volume by its driver, any other static one by migrated-to.
func ownedByServedProvisioner(v *corev1.PersistentVolume, s served.Set) bool {
	if by, ok := v.Annotations[kube.AnnDynamicallyProvisioned]; ok {
		return s.Has(by) || s.Has(v.Annotations[kube.AnnMigratedTo])
	}
	if v.Spec.CSI != nil {
		return s.Has(v.Spec.CSI.Driver)
	}
	return s.Has(v.Annotations[kube.AnnMigratedTo])
}

// reclaimFinalizers returns the finalizers of a volume of a served
// provisioner as handleProtectionFinalizer leaves them, and whether they
// changed: the external-provisioner finalizer is added to a Bound volume
// with policy Delete that is not being deleted, and removed from one
// whose policy is Retain or Recycle. Anything else, and any volume of
// another provisioner, or while the served set is not known, is left
// alone.
func reclaimFinalizers(v *corev1.PersistentVolume, s served.Set) ([]string, bool) {
	if !s.Known || !ownedByServedProvisioner(v, s) {
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

// annealReclaimFinalizer writes reclaimFinalizers' answer, if it changes
// anything.
func (c *controller) annealReclaimFinalizer(ctx context.Context, volume *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	if c.served == nil {
		return volume, nil
	}
	finalizers, changed := reclaimFinalizers(volume, c.served.ServedNow(ctx))
	if !changed {
		return volume, nil
	}
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	clone := volume.DeepCopy()
	clone.Finalizers = finalizers
	updated, err := c.client.CoreV1().PersistentVolumes().Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.volumeWriteFailed(volume, err, "set the external-provisioner finalizer of volume %s by its reclaim policy", volume.Name)
	}
	return c.store.refreshVolume(updated), nil
}
