package provisioner

import (
	"maps"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// volumeSpec is everything the PV is made of besides the driver's answer.
type volumeSpec struct {
	name        string
	provisioner string // the class's provisioner name (provisioned-by)
	driver      string // the CSI driver name (spec.csi.driver)
	claim       *corev1.PersistentVolumeClaim
	class       *storagev1.StorageClass
	fsType      string
	// topology: the PV gets node affinity from where the volume is
	// accessible (see topologyFor); attributesClass: the claim's
	// volumeAttributesClassName is copied (the VolumeAttributesClass
	// gate); readOnly: spec.csi.readOnly (see readOnlyVolume).
	topology, attributesClass, readOnly bool
	// identity is the provisioner's (see identity), recorded in the PV's
	// volume attributes as external-provisioner records its own.
	identity string
	// secrets the PV's CSI source refers to, by kind (see secretParams);
	// "provisioner" becomes the deletion-secret annotations.
	secrets map[string]*secretRef
	// node is the node a node-deployed driver's volume is made on
	// (nodedeploy.go); "": the claim's selected node, if any.
	node string
}

// buildVolume is the PersistentVolume for a volume the driver made: the CSI
// source, the capacity the driver reports (the request when it reports
// none), node affinity from where the volume is accessible, the class's
// mount options and reclaim policy, provisioned-by, a claimRef to the
// claim, and the deletion finalizer when the policy is Delete.
func buildVolume(s volumeSpec, vol *csi.Volume) *corev1.PersistentVolume {
	policy := corev1.PersistentVolumeReclaimDelete
	if s.class.ReclaimPolicy != nil {
		policy = *s.class.ReclaimPolicy
	}
	capacity := s.claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if vol.GetCapacityBytes() > 0 {
		capacity = *resource.NewQuantity(vol.GetCapacityBytes(), resource.BinarySI)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        s.name,
			Annotations: map[string]string{kube.AnnDynamicallyProvisioned: s.provisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:                   s.claim.Spec.AccessModes,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: capacity},
			PersistentVolumeReclaimPolicy: policy,
			StorageClassName:              s.class.Name,
			MountOptions:                  s.class.MountOptions,
			VolumeMode:                    s.claim.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				Kind:            "PersistentVolumeClaim",
				APIVersion:      "v1",
				Namespace:       s.claim.Namespace,
				Name:            s.claim.Name,
				UID:             s.claim.UID,
				ResourceVersion: s.claim.ResourceVersion,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:           s.driver,
				VolumeHandle:     vol.GetVolumeId(),
				FSType:           s.fsType,
				VolumeAttributes: volumeAttributes(s.identity, vol.GetVolumeContext()),
				ReadOnly:         s.readOnly,
			}},
		},
	}
	if s.topology {
		pv.Spec.NodeAffinity = nodeAffinity(vol.GetAccessibleTopology())
	}
	if vac := attributesClassName(s.claim); s.attributesClass && vac != "" {
		pv.Spec.VolumeAttributesClassName = &vac
	}
	if policy == corev1.PersistentVolumeReclaimDelete {
		pv.Finalizers = []string{kube.FinalizerExternalProvisioner}
	}
	src := pv.Spec.CSI
	ref := func(kind string) *corev1.SecretReference {
		if r := s.secrets[kind]; r != nil {
			return &corev1.SecretReference{Namespace: r.Namespace, Name: r.Name}
		}
		return nil
	}
	src.ControllerPublishSecretRef = ref("controller-publish")
	src.NodeStageSecretRef = ref("node-stage")
	src.NodePublishSecretRef = ref("node-publish")
	src.ControllerExpandSecretRef = ref("controller-expand")
	src.NodeExpandSecretRef = ref("node-expand")
	// As external-provisioner: the deletion secret, or both annotations
	// empty for "none", so that deletion never looks at the class again.
	pv.Annotations[annDeletionSecretName], pv.Annotations[annDeletionSecretNamespace] = "", ""
	if r := s.secrets["provisioner"]; r != nil {
		pv.Annotations[annDeletionSecretName] = r.Name
		pv.Annotations[annDeletionSecretNamespace] = r.Namespace
	}
	// The secret external-resizer's ControllerModifyVolume uses, only when
	// the class names one (as upstream).
	if r := s.secrets["controller-modify"]; r != nil {
		pv.Annotations[annModifySecretName], pv.Annotations[annModifySecretNamespace] = r.Name, r.Namespace
	}
	return pv
}

// provisionerIdentityKey is the volume attribute external-provisioner
// records its identity under.
const provisionerIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"

// volumeAttributes are the driver's volume context plus the provisioner's
// identity; as upstream, a driver's key of the same name wins.
func volumeAttributes(identity string, context map[string]string) map[string]string {
	out := make(map[string]string, len(context)+1)
	out[provisionerIdentityKey] = identity
	maps.Copy(out, context)
	return out
}
