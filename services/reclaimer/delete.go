package reclaimer

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// deleteBacking carries out Delete through volplane's provisioner: its
// DeleteVolume removes the backing volume; then the PersistentVolume object
// is deleted and the external-provisioner finalizer, which kept it while
// the backing volume existed, removed. A volume whose object a user
// deleted first (Terminating, held by the finalizer) goes the same way.
func (c *controller) deleteBacking(ctx context.Context, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume) error {
	if !r.DataRemoved {
		live, err := c.guard(ctx, r, false)
		if err != nil {
			return c.blocked(ctx, r, err)
		}
		b, err := kube.EncodeProto(live)
		if err != nil {
			return c.transient(ctx, r, err)
		}
		if err := c.begin(ctx, r, "deleting the backing volume through the provisioner"); err != nil {
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, deleteVolumeTimeout)
		resp, err := c.prov.DeleteVolume(dctx, &provisionerv1.DeleteVolumeRequest{VolumeName: live.Name, Volume: b})
		cancel()
		switch {
		case status.Code(err) == codes.FailedPrecondition:
			// Not a volume the provisioner can delete: final until the
			// volume or the provisioner changes.
			return c.fail(ctx, r, live, kube.EventVolumeFailedDelete, status.Convert(err).Message())
		case err != nil:
			return c.transient(ctx, r, fmt.Errorf("provisioner DeleteVolume: %w", err))
		}
		switch resp.GetOutcome() {
		case provisionerv1.Outcome_OUTCOME_FINISHED:
		case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
			return c.transient(ctx, r, fmt.Errorf("the driver may still be deleting the volume: %s", resp.GetMessage()))
		case provisionerv1.Outcome_OUTCOME_NO_CHANGE:
			return c.fail(ctx, r, live, kube.EventVolumeFailedDelete, resp.GetMessage())
		default:
			return c.transient(ctx, r, fmt.Errorf("provisioner DeleteVolume answered %s: %s", resp.GetOutcome(), resp.GetMessage()))
		}
		faultpoint.Hit(faultpoint.ReclaimerAfterDeleteVolume)
		r.DataRemoved, r.Message = true, "the backing volume is deleted; deleting the PersistentVolume"
		if err := c.save(ctx, r); err != nil {
			return err
		}
		v = live
	}
	// The backing volume is gone: nothing is left to protect.
	if err := c.kube.DeleteVolume(ctx, v.Name, v.UID); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return c.transient(ctx, r, fmt.Errorf("delete PersistentVolume %s: %w", v.Name, err))
	}
	if err := c.dropFinalizer(ctx, v.Name, v.UID); err != nil {
		return c.transient(ctx, r, fmt.Errorf("remove finalizer %s from PersistentVolume %s: %w", kube.FinalizerExternalProvisioner, v.Name, err))
	}
	return c.finish(ctx, r, reclaimerv1.State_STATE_SUCCEEDED, "the backing volume and the PersistentVolume are deleted")
}

// dropFinalizer removes the external-provisioner finalizer from the
// volume, if it is still there with uid.
func (c *controller) dropFinalizer(ctx context.Context, name string, uid types.UID) error {
	for range 5 {
		v, err := c.kube.GetVolume(ctx, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		i := slices.Index(v.Finalizers, kube.FinalizerExternalProvisioner)
		if v.UID != uid || i < 0 {
			return nil
		}
		clone := v.DeepCopy()
		clone.Finalizers = slices.Delete(clone.Finalizers, i, i+1)
		_, err = c.kube.UpdateVolume(ctx, clone)
		switch {
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return nil
		}
		return err
	}
	return fmt.Errorf("volume %s changed under every update", name)
}
