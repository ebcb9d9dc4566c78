package binder

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// Decide, then act: decide is the one place where the binder chooses what
// to do with a claim, the branches of kube-controller-manager's syncClaim
// (syncUnboundClaim, syncBoundClaim). The claim's sync acts on its answer
// (act, sync.go); ExplainClaim and MatchClaim report the same answer
// (explain.go), so they cannot disagree with the sync.

// claimView is the binder's cache as decide reads it.
type claimView interface {
	volume(name string) *corev1.PersistentVolume
	class(name string) *storagev1.StorageClass
	defaultClass() *storagev1.StorageClass
	// unscheduled lists, sorted, the pods that use the claim and are
	// neither scheduled nor terminated.
	unscheduled(claimKey string) []string
	// choose is the volume the binder binds an unbound claim to now: the
	// first candidate of the binder's walk (store.bestLocked) that breaks
	// no rule, reservations of this replica and of others considered; nil
	// when none. delay: the claim's class binds WaitForFirstConsumer.
	choose(claim *corev1.PersistentVolumeClaim, delay bool) (*corev1.PersistentVolume, error)
	// named lists the volumes whose claimRef names the claim key
	// ("namespace/name"), whatever their UID and phase (rebind.go).
	named(claimKey string) []*corev1.PersistentVolume
	// nodeLabels are the labels of a node, nil when it cannot be read;
	// asked only to check a rebind against a claim's selected node.
	nodeLabels(node string) map[string]string
}

// syncView is the cache as a claim's sync reads it: choose holds the
// volume it chooses for the claim (findAndReserve), so that no other
// worker of this replica chooses it before the bind is written; act gives
// it back.
type syncView struct {
	*store
	pods *podIndex
	// nodes reads a node's labels (nil: none can be read).
	nodes func(node string) map[string]string
	// holds is where choose holds the volume it chooses.
	holds *reservations
}

func (v syncView) unscheduled(key string) []string { return v.pods.unscheduled(key) }

func (v syncView) nodeLabels(node string) map[string]string {
	if v.nodes == nil {
		return nil
	}
	return v.nodes(node)
}

func (v syncView) choose(claim *corev1.PersistentVolumeClaim, delay bool) (*corev1.PersistentVolume, error) {
	volume, err := v.holds.findAndReserve(claim, delay)
	if err != nil {
		return nil, fmt.Errorf("error finding PV for claim %q: %w", claimKey(claim), err)
	}
	return volume, nil
}

// decision is what the binder does with a claim now.
type decision struct {
	// what is the branch, as the API names it.
	what binderv1.Decision
	// volume: for BIND and BOUND the volume to bind (bind writes only
	// what is missing); for REBIND the Released volume to bind; for
	// VOLUME_MISMATCH, VOLUME_TAKEN and MISBOUND the volume the claim
	// names.
	volume *corev1.PersistentVolume
	// chosen: volume is the binder's choice (claimView.choose), not one
	// the claim or the volume's claimRef names; the sync's view holds it
	// for the claim until the bind ends.
	chosen bool
	// class: for ASSIGN_DEFAULT_CLASS the default class; for PROVISION the
	// claim's class, nil when it does not exist.
	class *storagev1.StorageClass
	// through: for PROVISION with a class, the provisioner named in the
	// claim's annotations, or why none provisions (kube.DecideProvisioning).
	through kube.ProvisionDecision
	// event is the Event the sync records on the claim (reason "" for
	// none): before the claim stays Pending, or, for LOST and MISBOUND,
	// when its phase becomes Lost.
	event claimEvent
	// err: the sync fails with it, after the event.
	err error
	// why says the decision in a sentence, for explain (empty for BOUND:
	// the binding's own message says it, bindingOf).
	why string
}

// claimEvent is an Event on a claim: its type, reason and message.
type claimEvent struct{ kind, reason, message string }

