package binder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// Rebinding a Released volume to its recreated claim (docs/rebind.md).
//
// Kubernetes binds a Released volume to nothing: a claim deleted by
// mistake (a StatefulSet's, say) and created again under the same name
// gets a new, empty volume, and the old one waits for an administrator.
// An administrator may opt in, per StorageClass or per volume, to let the
// binder give such a volume back to the claim that now has the namespace
// and name its claimRef names. Off by default: without the annotation the
// binder does exactly what kube-controller-manager does.

// AnnRebindReleased is the rebind policy, on a StorageClass (for its
// volumes) or on a PersistentVolume (overriding its class's): RebindNever
// (the default) or RebindSameClaimName.
const AnnRebindReleased = "volplane.io/rebind-released"

// The values of AnnRebindReleased.
const (
	// RebindNever: a Released volume stays Released, as in Kubernetes.
	RebindNever = "Never"
	// RebindSameClaimName: a Released volume with reclaim policy Retain
	// is bound to a new claim with the namespace and name its claimRef
	// names, when it satisfies the claim.
	RebindSameClaimName = "SameClaimName"
)

// Events of a rebind (volplane's own reasons: Kubernetes has no rebind).
const (
	// EventVolumeRebound, on the claim and on the volume: the binder bound
	// a Released volume to the recreated claim.
	EventVolumeRebound = "VolumeRebound"
	// EventVolumeRebindRefused, on the claim: the rebind was decided but
	// could not be done now (a reclaim of the volume is journaled).
	EventVolumeRebindRefused = "VolumeRebindRefused"
)

// reclaimJournal is what a rebind needs of etcd: whether a reclaim of the
// volume is journaled (pkg/reclaimjournal).
type reclaimJournal interface {
	Get(ctx context.Context, kind, name string) (coord.Record, bool, error)
}

var _ reclaimJournal = (*coord.Keeper)(nil)

// rebindPolicy is the volume's rebind policy: its own annotation, else its
// StorageClass's, else RebindNever. An unknown value is RebindNever.
func rebindPolicy(v *corev1.PersistentVolume, class func(string) *storagev1.StorageClass) string {
	p, ok := v.Annotations[AnnRebindReleased]
	if !ok {
		if sc := class(match.VolumeClass(v)); sc != nil {
			p = sc.Annotations[AnnRebindReleased]
		}
	}
	if p == RebindSameClaimName {
		return p
	}
	return RebindNever
}

