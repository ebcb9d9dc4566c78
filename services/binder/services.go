package binder

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// services are the volplane services the controller hands volumes to, and
// what it keeps of their answers: the provisioner makes new volumes, the
// reclaimer runs the reclaim policy of released ones
// (kube-controller-manager calls its volume plugins for both).
type services struct {
	reclaimer   reclaimer   // nil: Released volumes wait for another reclaimer
	provisioner provisioner // nil: every class is left to external provisioners
	provisions  *provisions // the provisioner's calls in flight and finished
	// served: the drivers the provisioner serves, for the
	// external-provisioner finalizer of their volumes
	// (reclaimfinalizer.go); nil: none.
	served servedNow
	// refused: the volumes whose hand-off the reclaimer refused
	// (handoff.go), looked at again when their claim changes.
	refused refusals
	// handed: the volumes the reclaimer took (handoff.go), not handed
	// over again on their next changes.
	handed handedOver
	// journal says whether a reclaim of a volume is journaled, read right
	// before a rebind (rebind.go); nil reads none.
	journal reclaimJournal
}

// reclaimer is what the binder needs of the reclaimer service.
type reclaimer interface {
	Reclaim(ctx context.Context, volume *corev1.PersistentVolume) error
}

// provisioner is what the binder needs of the provisioner service.
type provisioner interface {
	// Serves reports whether volplane provisions volumes of StorageClass
	// provisioner name; classes of other provisioners are left to them.
	Serves(ctx context.Context, name string) bool
	// Provision makes one attempt at the claim's volume.
	Provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (provisionResult, error)
}

// provisionResult is how a provisioning attempt ended.
type provisionResult struct {
	outcome provisionerv1.Outcome
	volume  *corev1.PersistentVolume // the new PV, when FINISHED
	message string
	// infeasible: the driver refused the request as it stands
	// (InvalidArgument), so the next call waits (provisions.slowDown);
	// classUID is the StorageClass the attempt used.
	infeasible bool
	classUID   types.UID
}