// decide is the binder's decision for claim, from the claim and the view
// alone: it writes nothing and asks nothing but the view. It returns an
// error when the claim's class has no volumeBindingMode, or when the view
// cannot choose a volume (a claim selector that does not parse).
func decide(claim *corev1.PersistentVolumeClaim, v claimView) (decision, error) {
	if _, done := claim.Annotations[kube.AnnBindCompleted]; done {
		return decideBound(claim, v), nil
	}
	// Opt-in (rebind.go): a Released volume of an earlier claim of this
	// name comes first; without a volume whose policy allows it, nothing
	// changes.
	rebind, ok, note, err := decideRebind(claim, v)
	if err != nil {
		return decision{}, err
	}
	if ok {
		return rebind, nil
	}
	if claim.Spec.VolumeName != "" {
		return noted(decidePrebound(claim, v), note), nil
	}
	delay, err := delayBinding(claim, v)
	if err != nil {
		return decision{}, err
	}
	d, err := decideUnbound(claim, v, delay)
	return noted(d, note), err
}

// noted adds to a decision's sentence why a rebind the policy allowed was
// not made (decideRebind); note "" changes nothing.
func noted(d decision, note string) decision {
	if note != "" {
		d.why += "; " + note
	}
	return d
}

// decideUnbound decides for a claim that names no volume.
func decideUnbound(claim *corev1.PersistentVolumeClaim, v claimView, delay bool) (decision, error) {
	volume, err := v.choose(claim, delay)
	if err != nil {
		return decision{}, err
	}
	if volume != nil {
		d := decision{what: binderv1.Decision_DECISION_BIND, volume: volume, chosen: true,
			why: fmt.Sprintf("binds volume %s now: the first candidate in the binder's order that breaks no rule", volume.Name)}
		if match.BoundToClaim(volume, claim) {
			d.why = fmt.Sprintf("binds volume %s now: its claimRef names the claim (pre-bound)", volume.Name)
		}
		return d, nil
	}
	// No volume fits. A claim without any class gets the default class
	// (retroactive default StorageClass assignment) and is decided again.
	if !match.ClaimHasClass(claim) {
		if class := v.defaultClass(); class != nil {
			return decision{what: binderv1.Decision_DECISION_ASSIGN_DEFAULT_CLASS, class: class,
				why: fmt.Sprintf("no volume fits and the claim names no class: the binder gives it the default StorageClass %q, then decides again", class.Name)}, nil
		}
	}
	name := match.ClaimClass(claim)
	switch {
	case delay && !metav1.HasAnnotation(claim.ObjectMeta, kube.AnnSelectedNode):
		// As upstream (IsDelayBindingProvisioning): the annotation's
		// presence, whatever its value, means the scheduler chose.
		reason, message := waitEvent(v.unscheduled(claimKey(claim)))
		return decision{what: binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER,
			event: claimEvent{corev1.EventTypeNormal, reason, message},
			why:   fmt.Sprintf("StorageClass %q binds WaitForFirstConsumer: waiting for a pod using the claim to be scheduled (no volume is pre-bound to it)", name)}, nil
	case name != "":
		// Provisioning updates the claim; a later sync finishes the bind.
		d := decision{what: binderv1.Decision_DECISION_PROVISION, class: v.class(name)}
		if d.class == nil {
			// As upstream: the claim stays as it is; the next resync
			// tries again (the class may be created meanwhile).
			d.event = claimEvent{corev1.EventTypeWarning, kube.EventProvisioningFailed, fmt.Sprintf("storageclass.storage.k8s.io %q not found", name)}
			d.why = fmt.Sprintf("no volume fits, and StorageClass %q does not exist, so nothing provisions one (event ProvisioningFailed): the claim binds when a fitting volume appears", name)
			return d, nil
		}
		// In-tree names as kube-controller-manager treats them: a migrated
		// one under its CSI driver's name, one no plugin provisions fails.
		d.through = kube.DecideProvisioning(d.class, claim)
		d.why = fmt.Sprintf("no volume fits: a volume is to be provisioned with StorageClass %q", name)
		return d, nil
	}
	const message = "no persistent volumes available for this claim and no storage class is set"
	return decision{what: binderv1.Decision_DECISION_NO_MATCH,
		event: claimEvent{corev1.EventTypeNormal, kube.EventFailedBinding, message}, why: message}, nil
}