// rebindCandidates are the volumes the binder may rebind to claim: Released
// volumes (the one its spec.volumeName names, if it names one) whose
// claimRef names the claim's namespace and name, with a UID
// (another claim's, or this one's when a rebind was interrupted between
// the claimRef and the phase), and whose rebind policy is
// RebindSameClaimName. Sorted by name.
func rebindCandidates(claim *corev1.PersistentVolumeClaim, v claimView) []*corev1.PersistentVolume {
	var out []*corev1.PersistentVolume
	for _, vol := range v.named(claimKey(claim)) {
		ref := vol.Spec.ClaimRef
		if claim.Spec.VolumeName != "" && claim.Spec.VolumeName != vol.Name {
			continue // the claim asks for another volume by name
		}
		if ref == nil || ref.UID == "" || ref.Namespace != claim.Namespace || ref.Name != claim.Name ||
			vol.Status.Phase != corev1.VolumeReleased || rebindPolicy(vol, v.class) != RebindSameClaimName {
			continue
		}
		out = append(out, vol)
	}
	slices.SortFunc(out, func(a, b *corev1.PersistentVolume) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// rebindRefusal says why candidate vol may not be rebound to claim, ""
// when it may: the data must be intact (reclaim policy Retain, no deletion
// pending) and the volume must satisfy the claim by the binder's own rules
// (match.Fit.Check, as for a free volume: class, attributes class, volume
// mode, access modes, capacity, selector), and, when a node is selected
// for the claim, the volume's node affinity must admit that node.
func rebindRefusal(claim *corev1.PersistentVolumeClaim, vol *corev1.PersistentVolume, v claimView) (string, error) {
	if p := vol.Spec.PersistentVolumeReclaimPolicy; p != corev1.PersistentVolumeReclaimRetain {
		return fmt.Sprintf("its reclaim policy is %s: only a Retain volume is rebound (Delete and Recycle may destroy its data at any moment)", p), nil
	}
	if vol.DeletionTimestamp != nil {
		return "it is being deleted", nil
	}
	fit, err := match.NewFit(claim)
	if err != nil {
		return "", err
	}
	// Judged as if it were a free volume: every rule of a free volume
	// applies, none of a pre-bound volume's exemptions.
	free := *vol
	free.Spec.ClaimRef = nil
	free.Status.Phase = corev1.VolumeAvailable
	if rule := fit.Check(&free, false, false); rule != match.RuleNone {
		return fmt.Sprintf("it does not satisfy the claim: %s", fit.Why(&free, rule)), nil
	}
	if node, ok := claim.Annotations[kube.AnnSelectedNode]; ok && node != "" && vol.Spec.NodeAffinity != nil {
		labels := v.nodeLabels(node)
		if labels == nil {
			return fmt.Sprintf("its node affinity cannot be checked: the claim's selected node %q cannot be read", node), nil
		}
		if err := storagehelpers.CheckNodeAffinity(vol, labels); err != nil {
			return fmt.Sprintf("its node affinity excludes the claim's selected node %q: %v", node, err), nil
		}
	}
	return "", nil
}

// decideRebind decides whether claim gets a Released volume back. ok: the
// decision is REBIND. Otherwise note, when the policy allowed a rebind
// that was refused, says why, for explain; "" when no volume's policy
// allows one (the binder then behaves exactly as Kubernetes).
func decideRebind(claim *corev1.PersistentVolumeClaim, v claimView) (d decision, ok bool, note string, err error) {
	candidates := rebindCandidates(claim, v)
	switch len(candidates) {
	case 0:
		return decision{}, false, "", nil
	case 1:
	default:
		names := make([]string, len(candidates))
		for i, c := range candidates {
			names[i] = c.Name
		}
		return decision{}, false, fmt.Sprintf("volumes %s were all Released from earlier claims of this name and may be rebound: which one holds the data is not known, so none is (name one in spec.volumeName)",
			strings.Join(names, ", ")), nil
	}
	vol := candidates[0]
	why, err := rebindRefusal(claim, vol, v)
	if err != nil {
		return decision{}, false, "", err
	}
	if why != "" {
		return decision{}, false, fmt.Sprintf("volume %s was Released from an earlier claim of this name and its policy allows a rebind, but %s", vol.Name, why), nil
	}
	d = decision{what: binderv1.Decision_DECISION_REBIND, volume: vol,
		why: fmt.Sprintf("rebinds volume %s now: it was Released from an earlier claim of this name (UID %s), its reclaim policy is Retain, its rebind policy is %s, and it satisfies the claim",
			vol.Name, vol.Spec.ClaimRef.UID, RebindSameClaimName)}
	if vol.Spec.ClaimRef.UID == claim.UID {
		d.why = fmt.Sprintf("rebinds volume %s now: its claimRef already names this claim (a rebind was interrupted), and its policy still allows it", vol.Name)
	}
	return d, true, "", nil
}

// named lists the volumes whose claimRef names the claim key, for
// rebindCandidates.
func (s *store) named(key string) []*corev1.PersistentVolume {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*corev1.PersistentVolume, 0, len(s.byClaimRef[key]))
	for _, v := range s.byClaimRef[key] {
		out = append(out, v)
	}
	return out
}

// errRebindRefused says a rebind was decided but may not be done now; the
// claim is synced again with backoff.
var errRebindRefused = errors.New("rebind refused")

// rebind binds a Released volume to the recreated claim decideRebind chose:
// it checks, from the API server and etcd, what the cache cannot prove
// (the claim lives with this UID; no reclaim of the volume is journaled),
// takes the volume's reservation as any bind does, writes the volume's
// claimRef (with the cached resourceVersion: of two binders, or two
// incarnations of the claim, only one write succeeds), records
// VolumeRebound on both, sets the volume Bound, and finishes as any bind.
// A claimRef that already names the claim (an interrupted rebind) is
// finished without the first write.
func (c *controller) rebind(ctx context.Context, volume *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (err error) {
	live, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && live.UID != claim.UID):
		c.store.dropClaim(claimKey(claim), claim.UID)
		return fmt.Errorf("rebind volume %s to claim %s: %w", volume.Name, claimKey(claim), errGone)
	case err != nil:
		return fmt.Errorf("rebind volume %s: read claim %s: %w", volume.Name, claimKey(claim), err)
	case live.DeletionTimestamp != nil:
		return fmt.Errorf("rebind volume %s: claim %s is being deleted: %w", volume.Name, claimKey(claim), errRebindRefused)
	}
	if c.journal != nil {
		rec, ok, err := c.journal.Get(ctx, reclaimjournal.Kind, volume.Name)
		if err != nil {
			return fmt.Errorf("rebind volume %s: read its reclaim journal: %w: %w", volume.Name, errEtcd, err)
		}
		if ok {
			msg := fmt.Sprintf("Volume %q is not rebound: a reclaim of it is journaled (held by %q); its data may be being destroyed", volume.Name, rec.Holder)
			c.recorder.Event(claim, corev1.EventTypeWarning, EventVolumeRebindRefused, msg)
			return fmt.Errorf("rebind volume %s to claim %s: a reclaim is journaled: %w", volume.Name, claimKey(claim), errRebindRefused)
		}
	}
	old := volume.Spec.ClaimRef.UID
	if old != claim.UID {
		var release func(bound bool)
		if release, err = c.reservations.reserve(ctx, volume, claim); err != nil {
			return err
		}
		defer func() { release(err == nil) }() // err: rebind's result
		clone := volume.DeepCopy()
		clone.Spec.ClaimRef = &corev1.ObjectReference{
			Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion,
		}
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, kube.AnnBoundByController, "yes")
		if err := c.fence(ctx); err != nil {
			return err
		}
		updated, err := c.client.CoreV1().PersistentVolumes().Update(ctx, clone, metav1.UpdateOptions{})
		if err != nil {
			return c.volumeWriteFailed(volume, err, "rebind volume %s to claim %s", volume.Name, claimKey(claim))
		}
		volume = c.store.refreshVolume(updated)
		c.recorder.Event(volume, corev1.EventTypeNormal, EventVolumeRebound,
			fmt.Sprintf("Released volume bound again to claim %s (UID %s), created under the name of the claim it was released from (UID %s), as its rebind policy %s allows",
				claimKey(claim), claim.UID, old, RebindSameClaimName))
		c.recorder.Event(claim, corev1.EventTypeNormal, EventVolumeRebound,
			fmt.Sprintf("Bound to Released volume %q, which last served an earlier claim of this name (UID %s), with its data, as its rebind policy %s allows",
				volume.Name, old, RebindSameClaimName))
		c.log.Info("rebound a Released volume to its recreated claim", "volume", volume.Name, "claim", claimKey(claim), "uid", claim.UID, "releasedUID", old)
	} else {
		// Said again: the rebind that wrote the claimRef may have stopped
		// before its Events.
		c.recorder.Event(volume, corev1.EventTypeNormal, EventVolumeRebound,
			fmt.Sprintf("Released volume bound again to claim %s (UID %s): an interrupted rebind is finished", claimKey(claim), claim.UID))
		c.recorder.Event(claim, corev1.EventTypeNormal, EventVolumeRebound,
			fmt.Sprintf("Bound to Released volume %q, whose claimRef already named this claim: an interrupted rebind is finished", volume.Name))
	}
	// Bound before the claim is written, as any bind; updateVolumePhase
	// refuses Bound on a Released volume, which only a rebind may do.
	clone := volume.DeepCopy()
	clone.Status.Phase, clone.Status.Message = corev1.VolumeBound, ""
	if err := c.fence(ctx); err != nil {
		return err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return c.volumeWriteFailed(volume, err, "update phase of rebound volume %s to Bound", volume.Name)
	}
	return c.bind(ctx, c.store.refreshVolume(updated), claim)
}

// selectedNodeLabels reads a claim's selected node for the sync's rebind
// check (syncView.nodes), bounded as explain's read.
func (c *controller) selectedNodeLabels(node string) map[string]string {
	return c.nodeLabels(context.Background(), node)
}
