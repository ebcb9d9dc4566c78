package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/coord"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// deleteVolume deletes a PV's backing volume through its driver. NotFound
// from the driver means it is gone already.
func (p *provisioner) deleteVolume(ctx context.Context, pv *corev1.PersistentVolume) (result, error) {
	if pv.Spec.CSI == nil {
		return result{}, fmt.Errorf("volume %q is not a CSI volume, so it is %w", pv.Name, errNotServed)
	}
	d := p.drivers.byDriver(pv.Spec.CSI.Driver)
	if d == nil {
		return result{}, fmt.Errorf("CSI driver %q of volume %q is %w", pv.Spec.CSI.Driver, pv.Name, errNotServed)
	}
	if !d.ready() {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("CSI driver %q is not ready: %s", d.name(), d.current().info.GetMessage())}, nil
	}
	if !p.begin(kindDelete, pv.Name) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: "an attempt to delete " + pv.Name + " is running"}, nil
	}
	defer p.end(kindDelete, pv.Name)
	rec, ok, err := p.journal.AcquireGet(ctx, kindDelete, pv.Name, p.member)
	if errors.Is(err, coord.ErrReserved) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("%s is being deleted by another replica (%v)", pv.Name, err)}, nil
	}
	if err != nil {
		return result{}, err
	}
	op := deleteOp{Driver: d.name(), VolumeHandle: pv.Spec.CSI.VolumeHandle, Start: p.now()}
	if ok {
		_ = json.Unmarshal(rec.Value, &op)
	}
	op.Secret = p.deletionSecret(ctx, pv)
	op.Attempts++
	if err := p.put(ctx, kindDelete, pv.Name, op); err != nil {
		return result{}, err
	}
	return p.runDelete(ctx, d, pv.Name, op), nil
}

// runDelete calls DeleteVolume for a journaled deletion and ends or keeps
// its record.
func (p *provisioner) runDelete(ctx context.Context, d *driver, name string, op deleteOp) result {
	secrets, err := p.secrets(ctx, op.Secret)
	if err != nil {
		// As external-provisioner: the secret may be gone with its
		// namespace; delete without it and say so.
		p.log.Warn("cannot read the deletion secret; deleting the volume without secrets", "volume", name, "error", err)
		secrets = nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	_, err = d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: op.VolumeHandle, Secrets: secrets})
	cancel()
	if status.Code(err) == codes.NotFound {
		err = nil
	}
	out := classify(err, false)
	if out == provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		op.LastError = err.Error()
		if perr := p.put(ctx, kindDelete, name, op); perr != nil {
			p.log.Warn("journal deletion attempt", "volume", name, "error", perr)
		}
		return result{outcome: out, message: fmt.Sprintf("DeleteVolume %s: %v", op.VolumeHandle, err)}
	}
	if ferr := p.journal.Finish(ctx, kindDelete, name, p.member); ferr != nil {
		p.log.Warn("finish journal record", "volume", name, "error", ferr)
	}
	if err != nil {
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: fmt.Sprintf("DeleteVolume %s: %v", op.VolumeHandle, err)}
	}
	p.log.Info("deleted backing volume", "volume", name, "handle", op.VolumeHandle, "driver", d.name())
	return result{outcome: provisionerv1.Outcome_OUTCOME_FINISHED}
}
