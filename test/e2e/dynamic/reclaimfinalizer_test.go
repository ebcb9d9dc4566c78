package dynamic

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// A CSI volume of a driver volplane serves that an administrator created
// (no provisioned-by) gets external-provisioner's finalizer by
// HonorPVReclaimPolicy's rules, as external-provisioner v6.3.0 gives it:
// on once Bound with policy Delete, off when the policy turns Retain, on
// again with Delete; released, its backing volume is deleted through the
// provisioner and the finalizer goes with the volume.
func TestStaticCSIVolumeGetsTheReclaimFinalizer(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	created, err := cluster.csi.CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name:          "static-" + ns,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	handle := created.GetVolume().GetVolumeId()
	name := "static-" + ns
	pv, err := cluster.client.CoreV1().PersistentVolumes().Create(t.Context(), &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driverName, VolumeHandle: handle}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	finalized := func(want bool) func() string {
		return func() string {
			v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{})
			if err != nil || slices.Contains(v.Finalizers, kube.FinalizerExternalProvisioner) != want {
				return fmt.Sprintf("volume %s: finalizers %v, phase %s (%v); want %s: %v", name, v.GetFinalizers(), v.Status.Phase, err, kube.FinalizerExternalProvisioner, want)
			}
			return ""
		}
	}
	setPolicy := func(p corev1.PersistentVolumeReclaimPolicy) {
		t.Helper()
		e2e.Eventually(t, 30*time.Second, func() string {
			v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			v.Spec.PersistentVolumeReclaimPolicy = p
			if _, err := cluster.client.CoreV1().PersistentVolumes().Update(t.Context(), v, metav1.UpdateOptions{}); err != nil {
				return err.Error()
			}
			return ""
		})
	}
	// Available: not yet.
	e2e.Eventually(t, 30*time.Second, func() string {
		v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || v.Status.Phase != corev1.VolumeAvailable {
			return fmt.Sprintf("volume %v (%v), want Available", v.Status.Phase, err)
		}
		return ""
	})
	if msg := finalized(false)(); msg != "" {
		t.Errorf("an Available volume: %s", msg)
	}
	none := ""
	createClaim(t, ns, "data", "1Gi", "", func(c *corev1.PersistentVolumeClaim) {
		c.Spec.StorageClassName = &none
		c.Spec.VolumeName = name
	})
	bound(t, ns, "data")
	e2e.Eventually(t, 30*time.Second, finalized(true))
	setPolicy(corev1.PersistentVolumeReclaimRetain)
	e2e.Eventually(t, 30*time.Second, finalized(false))
	setPolicy(corev1.PersistentVolumeReclaimDelete)
	e2e.Eventually(t, 30*time.Second, finalized(true))

	if err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 60*time.Second, func() string {
		if v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the released volume is still there: %v %v (%v)", v.Status.Phase, v.GetFinalizers(), err)
		}
		return ""
	})
	if n := len(cluster.requests.deletesOf(handle)); n == 0 {
		t.Errorf("no DeleteVolume of the static volume's handle %s", handle)
	}
}
