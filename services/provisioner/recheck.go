package provisioner

import (
	"context"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/logging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// unwanted says why claim no longer wants the provisioned volume named
// volume, or "" when it still does: it exists with uid, is not being
// deleted, and asks for no other volume. claim nil means it is gone.
func unwanted(claim *corev1.PersistentVolumeClaim, uid types.UID, volume string) string {
	switch {
	case claim == nil:
		return "the claim is gone"
	case claim.UID != uid:
		return fmt.Sprintf("the claim was recreated (uid %s, not %s)", claim.UID, uid)
	case claim.DeletionTimestamp != nil:
		return "the claim is being deleted"
	case claim.Spec.VolumeName != "" && claim.Spec.VolumeName != volume:
		return "the claim asks for volume " + claim.Spec.VolumeName
	}
	return ""
}

// recheck reads the claim from the API server (never a cache) right
// before a step with a side effect (CreateVolume, creating the PV) and
// says why it no longer wants volume, "" when it still does. An error is
// a failed read: the caller takes no step.
func (p *provisioner) recheck(ctx context.Context, claim *corev1.PersistentVolumeClaim, volume string) (string, error) {
	live, err := p.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		live = nil
	case err != nil:
		return "", fmt.Errorf("re-read claim %s/%s before provisioning %s: %w", claim.Namespace, claim.Name, volume, err)
	}
	return unwanted(live, claim.UID, volume), nil
}

// abandon ends a provisioning whose claim no longer wants its volume
// (why), found by the re-check before CreateVolume. An attempt with no
// earlier journal record asked the driver for nothing: the record just
// ends. After an earlier attempt the driver may have made the volume, so
// it is undone as recovery undoes it.
func (p *provisioner) abandon(ctx context.Context, d *driver, name string, op provisionOp, earlier bool, why string) (result, error) {
	msg := fmt.Sprintf("not provisioning %s for claim %s/%s: %s", name, op.ClaimNamespace, op.ClaimName, why)
	if !earlier {
		if err := p.journal.Finish(ctx, kindProvision, name, p.member); err != nil {
			return result{}, err
		}
		p.log.Info("provisioning abandoned before CreateVolume", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "reason", why)
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: msg}, nil
	}
	if err := p.undo(ctx, d, name, op, why); err != nil {
		return result{}, err
	}
	return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: msg}, nil
}

// discard deletes the volume just created for a claim that no longer
// wants it (why), found by the re-check before creating the PV, and ends
// the journal record. When DeleteVolume does not answer for sure, the
// record stays with the reason and recovery undoes it.
func (p *provisioner) discard(ctx context.Context, d *driver, name string, op provisionOp, handle string, why string) (result, error) {
	msg := fmt.Sprintf("not saving PersistentVolume %s for claim %s/%s: %s", name, op.ClaimNamespace, op.ClaimName, why)
	ctx = withNode(ctx, op.Node) // a node-deployed driver's volume is on that node (undo)
	secrets, err := p.secrets(ctx, op.Secret)
	if err != nil {
		p.log.Warn("delete an unwanted volume without its secret", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "error", err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeoutFor(d))
	_, err = d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: handle, Secrets: secrets})
	cancel()
	if err != nil && status.Code(err) != codes.NotFound {
		op.LastError = "undo (" + why + "): DeleteVolume: " + err.Error()
		if perr := p.put(ctx, kindProvision, name, op); perr != nil {
			p.log.Warn("journal provisioning attempt", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "error", perr)
		}
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: msg + "; " + op.LastError}, nil
	}
	if err := p.journal.Finish(ctx, kindProvision, name, p.member); err != nil {
		return result{}, err
	}
	p.log.Info("provisioning undone before the PV: volume deleted", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "handle", handle,
		"claim", op.ClaimNamespace+"/"+op.ClaimName, "reason", why)
	return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: msg + "; the volume is deleted"}, nil
}

// undo deletes whatever volume the journaled request op may have made,
// for a claim that no longer wants it (why), and ends the record; the
// caller holds the operation's lock and has seen that no PV exists. The
// request is sent again (the driver returns the volume if it exists, or
// makes it) and the volume deleted, so nothing is leaked whatever the
// driver did in the background. When the driver does not answer for sure,
// the record stays with the reason, for the next recovery.
func (p *provisioner) undo(ctx context.Context, d *driver, name string, op provisionOp, why string) error {
	// A node-deployed driver's volume is on the node the request went to:
	// the undo asks that node's sidecar, or another node's driver would
	// make (and delete) a volume of its own and leave the first one.
	ctx = withNode(ctx, op.Node)
	req := &csi.CreateVolumeRequest{}
	if err := proto.Unmarshal(op.Request, req); err != nil {
		return fmt.Errorf("journal record request: %w", err)
	}
	secrets, err := p.secrets(ctx, op.Secret)
	if err != nil {
		p.log.Warn("undo provisioning without its secret", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "error", err)
	}
	req.Secrets = secrets
	cctx, cancel := context.WithTimeout(ctx, p.timeoutFor(d))
	resp, err := d.controller.CreateVolume(cctx, req)
	cancel()
	switch classify(err, false) {
	case provisionerv1.Outcome_OUTCOME_FINISHED:
	case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
		op.LastError = "undo (" + why + "): " + err.Error()
		return p.put(ctx, kindProvision, name, op)
	default:
		// A final answer: the driver has no such volume.
		p.log.Info("provisioning undone: no volume was made", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "answer", err)
		return p.journal.Finish(ctx, kindProvision, name, p.member)
	}
	cctx, cancel = context.WithTimeout(ctx, p.timeoutFor(d))
	_, err = d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId(), Secrets: secrets})
	cancel()
	if err != nil && status.Code(err) != codes.NotFound {
		op.LastError = "undo (" + why + "): DeleteVolume: " + err.Error()
		return p.put(ctx, kindProvision, name, op)
	}
	p.log.Info("provisioning undone: volume deleted", "volume", name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "handle", resp.GetVolume().GetVolumeId(),
		"claim", op.ClaimNamespace+"/"+op.ClaimName, "reason", why)
	return p.journal.Finish(ctx, kindProvision, name, p.member)
}
