package binder

import (
	"context"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/match"
)

// bind binds volume and claim in Kubernetes' order, each step skipped when
// already done: the volume's claimRef, the volume's phase, the claim's
// volumeName and annotations, the claim's phase. Every write carries the
// cached resourceVersion, so a stale cache ends in a conflict, never in a
// volume bound twice. A free volume is reserved first.
func (c *controller) bind(ctx context.Context, volume *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (err error) {
	if released(volume) {
		return c.refuseRebind(ctx, volume, claim)
	}
	uid := string(claim.UID)
	if !tracked(claim) {
		uid = "" // nothing to record
	}
	if volume.Spec.ClaimRef == nil || volume.Spec.ClaimRef.UID != claim.UID {
		var release func(bound bool)
		_, step := c.timeline.Start(ctx, uid, "reserve")
		release, err = c.reservations.reserve(ctx, volume, claim)
		step.EndErr(err, volume.Name)
		if err != nil {
			return err
		}
		defer func() { release(err == nil) }() // err: bind's result
	}
	_, step := c.timeline.Start(ctx, uid, "bind volume")
	volume, err = c.bindVolumeToClaim(ctx, volume, claim)
	if err != nil {
		step.EndErr(err, "")
		return err
	}
	faultpoint.Hit(faultpoint.BinderAfterClaimRef)
	volume, err = c.updateVolumePhase(ctx, volume, corev1.VolumeBound, "")
	step.EndErr(err, "claimRef and phase Bound written")
	if err != nil {
		return err
	}
	_, step = c.timeline.Start(ctx, uid, "bind claim")
	if claim, err = c.bindClaimToVolume(ctx, claim, volume); err != nil {
		step.EndErr(err, "")
		return err
	}
	wasBound := claim.Status.Phase == corev1.ClaimBound
	_, err = c.updateClaimStatus(ctx, claim, corev1.ClaimBound, volume)
	step.EndErr(err, "volumeName and phase Bound written")
	if err != nil {
		return err
	}
	if !wasBound {
		c.bindsTotal.Add(1)
		observeBound(claim, time.Now())
	}
	return nil
}

func (c *controller) bindVolumeToClaim(ctx context.Context, volume *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	ref := volume.Spec.ClaimRef
	setRef := ref == nil || ref.Name != claim.Name || ref.Namespace != claim.Namespace || ref.UID != claim.UID
	setAnn := !match.BoundToClaim(volume, claim) && !metav1.HasAnnotation(volume.ObjectMeta, kube.AnnBoundByController)
	if !setRef && !setAnn {
		return volume, nil
	}
	clone := volume.DeepCopy()
	if setRef {
		clone.Spec.ClaimRef = &corev1.ObjectReference{
			Kind:            "PersistentVolumeClaim",
			APIVersion:      "v1",
			Namespace:       claim.Namespace,
			Name:            claim.Name,
			UID:             claim.UID,
			ResourceVersion: claim.ResourceVersion,
		}
	}
	if setAnn {
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, kube.AnnBoundByController, "yes")
	}
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.volumeWriteFailed(volume, err, "bind volume %s to claim %s", volume.Name, claimKey(claim))
	}
	return c.store.refreshVolume(updated), nil
}

func (c *controller) bindClaimToVolume(ctx context.Context, claim *corev1.PersistentVolumeClaim, volume *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	setName := claim.Spec.VolumeName != volume.Name
	setAnn := setName && !metav1.HasAnnotation(claim.ObjectMeta, kube.AnnBoundByController)
	setDone := !metav1.HasAnnotation(claim.ObjectMeta, kube.AnnBindCompleted)
	if !setName && !setAnn && !setDone {
		return claim, nil
	}
	clone := claim.DeepCopy()
	if setName {
		clone.Spec.VolumeName = volume.Name
	}
	if setAnn {
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, kube.AnnBoundByController, "yes")
	}
	if setDone {
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, kube.AnnBindCompleted, "yes")
	}
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	updated, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.claimWriteFailed(claim, err, "bind claim %s to volume %s", claimKey(claim), volume.Name)
	}
	return c.store.refreshClaim(updated), nil
}

// updateClaimStatus sets the claim's phase and, from the volume, its access
// modes and (only when it becomes Bound) capacity; nil volume clears them.
func (c *controller) updateClaimStatus(ctx context.Context, claim *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase, volume *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	// The claim is copied only when something changes: a resync of a
	// bound claim, the common case, allocates nothing here.
	var clone *corev1.PersistentVolumeClaim
	mut := func() *corev1.PersistentVolumeClaim {
		if clone == nil {
			clone = claim.DeepCopy()
		}
		return clone
	}
	if claim.Status.Phase != phase {
		mut().Status.Phase = phase
	}
	if volume == nil {
		if claim.Status.AccessModes != nil {
			mut().Status.AccessModes = nil
		}
		if claim.Status.Capacity != nil {
			mut().Status.Capacity = nil
		}
	} else {
		if !reflect.DeepEqual(claim.Status.AccessModes, volume.Spec.AccessModes) {
			mut().Status.AccessModes = volume.Spec.AccessModes
		}
		if claim.Status.Phase != phase {
			volCap, ok := volume.Spec.Capacity[corev1.ResourceStorage]
			if !ok {
				return nil, fmt.Errorf("PersistentVolume %q is without a storage capacity", volume.Name)
			}
			claimCap, hasCap := claim.Status.Capacity[corev1.ResourceStorage]
			if pre, ok := volume.Annotations[kube.AnnPreResizeCapacity]; ok {
				q, err := resource.ParseQuantity(pre)
				if err != nil {
					return nil, fmt.Errorf("volume %s: annotation %s: %w", volume.Name, kube.AnnPreResizeCapacity, err)
				}
				mut().Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: q}
			} else if !hasCap || volCap.Cmp(claimCap) != 0 {
				mut().Status.Capacity = volume.Spec.Capacity
			}
		}
	}
	if clone == nil {
		return claim, nil
	}
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	updated, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).UpdateStatus(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.claimWriteFailed(claim, err, "update status of claim %s to %s", claimKey(claim), phase)
	}
	return c.store.refreshClaim(updated), nil
}

