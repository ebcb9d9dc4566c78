package binder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/match"
	"github.com/volplane/volplane/pkg/metrics"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// syncClaim brings one claim closer to Bound: decide, then act. It is
// idempotent and reads only the cache, except where noted.
func (c *controller) syncClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	ctx = forObject(ctx, "pvc/"+claimKey(claim))
	claim, err := c.updateClaimMigrationAnnotations(ctx, claim)
	if err != nil {
		return err
	}
	d, err := decide(claim, c.view)
	if err != nil {
		return err
	}
	c.noteWait(ctx, claim, d.what)
	if c.timeline == nil || !tracked(claim) {
		return c.act(ctx, claim, d)
	}
	ctx, step := c.timeline.Start(ctx, string(claim.UID), "sync")
	err = c.act(ctx, claim, d)
	if err != nil {
		step.End(decisionName(d.what), err.Error())
	} else {
		step.End(decisionName(d.what), decisionDetail(d))
	}
	return err
}

// act carries out decide's decision for claim.
func (c *controller) act(ctx context.Context, claim *corev1.PersistentVolumeClaim, d decision) error {
	switch d.what {
	case binderv1.Decision_DECISION_BIND, binderv1.Decision_DECISION_BOUND:
		if d.chosen {
			defer c.reservations.unreserve(d.volume, claim)
		}
		return c.bind(ctx, d.volume, claim)
	case binderv1.Decision_DECISION_REBIND:
		return c.rebind(ctx, d.volume, claim)
	case binderv1.Decision_DECISION_ASSIGN_DEFAULT_CLASS:
		// The claim's next sync decides again, with the class.
		return c.assignDefaultClass(ctx, claim, d.class)
	case binderv1.Decision_DECISION_LOST, binderv1.Decision_DECISION_MISBOUND:
		_, err := c.updateClaimStatusWithEvent(ctx, claim, corev1.ClaimLost, nil, d.event.reason, d.event.message)
		return err
	}
	if d.event.reason != "" {
		c.recorder.Event(claim, d.event.kind, d.event.reason, d.event.message)
	}
	switch {
	case d.err != nil:
		return d.err
	case d.what != binderv1.Decision_DECISION_PROVISION:
		_, err := c.updateClaimStatus(ctx, claim, corev1.ClaimPending, nil)
		return err
	case d.class == nil:
		return nil // no class, nothing provisions: the resync decides again
	}
	return c.provisionClaim(ctx, claim, d.class, d.through)
}

// syncVolume brings one volume's phase in line with its claim.
func (c *controller) syncVolume(ctx context.Context, volume *corev1.PersistentVolume) error {
	ctx = forObject(ctx, volumeOwnerKey(volume))
	volume, err := c.updateVolumeMigrationAnnotationsAndFinalizers(ctx, volume)
	if err != nil {
		return err
	}
	if volume, err = c.updateReclaimFinalizer(ctx, volume); err != nil {
		return err
	}
	ref := volume.Spec.ClaimRef
	if ref == nil || ref.UID == "" {
		// Unused, or pre-bound by a user to a claim that will bind it.
		_, err := c.updateVolumePhase(ctx, volume, corev1.VolumeAvailable, "")
		return err
	}
	claim, err := c.claimOfVolume(ctx, volume)
	if err != nil {
		return err
	}
	switch {
	case claim == nil:
		// The claim is gone: Released, then the reclaim policy. A Failed
		// volume keeps its phase so the user sees what went wrong while
		// the reclaim is retried.
		if volume.Status.Phase != corev1.VolumeReleased && volume.Status.Phase != corev1.VolumeFailed {
			if volume, err = c.updateVolumePhase(ctx, volume, corev1.VolumeReleased, ""); err != nil {
				return err
			}
		}
		return c.reclaimVolume(ctx, volume)
	case claim.Spec.VolumeName == "":
		if match.VolumeModeMismatch(claim, volume) {
			c.recorder.Event(volume, corev1.EventTypeWarning, kube.EventVolumeMismatch,
				fmt.Sprintf("Cannot bind PersistentVolume to requested PersistentVolumeClaim %q due to incompatible volumeMode.", claim.Name))
			c.recorder.Event(claim, corev1.EventTypeWarning, kube.EventVolumeMismatch,
				fmt.Sprintf("Cannot bind PersistentVolume %q to requested PersistentVolumeClaim due to incompatible volumeMode.", volume.Name))
			return nil
		}
		// The claim's sync finishes the bind; ask for it now.
		c.claimQueue.add(claimKey(claim))
		return nil
	case claim.Spec.VolumeName == volume.Name:
		if released(volume) {
			// claimOfVolume read the claim from the API: it lives.
			return c.refuseRebind(ctx, volume, claim)
		}
		_, err := c.updateVolumePhase(ctx, volume, corev1.VolumeBound, "")
		return err
	case metav1.HasAnnotation(volume.ObjectMeta, kube.AnnDynamicallyProvisioned) &&
		volume.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete:
		// Provisioned for this claim, which got another volume: not needed.
		if volume.Status.Phase != corev1.VolumeReleased && volume.Status.Phase != corev1.VolumeFailed {
			if volume, err = c.updateVolumePhase(ctx, volume, corev1.VolumeReleased, ""); err != nil {
				return err
			}
		}
		return c.reclaimVolume(ctx, volume)
	default:
		// The claim is bound to another volume: give this one back.
		return c.unbindVolume(ctx, volume)
	}
}

