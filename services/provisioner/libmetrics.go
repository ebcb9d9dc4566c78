package provisioner

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/metrics"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// countProvision counts an attempt at claim's volume that began at start
// and ended with res and err in sig-storage-lib-external-provisioner's
// controller_persistentvolumeclaim_provision_* (the library's
// updateProvisionStats, which external-provisioner v6.3.0 serves): made
// (FINISHED with a PersistentVolume) or failed (any other end). A claim
// left to its volume populator is not counted: upstream's ShouldProvision
// never lets such a claim reach an attempt.
func countProvision(claim *corev1.PersistentVolumeClaim, res result, err error, start time.Time) {
	if err == nil && res.outcome == provisionerv1.Outcome_OUTCOME_FINISHED && res.volume == nil {
		return
	}
	class, source := provisionLabels(claim)
	ok := err == nil && res.outcome == provisionerv1.Outcome_OUTCOME_FINISHED
	metrics.ProvisionAttempt(class, source, ok, time.Since(start))
}

// countProvisionFailed counts an attempt that failed before it began
// (the library counts shouldProvision's errors, e.g. a StorageClass that
// cannot be read, and a claim whose PersistentVolume exists already).
func countProvisionFailed(claim *corev1.PersistentVolumeClaim) {
	class, source := provisionLabels(claim)
	metrics.ProvisionAttempt(class, source, false, 0)
}

// provisionLabels are the library's class and source labels of claim:
// spec.storageClassName (not the beta annotation; "" when unset) and
// spec.dataSource.kind ("" without a dataSource; dataSourceRef is not
// looked at).
func provisionLabels(claim *corev1.PersistentVolumeClaim) (class, source string) {
	if claim.Spec.StorageClassName != nil {
		class = *claim.Spec.StorageClassName
	}
	if claim.Spec.DataSource != nil {
		source = claim.Spec.DataSource.Kind
	}
	return class, source
}
