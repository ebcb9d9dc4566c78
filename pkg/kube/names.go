package kube

import corev1 "k8s.io/api/core/v1"

// Annotations, finalizers and event reasons, spelled as Kubernetes spells them.
const (
	// AnnBindCompleted on a claim: the binder finished binding it.
	AnnBindCompleted = "pv.kubernetes.io/bind-completed"
	// AnnBoundByController on a claim or volume: the controller (not a user)
	// chose the binding.
	AnnBoundByController = "pv.kubernetes.io/bound-by-controller"
	// AnnStorageProvisioner on a claim: the provisioner asked to provision it.
	AnnStorageProvisioner = "volume.kubernetes.io/storage-provisioner"
	// AnnBetaStorageProvisioner is the older spelling, still set for
	// provisioners that read it.
	AnnBetaStorageProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	// AnnSelectedNode on a claim: the scheduler chose this node for a
	// WaitForFirstConsumer claim.
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnDynamicallyProvisioned on a volume: the provisioner that made it.
	AnnDynamicallyProvisioned = "pv.kubernetes.io/provisioned-by"
	// AnnBetaStorageClass is the old way to name a class, still honoured.
	AnnBetaStorageClass = "volume.beta.kubernetes.io/storage-class"
	// AnnPreResizeCapacity on a volume: the claim's capacity before an
	// offline resize.
	AnnPreResizeCapacity = "volume.alpha.kubernetes.io/pre-resize-capacity"
	// AnnDefaultStorageClass on a StorageClass marks the default class.
	AnnDefaultStorageClass = "storageclass.kubernetes.io/is-default-class"
	// AnnBetaDefaultStorageClass is the beta spelling of AnnDefaultStorageClass.
	AnnBetaDefaultStorageClass = "storageclass.beta.kubernetes.io/is-default-class"
	// AnnMigratedTo on a claim or volume: an in-tree volume handled by CSI.
	AnnMigratedTo = "pv.kubernetes.io/migrated-to"

	// FinalizerPVProtection is set by the API server's admission on volumes.
	FinalizerPVProtection = "kubernetes.io/pv-protection"
	// FinalizerPVCProtection is set by the API server's admission on claims.
	FinalizerPVCProtection = "kubernetes.io/pvc-protection"
	// FinalizerExternalProvisioner keeps a provisioned volume with policy
	// Delete until its backing volume is deleted.
	FinalizerExternalProvisioner = "external-provisioner.volume.kubernetes.io/finalizer"

	// ControllerComponent is the event source Kubernetes' PV controller uses;
	// volplane uses the same so that tooling sees the same events.
	ControllerComponent = "persistentvolume-controller"
)

// Event reasons, as Kubernetes' PV controller and external-provisioner emit
// them.
const (
	EventFailedBinding         = "FailedBinding"
	EventVolumeMismatch        = "VolumeMismatch"
	EventProvisioningFailed    = "ProvisioningFailed"
	EventProvisioningSucceeded = "ProvisioningSucceeded"
	EventProvisioning          = "Provisioning"
	EventExternalProvisioning  = "ExternalProvisioning"
	EventWaitForFirstConsumer  = "WaitForFirstConsumer"
	EventWaitForPodScheduled   = "WaitForPodScheduled"
	EventClaimLost             = "ClaimLost"
	EventClaimMisbound         = "ClaimMisbound"
	EventVolumeFailedRecycle   = "VolumeFailedRecycle"
	EventVolumeRecycled        = "VolumeRecycled"
	EventVolumeFailedDelete    = "VolumeFailedDelete"
	EventVolumeUnknownReclaim  = "VolumeUnknownReclaimPolicy"
	EventRecyclerPod           = "RecyclerPod"
)

// MsgUnknownReclaimPolicy is the message of EventVolumeUnknownReclaim, in
// kube-controller-manager's words.
const MsgUnknownReclaimPolicy = "Volume has unrecognized PersistentVolumeReclaimPolicy"

// KnownReclaimPolicy reports whether p is a reclaim policy Kubernetes
// runs: Retain, Recycle or Delete. The binder and the reclaimer both ask
// here.
func KnownReclaimPolicy(p corev1.PersistentVolumeReclaimPolicy) bool {
	switch p {
	case corev1.PersistentVolumeReclaimRetain, corev1.PersistentVolumeReclaimRecycle, corev1.PersistentVolumeReclaimDelete:
		return true
	}
	return false
}
