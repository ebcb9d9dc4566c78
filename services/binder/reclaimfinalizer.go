package binder

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// reclaimFinalizers is served.Set.ProtectionFinalizers (the library's
// handleProtectionFinalizer), shared with the reclaimer's standalone mode.
func reclaimFinalizers(v *corev1.PersistentVolume, s served.Set) ([]string, bool) {
	return s.ProtectionFinalizers(v)
}

// updateReclaimFinalizer writes reclaimFinalizers' answer, if it changes
// anything.
func (c *controller) updateReclaimFinalizer(ctx context.Context, volume *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
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
