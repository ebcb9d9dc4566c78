package reclaimer

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// node is the node this replica runs on, for node-local recycling.
type node struct {
	name   string
	labels map[string]string
}

// plan is what the reclaim of a volume in its current state comes to.
type plan struct {
	method reclaimerv1.Method
	// state is RETAINED or SKIPPED when nothing is to be done, PENDING when
	// the method acts, FAILED for METHOD_UNSUPPORTED.
	state  reclaimerv1.State
	driver string
	// reason is the Event reason of METHOD_UNSUPPORTED.
	reason  string
	message string
}

// acts reports whether the plan does anything to the volume (and so is
// journaled and owned by one replica).
func (p plan) acts() bool {
	return p.state != reclaimerv1.State_STATE_RETAINED && p.state != reclaimerv1.State_STATE_SKIPPED
}

// Messages, as kube-controller-manager words them where it has them.
const (
	msgRetained   = "policy Retain: the volume stays Released with its data until an administrator deletes or reuses it"
	msgNoRecycler = "No recycler plugin found for the volume!"
)

// decide is the whole policy decision for a volume, from the volume alone
// and what this replica can do. It reads nothing and writes nothing.
func decide(v *corev1.PersistentVolume, s served.Set, mode RecycleMode, n node) plan {
	switch v.Spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimRetain:
		return plan{method: reclaimerv1.Method_METHOD_NONE, state: reclaimerv1.State_STATE_RETAINED, message: msgRetained}
	case corev1.PersistentVolumeReclaimDelete:
		return decideDelete(v, s)
	case corev1.PersistentVolumeReclaimRecycle:
		return decideRecycle(v, mode, n)
	}
	return unsupported(kube.EventVolumeUnknownReclaim, kube.MsgUnknownReclaimPolicy)
}

func unsupported(reason, message string) plan {
	return plan{method: reclaimerv1.Method_METHOD_UNSUPPORTED, state: reclaimerv1.State_STATE_FAILED, reason: reason, message: message}
}

func skipped(format string, args ...any) plan {
	return plan{method: reclaimerv1.Method_METHOD_NONE, state: reclaimerv1.State_STATE_SKIPPED, message: fmt.Sprintf(format, args...)}
}

// undecided is a plan that cannot be made until the provisioner answers.
func undecided(s served.Set) plan {
	return plan{method: reclaimerv1.Method_METHOD_UNSPECIFIED, state: reclaimerv1.State_STATE_PENDING,
		message: fmt.Sprintf("waiting for the provisioner's list of drivers to tell whether volplane deletes this volume: %v", s.Err)}
}

// unidentified is the plan of a volume whose driver or provisioner name is
// not in the provisioner's list while the list has endpoints whose driver
// is not identified (not probed yet, or restarting): one of them may be
// the volume's, so it is not left to another deleter (SKIPPED, which is
// final and not journaled) but waits, journaled and retried, as while
// the list is not known at all.
func unidentified(s served.Set, name string) plan {
	return plan{method: reclaimerv1.Method_METHOD_UNSPECIFIED, state: reclaimerv1.State_STATE_PENDING,
		message: fmt.Sprintf("waiting for the provisioner to identify the CSI driver at %s: whether it serves %q cannot be told yet",
			strings.Join(s.Unidentified, ", "), name)}
}