// updateClaimStatusWithEvent is updateClaimStatus plus a warning event, both
// only when the phase changes.
func (c *controller) updateClaimStatusWithEvent(ctx context.Context, claim *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase, volume *corev1.PersistentVolume, reason, message string) (*corev1.PersistentVolumeClaim, error) {
	if claim.Status.Phase == phase {
		return claim, nil
	}
	updated, err := c.updateClaimStatus(ctx, claim, phase, volume)
	if err != nil {
		return nil, err
	}
	c.recorder.Event(updated, corev1.EventTypeWarning, reason, message)
	return updated, nil
}

// updateVolumePhase sets the volume's phase and message when they differ.
func (c *controller) updateVolumePhase(ctx context.Context, volume *corev1.PersistentVolume, phase corev1.PersistentVolumePhase, message string) (*corev1.PersistentVolume, error) {
	if volume.Status.Phase == phase {
		return volume, nil
	}
	if phase == corev1.VolumeBound && released(volume) {
		return nil, fmt.Errorf("volume %s is %s: %w", volume.Name, volume.Status.Phase, errNoRebind)
	}
	clone := volume.DeepCopy()
	clone.Status.Phase = phase
	clone.Status.Message = message
	if err := c.fence(ctx); err != nil {
		return nil, err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return nil, c.volumeWriteFailed(volume, err, "update phase of volume %s to %s", volume.Name, phase)
	}
	return c.store.refreshVolume(updated), nil
}

// updateVolumePhaseWithEvent is updateVolumePhase plus a warning event, both
// only when the phase changes.
func (c *controller) updateVolumePhaseWithEvent(ctx context.Context, volume *corev1.PersistentVolume, phase corev1.PersistentVolumePhase, reason, message string) (*corev1.PersistentVolume, error) {
	if volume.Status.Phase == phase {
		return volume, nil
	}
	updated, err := c.updateVolumePhase(ctx, volume, phase, message)
	if err != nil {
		return nil, err
	}
	c.recorder.Event(updated, corev1.EventTypeWarning, reason, message)
	return updated, nil
}

// unbindVolume gives a volume back: a volume the controller bound loses its
// claimRef and bound-by-controller; one a user pre-bound keeps its claimRef
// without the UID. Then it is Available.
func (c *controller) unbindVolume(ctx context.Context, volume *corev1.PersistentVolume) error {
	clone := volume.DeepCopy()
	if metav1.HasAnnotation(volume.ObjectMeta, kube.AnnBoundByController) {
		clone.Spec.ClaimRef = nil
		delete(clone.Annotations, kube.AnnBoundByController)
		if len(clone.Annotations) == 0 {
			clone.Annotations = nil
		}
	} else {
		clone.Spec.ClaimRef.UID = ""
	}
	if err := c.fence(ctx); err != nil {
		return err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return c.volumeWriteFailed(volume, err, "unbind volume %s", volume.Name)
	}
	_, err = c.updateVolumePhase(ctx, c.store.refreshVolume(updated), corev1.VolumeAvailable, "")
	return err
}

// released reports whether a volume's claim was confirmed gone: Released,
// or Failed while its reclaim policy runs.
func released(v *corev1.PersistentVolume) bool {
	return v.Status.Phase == corev1.VolumeReleased || v.Status.Phase == corev1.VolumeFailed
}

// refuseRebind leaves a Released or Failed volume as it is when a claim
// with the UID of its claimRef shows up bound (or binding) to it.
//
// kube-controller-manager would write Bound again. The binder does not:
// a volume is Released only after the API itself answered that the claim
// is gone (or has another UID), and UIDs are never reused, so a claim seen
// alive with that UID is a stale cache (a zombie), and writing Bound on it
// made a volume flip between Released and Bound while two replicas
// disagreed. The claim is read from the API: gone, it leaves the cache;
// alive (someone wrote the volume's phase by hand), nothing is written and
// an administrator decides, since the volume may already be reclaimed.
func (c *controller) refuseRebind(ctx context.Context, volume *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) error {
	live, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && live.UID != claim.UID):
		c.store.dropClaim(claimKey(claim), claim.UID)
		return fmt.Errorf("claim %s of %s volume %s: %w", claimKey(claim), volume.Status.Phase, volume.Name, errGone)
	case err != nil:
		return fmt.Errorf("get claim %s of %s volume %s: %w", claimKey(claim), volume.Status.Phase, volume.Name, err)
	}
	c.log.Warn("volume is Released or Failed while its claim exists; not bound again, an administrator must decide",
		"volume", volume.Name, "phase", volume.Status.Phase, logging.Claim(claim))
	return nil
}
