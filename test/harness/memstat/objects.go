package memstat

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
)

// BoundPair is a Bound CSI volume and its claim as a list from the API
// server decodes them: every field the server adds (UID,
// resourceVersion, creation time, managedFields, finalizers, statuses),
// each string its own allocation.
func BoundPair(i int) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim) {
	name := fmt.Sprintf("pvc-0b7c1a2e-5f3d-4c1b-9a8e-%012d", i)
	ns := fmt.Sprintf("team-%02d", i%50)
	size := resource.MustParse("10Gi")
	created := metav1.Unix(1_790_000_000+int64(i), 0)
	managed := []metav1.ManagedFieldsEntry{{Manager: "volplane", Operation: metav1.ManagedFieldsOperationUpdate,
		APIVersion: "v1", Time: &created, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 400)))}}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(fmt.Sprintf("1f0c2b3d-4e5f-4a6b-8c7d-%012d", i)),
			ResourceVersion: fmt.Sprint(100_000 + 2*i), CreationTimestamp: created, ManagedFields: managed,
			Annotations: map[string]string{kube.AnnDynamicallyProvisioned: "csi.example.com"},
			Finalizers:  []string{kube.FinalizerExternalProvisioner, "kubernetes.io/pv-protection"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "standard",
			VolumeMode:                    new(corev1.PersistentVolumeFilesystem),
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: fmt.Sprintf("data-%06d", i),
				UID: types.UID(fmt.Sprintf("2a1b3c4d-5e6f-4a7b-8c9d-%012d", i)), ResourceVersion: fmt.Sprint(100_001 + 2*i)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "csi.example.com", VolumeHandle: fmt.Sprintf("vol-%08x", i), FSType: "ext4",
				VolumeAttributes: map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1790000000000-1234-csi.example.com"}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound, LastPhaseTransitionTime: &created},
	}
	class := "standard"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("data-%06d", i), UID: pv.Spec.ClaimRef.UID,
			ResourceVersion: fmt.Sprint(100_001 + 2*i), CreationTimestamp: created, ManagedFields: managed,
			Annotations: map[string]string{kube.AnnBindCompleted: "yes", kube.AnnBoundByController: "yes",
				kube.AnnStorageProvisioner: "csi.example.com", kube.AnnBetaStorageProvisioner: "csi.example.com"},
			Finalizers: []string{"kubernetes.io/pvc-protection"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeName:       name,
			VolumeMode:       new(corev1.PersistentVolumeFilesystem),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size}},
	}
	// Through protobuf, as the informer's list and watch decode them.
	pvb, _ := pv.Marshal()
	pv, _ = kube.DecodeVolume(pvb)
	pvcb, _ := pvc.Marshal()
	pvc, _ = kube.DecodeClaim(pvcb)
	return pv, pvc
}
