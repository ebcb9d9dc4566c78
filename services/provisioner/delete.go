package provisioner

import (
	"context"
	"errors"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// deleteVolume deletes a PV's backing volume through its driver. NotFound
// from the driver means it is gone already.
//
// A deletion is not journaled here: the caller that decided it (the
// reclaimer) journals it, one record per deletion (pkg/reclaimjournal),
// and asks again, of whichever replica, until an answer is final.
// DeleteVolume is idempotent, so an attempt cut short by a crash is simply
// made again; two at once in this replica are one. A replica without an
// etcd session deletes nothing: without etcd, nothing destructive happens
// (a safety invariant of the design, checked by the chaos run).
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
	node, err := p.deletionNode(d, pv)
	if err != nil {
		out := classify(err, false)
		return result{outcome: out, message: err.Error()}, nil
	}
	return p.runDelete(withNode(ctx, node), d, pv.Name, pv.Spec.CSI.VolumeHandle, p.deletionSecret(ctx, pv)), nil
}

// errNoSession: this replica has no etcd session, so it deletes nothing.
var errNoSession = errors.New("this provisioner replica has no etcd session: it deletes nothing until it has one; another replica may")

// runDelete calls DeleteVolume with the deletion secret, if any.
func (p *provisioner) runDelete(ctx context.Context, d *driver, name, handle string, secret *secretRef) result {
	if p.session != nil && !p.session() {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: errNoSession.Error()}
	}
	secrets, err := p.secrets(ctx, secret)
	if err != nil {
		// As external-provisioner: the secret may be gone with its
		// namespace; delete without it and say so.
		p.log.Warn("cannot read the deletion secret; deleting the volume without secrets", "volume", name, "error", err)
		secrets = nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeoutFor(d))
	_, err = d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: handle, Secrets: secrets})
	cancel()
	if status.Code(err) == codes.NotFound {
		err = nil
	}
	switch out := classify(err, false); {
	case out == provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
		return result{outcome: out, message: fmt.Sprintf("DeleteVolume %s: %v", handle, err)}
	case err != nil:
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: fmt.Sprintf("DeleteVolume %s: %v", handle, err)}
	}
	p.log.Info("deleted backing volume", "volume", name, "handle", handle, "driver", d.name())
	return result{outcome: provisionerv1.Outcome_OUTCOME_FINISHED}
}
