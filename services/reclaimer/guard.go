package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// validateReclaim checks a Reclaim request up front and decodes the volume
// it carries, nil when it carries none. That volume is a caller's claim
// about the state, never acted on: Reclaim reads the volume itself.
func validateReclaim(req *reclaimerv1.ReclaimRequest) (*corev1.PersistentVolume, error) {
	if req.GetVolumeName() == "" {
		return nil, errors.New("volume_name is required: the name of a Released PersistentVolume")
	}
	if err := guard.CheckName("volume_name", req.GetVolumeName(), guard.VolumeName); err != nil {
		return nil, err
	}
	if err := guard.CheckText("volume_uid", req.GetVolumeUid()); err != nil {
		return nil, err
	}
	if len(req.GetVolume()) == 0 {
		return nil, nil
	}
	v, err := kube.DecodeVolume(req.GetVolume())
	if err != nil {
		return nil, fmt.Errorf("volume: not a PersistentVolume in Kubernetes protobuf encoding: %w", err)
	}
	if v.Name != req.GetVolumeName() {
		return nil, fmt.Errorf("volume_name %q does not match the volume's metadata.name %q", req.GetVolumeName(), v.Name)
	}
	if req.GetVolumeUid() != "" && string(v.UID) != req.GetVolumeUid() {
		return nil, fmt.Errorf("volume_uid %q does not match the volume's metadata.uid %q", req.GetVolumeUid(), v.UID)
	}
	return v, nil
}

// refuseLiveClaim refuses a reclaim whose policy may destroy data
// (Delete, Recycle) while a claim still has a hold on the volume (see
// checkClaims). Retain destroys nothing and is only recorded.
func (c *controller) refuseLiveClaim(ctx context.Context, v *corev1.PersistentVolume) error {
	switch v.Spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRecycle:
	default:
		return nil
	}
	switch v.Status.Phase {
	case corev1.VolumeReleased, corev1.VolumeFailed:
	default:
		return nil // reclaim refuses it with the phase
	}
	err := c.checkClaims(ctx, v)
	var refused *guard.Refusal
	if errors.As(err, &refused) {
		c.rememberRefusal(v, refused.Reason)
	}
	return err
}

// checkClaims is the claim guard a reclaim of the volume as it is now
// must pass. A plan that destroys data (a deletion through the provisioner, a
// scrub, or one not decided yet) needs no live claim pointing at the
// volume at all (guard.LiveClaim). A plan that destroys nothing and only
// gives the volume up (METHOD_UNSUPPORTED: Failed, because no plugin
// deletes or recycles it) needs the volume released as
// kube-controller-manager has it (guard.Released): its claim may still
// exist when it is bound to another volume, and Kubernetes then marks the
// volume Failed too. A plan that does nothing (a volume another deleter
// owns, SKIPPED) needs nothing. Each step of a held reclaim still checks
// guard.LiveClaim right before it destroys anything (sync.go).
func (c *controller) checkClaims(ctx context.Context, v *corev1.PersistentVolume) error {
	switch p := c.plan(ctx, v); {
	case !p.acts():
		return nil
	case p.method == reclaimerv1.Method_METHOD_UNSUPPORTED:
		return guard.Released(ctx, c.kube, v)
	}
	return guard.LiveClaim(ctx, c.kube, v)
}

// rememberRefusal keeps a refused Reclaim as a PENDING record for
// RecordTTL, so GetReclaim and ListReclaims say why the volume waits (the
// binder hands it over again). A reclaim this replica holds is left as it
// is: its own guard refuses its steps. The refusal is logged at info when
// its reason is new, at debug when the binder hands the volume over again
// and meets the same one.
func (c *controller) rememberRefusal(v *corev1.PersistentVolume, reason string) {
	r := c.newRecord(v, plan{method: reclaimerv1.Method_METHOD_UNSPECIFIED, state: reclaimerv1.State_STATE_PENDING,
		message: "refused, will check again when the volume is handed over again: " + reason})
	r.Owner = ""
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[v.Name]
	if e != nil && e.held {
		return
	}
	lvl := slog.LevelInfo
	if e != nil && e.refused && sameReclaimOf(e.rec, r) && e.rec.Message == r.Message {
		lvl = slog.LevelDebug
	}
	c.entries[v.Name] = &entry{rec: r, expires: c.now().Add(c.cfg.ttl), refused: true}
	c.log.Log(context.Background(), lvl, "reclaim refused", "volume", v.Name, "why", reason)
}

// sameReclaimOf reports whether two records are of one release of one
// volume.
func sameReclaimOf(a, b *reclaimerv1.Reclaim) bool {
	return a.VolumeUid == b.VolumeUid && a.ClaimUid == b.ClaimUid
}

// checkRetry decides from the API server and the journal whether a retry
// of the volume's reclaim may run: the volume is Released or Failed with a
// policy that destroys data, the journaled reclaim is of its present
// release, and no live claim points at it. A volume that is gone may only
// be retried while its reclaim is journaled (the retry then finishes it
// without touching any data).
func (c *controller) checkRetry(ctx context.Context, name string) error {
	r, err := c.lookup(ctx, name)
	if err != nil {
		return err
	}
	v, err := c.kube.GetVolume(ctx, name)
	switch {
	case apierrors.IsNotFound(err):
		if r == nil {
			return &preconditionError{fmt.Sprintf("volume %q does not exist and no reclaim of it is journaled: nothing to retry", name)}
		}
		return nil
	case err != nil:
		return fmt.Errorf("read volume %s: %w", name, err)
	}
	if err := guard.Volume(v, corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRecycle); err != nil {
		return err
	}
	if r != nil && (r.VolumeUid != string(v.UID) || r.ClaimUid != claimUID(v)) {
		return &preconditionError{fmt.Sprintf("the reclaim of volume %q is of an earlier release (volume uid %s, claim uid %s), not of the volume as it is now (uid %s, claim uid %s)",
			name, r.VolumeUid, r.ClaimUid, v.UID, claimUID(v))}
	}
	return c.checkClaims(ctx, v)
}

// apiStatus turns an API server error of what into a gRPC status.
func apiStatus(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.NotFound, "%s: %v", what, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	case apierrors.IsForbidden(err):
		return status.Errorf(codes.PermissionDenied, "%s: %v", what, err)
	}
	return status.Errorf(codes.Unavailable, "%s: %v", what, err)
}