// claimOfVolume finds the claim a volume's claimRef points to, or nil when
// it is gone (or replaced by a claim with another UID). Before declaring a
// claim gone it asks the API server, not only the cache: a volume must
// never be released because the cache is behind.
func (c *controller) claimOfVolume(ctx context.Context, volume *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	ref := volume.Spec.ClaimRef
	claim := c.store.claim(refKey(ref))
	if claim != nil && claim.UID == ref.UID && !released(volume) {
		return claim, nil
	}
	if claim == nil && released(volume) {
		// Already released: the claim was confirmed gone before.
		return nil, nil
	}
	// Not in the cache, or in it although the volume was released (the
	// API said the claim was gone): ask the API.
	live, err := c.client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if claim != nil && claim.UID == ref.UID {
			c.store.dropClaim(refKey(ref), ref.UID)
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get claim %s of volume %s: %w", refKey(ref), volume.Name, err)
	case live.UID != ref.UID:
		if claim != nil && claim.UID == ref.UID {
			c.store.dropClaim(refKey(ref), ref.UID)
		}
		return nil, nil
	}
	return c.store.refreshClaim(live), nil
}

// assignDefaultClass gives a claim that names no class at all the default
// class, as Kubernetes does for claims created before a default existed.
func (c *controller) assignDefaultClass(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) error {
	clone := claim.DeepCopy()
	clone.Spec.StorageClassName = &class.Name
	if err := c.fence(ctx); err != nil {
		return err
	}
	updated, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil {
		return c.claimWriteFailed(claim, err, "can't update PersistentVolumeClaim[%q]", claimKey(claim))
	}
	c.store.refreshClaim(updated)
	return nil
}

// provisionClaim asks for a new volume: the class's provisioner is written
// to the claim's storage-provisioner annotations, which external
// provisioners watch for. When volplane serves that provisioner, the
// provisioner service is asked for the volume now, and a volume it made is
// bound at once. through is decide's kube.DecideProvisioning.
func (c *controller) provisionClaim(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, through kube.ProvisionDecision) error {
	provisioner := through.Provisioner
	if provisioner != "" && (claim.Annotations[kube.AnnStorageProvisioner] != provisioner || claim.Annotations[kube.AnnBetaStorageProvisioner] != provisioner) {
		clone := claim.DeepCopy()
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, kube.AnnBetaStorageProvisioner, provisioner)
		metav1.SetMetaDataAnnotation(&clone.ObjectMeta, kube.AnnStorageProvisioner, provisioner)
		if err := c.fence(ctx); err != nil {
			return err
		}
		updated, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, clone, metav1.UpdateOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) {
				c.recorder.Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, fmt.Sprintf("Error saving claim: %v", err))
			}
			return c.claimWriteFailed(claim, err, "set provisioner of claim %s", claimKey(claim))
		}
		claim = c.store.refreshClaim(updated)
	}
	if through.Failure != "" {
		// As upstream: the claim stays as it is; the next resync tries
		// again (a new class may be created meanwhile).
		c.recorder.Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, through.Failure)
		return nil
	}
	served := c.provisioner != nil && c.provisioner.Serves(ctx, provisioner)
	key := claimKey(claim)
	if served {
		if out, ok := c.provisions.take(key, claim.UID); ok {
			return c.provisioned(ctx, claim, out)
		}
		if c.provisions.busy(key) {
			return nil // its end syncs the claim again
		}
		if wait := c.provisions.wait(key); wait > 0 {
			// The last call did not finish: the next waits for its backoff,
			// whatever synced the claim meanwhile.
			c.claimQueue.AddAfter(key, wait)
			return nil
		}
		if _, slow := c.provisions.delayed(key, claim.UID, class.UID); slow {
			// The driver refused the last request as infeasible and the
			// class is the same: as external-provisioner, look again
			// after the next backoff, which grows as if the call failed.
			c.claimQueue.AddAfter(key, c.provisions.retry(key))
			metrics.WorkqueueRetry(c.claimQueue.name)
			return nil
		}
	}
	if c.provisions.announce(key, time.Now()) {
		c.recorder.Event(claim, corev1.EventTypeNormal, kube.EventExternalProvisioning,
			fmt.Sprintf("Waiting for a volume to be created either by the external provisioner '%s' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.", provisioner))
	}
	if served {
		c.provisions.start(ctx, key, claim.UID, func(ctx context.Context) (provisionResult, error) {
			// The call may have waited for a slot: the claim must still be
			// this replica's.
			if err := c.fence(ctx); err != nil {
				return provisionResult{}, err
			}
			ctx, step := c.timeline.Start(ctx, string(claim.UID), "provision")
			res, err := c.provisioner.Provision(ctx, claim, class)
			if err != nil {
				step.EndErr(err, "")
			} else {
				step.End(strings.TrimPrefix(res.outcome.String(), "OUTCOME_"), res.message)
			}
			return res, err
		}, c.claimQueue.add)
	}
	return nil
}