// decidePrebound decides for a claim whose user asked for a volume by
// name (spec.volumeName).
func decidePrebound(claim *corev1.PersistentVolumeClaim, v claimView) decision {
	name := claim.Spec.VolumeName
	volume := v.volume(name)
	switch {
	case volume == nil:
		// The volume does not exist (yet): stay Pending; its arrival
		// queues this claim again.
		return decision{what: binderv1.Decision_DECISION_VOLUME_MISSING,
			why: fmt.Sprintf("the claim asks for volume %s (spec.volumeName), which does not exist: it binds when the volume appears", name)}
	case volume.Spec.ClaimRef == nil:
		if err := match.Satisfies(volume, claim); err != nil {
			message := fmt.Sprintf("Cannot bind to requested volume %q: %s", name, err)
			return decision{what: binderv1.Decision_DECISION_VOLUME_MISMATCH, volume: volume,
				event: claimEvent{corev1.EventTypeWarning, kube.EventVolumeMismatch, message}, why: message}
		}
		return decision{what: binderv1.Decision_DECISION_BIND, volume: volume,
			why: fmt.Sprintf("binds volume %s now: the claim names it (spec.volumeName) and it is free and satisfies the claim", name)}
	case match.BoundToClaim(volume, claim):
		// The volume points here already: finish the bind.
		return decision{what: binderv1.Decision_DECISION_BIND, volume: volume,
			why: fmt.Sprintf("binds volume %s now: the claim names it and its claimRef names the claim (the bind finishes)", name)}
	}
	d := decision{what: binderv1.Decision_DECISION_VOLUME_TAKEN, volume: volume,
		event: claimEvent{corev1.EventTypeWarning, kube.EventFailedBinding, fmt.Sprintf("volume %q already bound to a different claim.", name)},
		why:   fmt.Sprintf("volume %q already bound to a different claim (%s).", name, refKey(volume.Spec.ClaimRef))}
	if metav1.HasAnnotation(claim.ObjectMeta, kube.AnnBoundByController) {
		// Only possible when someone removed bind-completed from a claim
		// the controller had bound.
		d.err = fmt.Errorf("invalid binding of claim %q to volume %q: volume already claimed by %q",
			claimKey(claim), name, refKey(volume.Spec.ClaimRef))
	}
	return d
}

// decideBound decides for a claim that carries bind-completed.
func decideBound(claim *corev1.PersistentVolumeClaim, v claimView) decision {
	name := claim.Spec.VolumeName
	if name == "" {
		const message = "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!"
		return decision{what: binderv1.Decision_DECISION_LOST,
			event: claimEvent{corev1.EventTypeWarning, kube.EventClaimLost, message}, why: message}
	}
	volume := v.volume(name)
	switch {
	case volume == nil:
		return decision{what: binderv1.Decision_DECISION_LOST,
			event: claimEvent{corev1.EventTypeWarning, kube.EventClaimLost, "Bound claim has lost its PersistentVolume. Data on the volume is lost!"},
			why:   fmt.Sprintf("Bound claim has lost its PersistentVolume %s. Data on the volume is lost!", name)}
	case volume.Spec.ClaimRef == nil:
		// Half-done bind, or the volume came unbound: bind again.
		return decision{what: binderv1.Decision_DECISION_BIND, volume: volume,
			why: fmt.Sprintf("the claim was bound to %s, whose claimRef is gone: the binder binds them again", name)}
	case volume.Spec.ClaimRef.UID == claim.UID:
		// All is well; bind only writes what is missing.
		return decision{what: binderv1.Decision_DECISION_BOUND, volume: volume}
	}
	return decision{what: binderv1.Decision_DECISION_MISBOUND, volume: volume,
		event: claimEvent{corev1.EventTypeWarning, kube.EventClaimMisbound, "Two claims are bound to the same volume, this one is bound incorrectly"},
		why: fmt.Sprintf("volume %s is bound to another claim (%s, UID %s): two claims are bound to the same volume, this one incorrectly",
			name, refKey(volume.Spec.ClaimRef), volume.Spec.ClaimRef.UID)}
}

// delayBinding reports whether the claim's class binds only once a pod is
// scheduled (WaitForFirstConsumer).
func delayBinding(claim *corev1.PersistentVolumeClaim, v claimView) (bool, error) {
	name := match.ClaimClass(claim)
	if name == "" {
		return false, nil
	}
	class := v.class(name)
	if class == nil {
		return false, nil
	}
	if class.VolumeBindingMode == nil {
		return false, fmt.Errorf("VolumeBindingMode not set for StorageClass %q", name)
	}
	return *class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer, nil
}
