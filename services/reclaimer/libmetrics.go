package reclaimer

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/metrics"
)

// deleteAttempt is one attempt of a Delete reclaim through the
// provisioner, counted as sig-storage-lib-external-provisioner counts
// external-provisioner's deletions (updateDeleteStats, after
// deleteVolumeOperation: DeleteVolume, then the PersistentVolume and its
// finalizer) in controller_persistentvolume_delete_*, labelled with the
// volume's StorageClass. The reclaimer counts it, not the provisioner: it
// carries out the whole deletion, the provisioner only its CSI call.
type deleteAttempt struct {
	class   string
	start   time.Time
	skipped bool
}

// startDelete begins counting an attempt at deleting v.
func startDelete(v *corev1.PersistentVolume, now time.Time) *deleteAttempt {
	return &deleteAttempt{class: v.Spec.StorageClassName, start: now}
}

// skip leaves the attempt uncounted: nothing was attempted (the guard
// refused, or the volume no longer needs deleting), as the library
// counts nothing when shouldDelete says no or the volume is gone.
func (a *deleteAttempt) skip() { a.skipped = true }

// end counts the attempt, which ended with err at now.
func (a *deleteAttempt) end(err error, now time.Time) {
	if !a.skipped {
		metrics.DeleteAttempt(a.class, err == nil, now.Sub(a.start))
	}
}
