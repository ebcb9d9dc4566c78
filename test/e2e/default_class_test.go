package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// A claim created without a class while no default class exists waits;
// once a default class appears the binder assigns it (Kubernetes'
// retroactive default StorageClass) and binds the claim to a volume of
// that class.
func TestDefaultClassAssignedRetroactively(t *testing.T) {
	n := ns(t)
	c := newPVC(n, "data", "1Gi", "")
	c.Spec.StorageClassName = nil
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(n).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventFailedBinding, "no persistent volumes available for this claim and no storage class is set")

	cls := n + "-default"
	createPV(t, n+"-pv", "1Gi", cls)
	immediate := storagev1.VolumeBindingImmediate
	if _, err := cluster.client.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: cls, Annotations: map[string]string{kube.AnnDefaultStorageClass: "true"}},
		Provisioner:       "example.com/none",
		VolumeBindingMode: &immediate,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Other tests' claims must not get this default class.
	t.Cleanup(func() {
		_ = cluster.client.StorageV1().StorageClasses().Delete(context.Background(), cls, metav1.DeleteOptions{})
	})
	got := pvcPhase(t, n, "data", corev1.ClaimBound)
	if got.Spec.StorageClassName == nil || *got.Spec.StorageClassName != cls || got.Spec.VolumeName != n+"-pv" {
		t.Fatalf("claim class %v, volume %q; want class %s and volume %s-pv", got.Spec.StorageClassName, got.Spec.VolumeName, cls, n)
	}
}