// provisioned acts on a finished provisioning call, in the claim's sync: a
// new volume is bound at once; RESCHEDULE removes the selected node; any
// other outcome is tried again after the claim's own backoff.
func (c *controller) provisioned(ctx context.Context, claim *corev1.PersistentVolumeClaim, out provisionOutcome) error {
	key := claimKey(claim)
	if out.err == nil && out.res.outcome == provisionerv1.Outcome_OUTCOME_FINISHED {
		c.provisions.finished(key)
		if out.res.volume == nil {
			// Its watch event brings it; or the claim is a volume
			// populator's, whose PV the populator makes: either way the
			// claim is not retried.
			return nil
		}
		// The new volume enters the cache with its watch event; the bind
		// goes on with the provisioner's copy.
		return c.bind(ctx, c.store.refreshVolume(out.res.volume), claim)
	}
	if out.err == nil && out.res.outcome == provisionerv1.Outcome_OUTCOME_RESCHEDULE {
		c.provisions.finished(key)
		// The selected node cannot take the volume: let the scheduler
		// choose another by removing its choice.
		if _, ok := claim.Annotations[kube.AnnSelectedNode]; !ok {
			return nil
		}
		clone := claim.DeepCopy()
		delete(clone.Annotations, kube.AnnSelectedNode)
		if err := c.fence(ctx); err != nil {
			return err
		}
		updated, err := c.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Update(ctx, clone, metav1.UpdateOptions{})
		if err != nil {
			return c.claimWriteFailed(claim, err, "remove selected node of claim %s", key)
		}
		c.store.refreshClaim(updated)
		return nil
	}
	// In background (same name again), a final error (the provisioner sent
	// ProvisioningFailed) or the provisioner unreachable: retry with backoff.
	if errors.Is(out.err, errNotOwner) {
		return nil // the owner provisions it
	}
	delay := c.provisions.retry(key)
	if out.err == nil && out.res.infeasible {
		c.provisions.slowDown(key, claim.UID, out.res.classUID)
	}
	why := out.res.message
	if out.err != nil {
		why = out.err.Error()
	}
	c.noteRetry(ctx, key, reasonProvision, why, delay)
	retriesTotal.WithLabelValues(reasonProvision).Inc()
	metrics.WorkqueueRetry(c.claimQueue.name)
	if out.err != nil {
		c.log.Warn("provisioning call failed, retrying", logging.Claim(claim), "error", out.err, "after", delay)
	} else {
		c.log.Debug("provisioning not finished, retrying", logging.Claim(claim), "outcome", out.res.outcome, "message", out.res.message, "after", delay)
	}
	c.claimQueue.AddAfter(key, delay)
	return nil
}

// reclaimVolume runs the reclaim policy of a Released volume by handing it
// to the reclaimer service. Retain needs nothing; the reclaimer still
// records it so tooling sees why the volume stays Released.
func (c *controller) reclaimVolume(ctx context.Context, volume *corev1.PersistentVolume) error {
	if volume.Annotations[kube.AnnMigratedTo] != "" {
		return nil // an external CSI deleter owns it
	}
	if !kube.KnownReclaimPolicy(volume.Spec.PersistentVolumeReclaimPolicy) {
		_, err := c.updateVolumePhaseWithEvent(ctx, volume, corev1.VolumeFailed, kube.EventVolumeUnknownReclaim, kube.MsgUnknownReclaimPolicy)
		return err
	}
	if c.reclaimer == nil {
		return nil
	}
	if c.handed.done(volume, time.Now()) {
		c.log.Debug("the reclaimer has the volume's release already; not handed over again", "volume", volume.Name)
		return nil
	}
	if err := c.fence(ctx); err != nil {
		return err
	}
	err := c.reclaimer.Reclaim(ctx, volume)
	switch decideHandOff(err) {
	case handOffTaken:
		c.refused.forget(volume.Name)
		c.handed.taken(volume, time.Now())
		return nil
	case handOffRefused:
		c.handed.forget(volume.Name)
		// Not retried: the volume's or its claim's next change, or the
		// resync, hands it over again.
		why := status.Convert(err).Message()
		lvl := slog.LevelDebug
		if c.refused.note(volume.Name, why) {
			lvl = slog.LevelInfo
		}
		c.log.Log(ctx, lvl, "the reclaimer refused the volume; it is handed over again when the volume or its claim changes, and at the resync",
			"volume", volume.Name, "why", why)
		return nil
	}
	c.handed.forget(volume.Name)
	return fmt.Errorf("hand volume %s to the reclaimer: %w: %w", volume.Name, errReclaim, err)
}

// errReclaim says the reclaimer could not take a volume.
var errReclaim = errors.New("reclaimer")

// errReserved says another claim (of this or another replica) is binding
// the volume; the claim is synced again later.
var errReserved = errors.New("volume is reserved for another claim")