// decideDelete: a volume an in-tree plugin provisioned fails as upstream
// (kube.InTreeDeleteFailure); a volume provisioned by a provisioner volplane
// does not serve belongs to that provisioner's deleter (as external-provisioner
// ignores volumes of other provisioners); a CSI volume of a served driver
// is deleted through the provisioner; anything else cannot be deleted, and
// fails as upstream (kube.StaticDeleteFailure).
func decideDelete(v *corev1.PersistentVolume, s served.Set) plan {
	if msg, inTree := kube.InTreeDeleteFailure(v); inTree {
		// Provisioned by a non-migrated in-tree plugin: kube-controller-
		// manager's own deleter would try, and no v1.36 plugin can.
		return unsupported(kube.EventVolumeFailedDelete, msg)
	}
	by := v.Annotations[kube.AnnDynamicallyProvisioned]
	csi := v.Spec.CSI
	if (by != "" || csi != nil) && !s.Known {
		return undecided(s)
	}
	switch {
	case by != "" && !s.Provisioners[by]:
		if len(s.Unidentified) > 0 {
			return unidentified(s, by)
		}
		return skipped("provisioned by %q, which volplane's provisioner does not serve: its own deleter deletes it", by)
	case csi != nil && s.Drivers[csi.Driver]:
		return plan{method: reclaimerv1.Method_METHOD_PROVISIONER, state: reclaimerv1.State_STATE_PENDING, driver: csi.Driver,
			message: "the backing volume is deleted through volplane's provisioner"}
	case csi != nil:
		if len(s.Unidentified) > 0 {
			return unidentified(s, csi.Driver)
		}
		return skipped("CSI driver %q is not served by volplane's provisioner: its own deleter deletes it", csi.Driver)
	case by != "":
		// Provisioned by a served provisioner, yet not a CSI volume: the
		// provisioner says what it can do with it.
		return plan{method: reclaimerv1.Method_METHOD_PROVISIONER, state: reclaimerv1.State_STATE_PENDING,
			message: "the backing volume is deleted through volplane's provisioner"}
	}
	// A static volume without a CSI source: kube-controller-manager's own
	// plugins would try it by its source, and fail.
	return unsupported(kube.EventVolumeFailedDelete, kube.StaticDeleteFailure(v))
}

// decideRecycle: a recycler pod mounts hostPath and NFS volumes, as
// Kubernetes' recycler plugins do; node-local mode scrubs hostPath volumes
// and the local volumes of its node, and leaves every other volume to a
// reclaimer that can reach it.
func decideRecycle(v *corev1.PersistentVolume, mode RecycleMode, n node) plan {
	src := v.Spec.PersistentVolumeSource
	if mode == RecyclePod {
		if src.HostPath != nil || src.NFS != nil {
			return plan{method: reclaimerv1.Method_METHOD_RECYCLER_POD, state: reclaimerv1.State_STATE_PENDING,
				message: "a recycler pod scrubs the volume"}
		}
		return unsupported(kube.EventVolumeFailedRecycle, msgNoRecycler)
	}
	switch {
	case src.HostPath != nil:
		return plan{method: reclaimerv1.Method_METHOD_NODE_LOCAL, state: reclaimerv1.State_STATE_PENDING,
			message: fmt.Sprintf("the directory is scrubbed on node %s", n.name)}
	case src.Local != nil:
		ok, err := nodeMatches(v.Spec.NodeAffinity, n)
		if err != nil {
			return unsupported(kube.EventVolumeFailedRecycle, fmt.Sprintf("Recycle failed: node affinity: %v", err))
		}
		if !ok {
			return skipped("a local volume of another node: the reclaimer running there (--node-name) recycles it, not the one on node %s", n.name)
		}
		return plan{method: reclaimerv1.Method_METHOD_NODE_LOCAL, state: reclaimerv1.State_STATE_PENDING,
			message: fmt.Sprintf("the directory is scrubbed on node %s", n.name)}
	}
	return skipped("node-local recycling scrubs only hostPath and local volumes: a reclaimer in --recycle-mode=pod recycles this one")
}

// nodeMatches reports whether a volume's required node affinity admits the
// node, as the scheduler evaluates it (component-helpers' nodeaffinity:
// terms ORed, the requirements of one term ANDed, an empty term matching
// nothing, metadata.name as the one field). No affinity admits every node.
func nodeMatches(a *corev1.VolumeNodeAffinity, n node) (bool, error) {
	if a == nil || a.Required == nil {
		return true, nil
	}
	return nodeaffinity.NewLazyErrorNodeSelector(a.Required).Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels}})
}
