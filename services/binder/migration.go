package binder

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// The bookkeeping kube-controller-manager's PV controller keeps on in-tree
// volumes and claims before every sync (updateClaimMigrationAnnotations,
// updateVolumeMigrationAnnotationsAndFinalizers): the migrated-to
// annotation of migrated in-tree plugins, and the kubernetes.io/pv-controller
// finalizer of volumes a non-migrated in-tree plugin provisioned. Objects of
// CSI and external provisioners need no write.

// updateClaimMigrationAnnotations sets or removes the claim's migrated-to
// annotation (upstream's function of the same name, pv_controller_base.go).
func (c *controller) updateClaimMigrationAnnotations(ctx context.Context, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	if !inTree(claim.Annotations, kube.AnnStorageProvisioner, kube.AnnBetaStorageProvisioner) {
		return claim, nil // the common case, without a copy
	}
	clone := claim.DeepCopy()
	if !kube.UpdateMigrationAnnotations(clone.Annotations, true) {
		return claim, nil
	}
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	updated, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.claimWriteFailed(claim, err, "update migration annotations of claim %s", claimKey(claim))
	}
	return c.store.refreshClaim(updated), nil
}

// updateVolumeMigrationAnnotationsAndFinalizers sets or removes the
// volume's migrated-to annotation and its in-tree deletion finalizers
// (upstream's function of the same name).
func (c *controller) updateVolumeMigrationAnnotationsAndFinalizers(ctx context.Context, volume *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	if !inTree(volume.Annotations, kube.AnnDynamicallyProvisioned) {
		return volume, nil // the common case, without a copy
	}
	clone := volume.DeepCopy()
	annotated := kube.UpdateMigrationAnnotations(clone.Annotations, false)
	finalizers, changed := kube.DeletionFinalizers(clone)
	if !annotated && !changed {
		return volume, nil
	}
	clone.Finalizers = finalizers
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.volumeWriteFailed(volume, err, "update migration annotations or finalizers of volume %s", volume.Name)
	}
	return c.store.refreshVolume(updated), nil
}

// inTree reports whether an object may need updating: one of its
// provisioner annotations names an in-tree plugin, or it carries
// migrated-to (which may have to go).
func inTree(ann map[string]string, keys ...string) bool {
	if _, ok := ann[kube.AnnMigratedTo]; ok {
		return true
	}
	for _, k := range keys {
		if strings.HasPrefix(ann[k], "kubernetes.io/") {
			return true
		}
	}
	return false
}
