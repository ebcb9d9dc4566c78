package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/attribute"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// deleteBacking carries out Delete through volplane's provisioner: its
// DeleteVolume removes the backing volume; then the PersistentVolume object
// is deleted and the external-provisioner finalizer, which kept it while
// the backing volume existed, removed. A volume whose object a user
// deleted first (Terminating, held by the finalizer) goes the same way.
//
// The reclaim's record is the deletion's only journal: right before the
// provisioner is asked, the volume as read is copied into it, so that a
// deletion whose PersistentVolume vanishes meanwhile is still finished
// (finishGone), whichever replica of either service stops on the way.
func (c *controller) deleteBacking(ctx context.Context, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume) (err error) {
	attempt := startDelete(v, c.now())
	defer func() { attempt.end(err, c.now()) }()
	if !r.DataRemoved {
		live, err := c.guard(ctx, r, false)
		if err != nil {
			attempt.skip()
		}
		var cancelled *cancellation
		if errors.As(err, &cancelled) && cancelled.gone {
			if err := c.finishGone(ctx, r); !errors.Is(err, errNothingInFlight) {
				return err
			}
		}
		if err != nil {
			return c.blocked(ctx, r, err)
		}
		b, err := kube.EncodeProto(live)
		if err != nil {
			return c.transient(ctx, r, err)
		}
		r.DeletingVolume = b
		if err := c.begin(ctx, r, reclaimjournal.DeletingMessage); err != nil {
			return err
		}
		faultpoint.Hit(faultpoint.ReclaimerBeforeDeleteVolume)
		if msg, err := c.askDelete(ctx, r, b); err != nil {
			return c.transient(ctx, r, err)
		} else if msg != "" {
			r.DeletingVolume = nil // a final answer: nothing is in flight
			return c.fail(ctx, r, live, kube.EventVolumeFailedDelete, msg)
		}
		faultpoint.Hit(faultpoint.ReclaimerAfterDeleteVolume)
		r.DataRemoved, r.DeletingVolume, r.Message = true, nil, "the backing volume is deleted; deleting the PersistentVolume"
		if err := c.save(ctx, r); err != nil {
			return err
		}
		v = live
	}
	// The backing volume is gone (and the journal says so): nothing is
	// left to protect. The finalizer goes first, from the volume as last
	// read, so that the delete removes the object at once: two writes and
	// no read, where deleting first needs a read of the Terminating
	// volume to update it.
	pctx, sp := c.startSpan(ctx, spanDeletePV, r)
	if err := c.dropFinalizer(pctx, v); err != nil {
		err = fmt.Errorf("remove finalizer %s from PersistentVolume %s: %w", kube.FinalizerExternalProvisioner, v.Name, err)
		endSpan(sp, err)
		return c.transient(ctx, r, err)
	}
	if err := c.kube.DeleteVolume(pctx, v.Name, v.UID); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		err = fmt.Errorf("delete PersistentVolume %s: %w", v.Name, err)
		endSpan(sp, err)
		return c.transient(ctx, r, err)
	}
	endSpan(sp, nil)
	return c.finish(ctx, r, reclaimerv1.State_STATE_SUCCEEDED, "the backing volume and the PersistentVolume are deleted")
}

// errNothingInFlight: the reclaim has no deletion of a backing volume in
// flight for finishGone to finish.
var errNothingInFlight = errors.New("no deletion of the backing volume is in flight")

// finishGone finishes the deletion of a backing volume whose
// PersistentVolume went away while it was in flight (a volume without the
// external-provisioner finalizer that somebody deleted): the provisioner
// deletes it from the record's copy of the volume, which it reads from the
// journal itself. It returns errNothingInFlight when the record has no
// deletion in flight: the reclaim is then simply cancelled.
func (c *controller) finishGone(ctx context.Context, r *reclaimerv1.Reclaim) error {
	if v, err := reclaimjournal.Deleting(r); err != nil || v == nil {
		if err != nil {
			c.log.Warn("the journaled deletion cannot be finished", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "error", err)
		}
		return errNothingInFlight
	}
	c.log.Info("the volume is gone while its backing volume was being deleted: finishing the deletion", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid))
	msg, err := c.askDelete(ctx, r, r.DeletingVolume)
	switch {
	case err != nil:
		return c.transient(ctx, r, err)
	case msg != "":
		return c.finish(ctx, r, reclaimerv1.State_STATE_CANCELLED, "the volume is gone and the deletion of its backing volume failed: "+msg)
	}
	faultpoint.Hit(faultpoint.ReclaimerAfterDeleteVolume)
	r.DataRemoved, r.DeletingVolume = true, nil
	return c.finish(ctx, r, reclaimerv1.State_STATE_SUCCEEDED, "the backing volume is deleted and the PersistentVolume is gone")
}

// askDelete asks the provisioner to delete the backing volume of r's
// volume (b: the volume, for its UID). nil, "" means the backing volume is
// gone; a message, that the provisioner refused or the driver failed
// finally; an error, that the next attempt may succeed.
func (c *controller) askDelete(ctx context.Context, r *reclaimerv1.Reclaim, b []byte) (string, error) {
	ctx, sp := c.startSpan(ctx, spanDeleteVolume, r)
	dctx, cancel := context.WithTimeout(ctx, deleteVolumeTimeout)
	resp, err := c.prov.DeleteVolume(dctx, &provisionerv1.DeleteVolumeRequest{VolumeName: r.VolumeName, Volume: b})
	cancel()
	if sp.IsRecording() {
		sp.SetAttributes(attribute.String("volplane.code", status.Code(err).String()), attribute.String("volplane.outcome", resp.GetOutcome().String()),
			attribute.String("volplane.detail", resp.GetMessage()))
	}
	endSpan(sp, err)
	switch {
	case status.Code(err) == codes.FailedPrecondition:
		// Not a volume the provisioner can delete: final until the
		// volume or the provisioner changes.
		return status.Convert(err).Message(), nil
	case err != nil:
		return "", provisionerError{fmt.Errorf("provisioner DeleteVolume: %w", err)}
	}
	switch resp.GetOutcome() {
	case provisionerv1.Outcome_OUTCOME_FINISHED:
		return "", nil
	case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
		return "", provisionerError{fmt.Errorf("the driver may still be deleting the volume: %s", resp.GetMessage())}
	case provisionerv1.Outcome_OUTCOME_NO_CHANGE:
		return resp.GetMessage(), nil
	}
	return "", provisionerError{fmt.Errorf("provisioner DeleteVolume answered %s: %s", resp.GetOutcome(), resp.GetMessage())}
}

// dropFinalizer removes the external-provisioner finalizer from the
// volume v (as read), if it is still there with v's UID: an update of v as
// read, and only when that conflicts, a read and an update again.
func (c *controller) dropFinalizer(ctx context.Context, v *corev1.PersistentVolume) error {
	name, uid := v.Name, v.UID
	for range 5 {
		i := slices.Index(v.Finalizers, kube.FinalizerExternalProvisioner)
		if v.UID != uid || i < 0 {
			return nil
		}
		clone := v.DeepCopy()
		clone.Finalizers = slices.Delete(clone.Finalizers, i, i+1)
		_, err := c.kube.UpdateVolume(ctx, clone)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return err
		}
		if v, err = c.kube.GetVolume(ctx, name); apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
	}
	return fmt.Errorf("volume %s changed under every update", name)
}
