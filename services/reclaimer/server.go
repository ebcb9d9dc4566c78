package reclaimer

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/paging"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// forwardedHeader marks a RetryReclaim one replica passed to the holder
// of the reclaim, so it is never passed on again.
const forwardedHeader = "volplane-forwarded-by"

// server is ReclaimerService over the controller. Errors become gRPC
// status codes here, and only here.
type server struct {
	reclaimerv1.UnimplementedReclaimerServiceServer
	c *controller
	// peer returns the address of a live replica, "" when it has none.
	peer func(ctx context.Context, member string) (string, error)
	// tls dials the other replicas.
	tls grpcutil.TLSFiles
}

var _ reclaimerv1.ReclaimerServiceServer = (*server)(nil)

// grpcError turns the controller's errors into status codes with messages
// that say what to fix.
func grpcError(err error) error {
	var pre *preconditionError
	var refused *guard.Refusal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pre):
		return status.Error(codes.FailedPrecondition, pre.msg)
	case errors.As(err, &refused):
		return status.Error(codes.FailedPrecondition, refused.Reason)
	case errors.Is(err, errVolumeNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, errJournal), errors.Is(err, coord.ErrSessionLost):
		return status.Error(codes.Unavailable, err.Error())
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return status.Error(codes.InvalidArgument, err.Error())
	case apierrors.IsForbidden(err):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.As(err, new(apierrors.APIStatus)):
		// The API server could not answer: try again.
		return status.Error(codes.Unavailable, err.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}

// Reclaim implements ReclaimerService. The volume is read from the API
// server: one sent in the request is only checked (its name and UID must
// be the request's) and never acted on, so a forged object cannot start a
// reclaim. A reclaim that would destroy data (Delete, Recycle) is refused
// with FailedPrecondition while a live claim points at the volume.
func (s *server) Reclaim(ctx context.Context, req *reclaimerv1.ReclaimRequest) (*reclaimerv1.ReclaimResponse, error) {
	sent, err := validateReclaim(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	uid := req.GetVolumeUid()
	if uid == "" && sent != nil {
		uid = string(sent.UID)
	}
	if r := s.c.heldRelease(sent, uid); r != nil {
		grpcutil.Repeated(ctx) // logged at debug: it started nothing
		return &reclaimerv1.ReclaimResponse{Reclaim: answer(r)}, nil
	}
	v, err := s.c.kube.GetVolume(ctx, req.GetVolumeName())
	switch {
	case apierrors.IsNotFound(err):
		// Nothing to start; a reclaim already journaled goes on by itself.
		if r, lerr := s.c.lookup(ctx, req.GetVolumeName()); lerr == nil && r != nil {
			return &reclaimerv1.ReclaimResponse{Reclaim: answer(r)}, nil
		}
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q does not exist and no reclaim of it is journaled: only an existing Released volume is reclaimed", req.GetVolumeName())
	case err != nil:
		return nil, apiStatus(err, "read volume "+req.GetVolumeName())
	case uid != "" && string(v.UID) != uid:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q has uid %s, not volume_uid %s: it was recreated", v.Name, v.UID, uid)
	}
	if sent != nil && sent.ResourceVersion != v.ResourceVersion {
		s.c.log.Debug("the volume sent differs from the API server's; using the API server's", "volume", v.Name,
			"sentResourceVersion", sent.ResourceVersion, "resourceVersion", v.ResourceVersion)
	}
	if err := s.c.refuseLiveClaim(ctx, v); err != nil {
		return nil, grpcError(err)
	}
	r, err := s.c.reclaim(ctx, v)
	if err != nil {
		return nil, grpcError(err)
	}
	return &reclaimerv1.ReclaimResponse{Reclaim: answer(r)}, nil
}

// heldRelease answers a Reclaim of a release this replica already holds
// from memory: the volume sent (with uid) is Released or Failed with the
// claimRef UID and the policy of the held reclaim. The binder hands a
// volume over once per release and again at its resync (an older binder,
// or another implementation, on every change of it): reading it and its
// claim from the API server again for each would cost two reads that
// decide nothing, as the answer starts nothing; the call is logged at
// debug (grpcutil.Repeated). The held reclaim's
// worker re-reads the volume and the claims before every step, whatever
// the request said. nil: the request takes the full path.
func (c *controller) heldRelease(sent *corev1.PersistentVolume, uid string) *reclaimerv1.Reclaim {
	if sent == nil || uid == "" || string(sent.UID) != uid {
		return nil
	}
	switch sent.Status.Phase {
	case corev1.VolumeReleased, corev1.VolumeFailed:
	default:
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[sent.Name]
	if e == nil || !e.held || e.rec.VolumeUid != uid || e.rec.ClaimUid != claimUID(sent) || claimUID(sent) == "" ||
		e.rec.Policy != string(sent.Spec.PersistentVolumeReclaimPolicy) {
		return nil
	}
	return clone(e.rec)
}

// lookup finds a volume's reclaim: in the journal (an active reclaim,
// whoever holds it; this replica's own state when it holds it), else this
// replica's recent records.
func (c *controller) lookup(ctx context.Context, name string) (*reclaimerv1.Reclaim, error) {
	if r := c.heldRecord(name); r != nil {
		return r, nil
	}
	rec, ok, err := c.journal.Get(ctx, reclaimjournal.Kind, name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errJournal, err)
	}
	if ok {
		return reclaimjournal.Decode(rec)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[name]; e != nil && c.now().Before(e.expires) {
		return clone(e.rec), nil
	}
	return nil, nil
}

// GetReclaim implements ReclaimerService.
func (s *server) GetReclaim(ctx context.Context, req *reclaimerv1.GetReclaimRequest) (*reclaimerv1.GetReclaimResponse, error) {
	if err := guard.CheckName("volume_name", req.GetVolumeName(), guard.VolumeName); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	r, err := s.c.lookup(ctx, req.GetVolumeName())
	if err != nil {
		return nil, grpcError(err)
	}
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "no reclaim of volume %q is in the journal or known to this replica: the binder starts one when the volume is Released (or start it with Reclaim)", req.GetVolumeName())
	}
	return &reclaimerv1.GetReclaimResponse{Reclaim: answer(r)}, nil
}

// ListReclaims implements ReclaimerService: a page of the reclaims that
// pass the filters, by volume name.
func (s *server) ListReclaims(ctx context.Context, req *reclaimerv1.ListReclaimsRequest) (*reclaimerv1.ListReclaimsResponse, error) {
	if _, ok := reclaimerv1.State_name[int32(req.GetState())]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "state %d is unknown: use one of STATE_PENDING, STATE_RUNNING, STATE_RETAINED, STATE_SUCCEEDED, STATE_FAILED, STATE_SKIPPED, STATE_CANCELLED, or none for all", req.GetState())
	}
	driver, ns := req.GetDriver(), req.GetClaimNamespace()
	if ns != "" {
		if err := guard.CheckName("claim_namespace", ns, guard.Namespace); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if err := guard.CheckText("driver", driver); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	page, err := paging.New[*reclaimerv1.Reclaim]("reclaimer.reclaims", req.GetPageSize(), req.GetPageToken(),
		"state", req.GetState().String(), "driver", driver, "claimNamespace", ns)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	recs, err := s.c.journal.List(ctx, reclaimjournal.Kind)
	if err != nil {
		return nil, grpcError(fmt.Errorf("%w: %w", errJournal, err))
	}
	byName := map[string]*reclaimerv1.Reclaim{}
	s.c.mu.Lock()
	now := s.c.now()
	for name, e := range s.c.entries {
		if e.held || now.Before(e.expires) {
			byName[name] = clone(e.rec)
		}
	}
	s.c.mu.Unlock()
	for _, rec := range recs {
		if mine := byName[rec.Name]; mine != nil && rec.Holder == s.c.member {
			continue // this replica's memory is the same, and current
		}
		if r, err := reclaimjournal.Decode(rec); err == nil {
			byName[rec.Name] = r
		}
	}
	for name, r := range byName {
		if (req.GetState() == reclaimerv1.State_STATE_UNSPECIFIED || r.State == req.GetState()) &&
			(driver == "" || r.GetDriver() == driver) && (ns == "" || r.GetClaimNamespace() == ns) {
			page.Offer(name, answer(r))
		}
	}
	out := &reclaimerv1.ListReclaimsResponse{}
	out.Reclaims, out.NextPageToken = page.Page()
	return out, nil
}

// RetryReclaim implements ReclaimerService. A reclaim another replica
// holds is passed to it; one whose replica stopped is taken over first.
func (s *server) RetryReclaim(ctx context.Context, req *reclaimerv1.RetryReclaimRequest) (*reclaimerv1.RetryReclaimResponse, error) {
	name := req.GetVolumeName()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_name is required")
	}
	if err := guard.CheckName("volume_name", name, guard.VolumeName); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.c.checkRetry(ctx, name); err != nil {
		return nil, grpcError(err)
	}
	if r, err := s.c.retryNow(ctx, name); r != nil || err != nil {
		return retried(r, err)
	}
	rec, ok, err := s.c.journal.Get(ctx, reclaimjournal.Kind, name)
	if err != nil {
		return nil, grpcError(fmt.Errorf("%w: %w", errJournal, err))
	}
	if !ok {
		r, err := s.c.lookup(ctx, name)
		if err != nil {
			return nil, grpcError(err)
		}
		if r == nil {
			return nil, status.Errorf(codes.NotFound, "no reclaim of volume %q is in the journal or known to this replica: nothing to retry", name)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "the reclaim of volume %q is %s (%s): only a FAILED reclaim can be retried", name, r.State, r.Message)
	}
	if rec.Holder == "" {
		if err := s.c.adopt(ctx, rec); err != nil && !errors.Is(err, coord.ErrReserved) {
			return nil, grpcError(err)
		}
		if r, err := s.c.retryNow(ctx, name); r != nil || err != nil {
			return retried(r, err)
		}
		if rec, _, err = s.c.journal.Get(ctx, reclaimjournal.Kind, name); err != nil {
			return nil, grpcError(fmt.Errorf("%w: %w", errJournal, err))
		}
	}
	return s.forward(ctx, rec, req)
}

// answer is a reclaim as the API shows it: without the copy of the volume
// being deleted and the trace's parent, which only the journal keeps.
func answer(r *reclaimerv1.Reclaim) *reclaimerv1.Reclaim {
	r.DeletingVolume = nil
	r.TraceParent = ""
	return r
}

func retried(r *reclaimerv1.Reclaim, err error) (*reclaimerv1.RetryReclaimResponse, error) {
	if err != nil {
		return nil, grpcError(err)
	}
	return &reclaimerv1.RetryReclaimResponse{Reclaim: answer(r)}, nil
}

// forward passes a retry to the replica holding the reclaim.
func (s *server) forward(ctx context.Context, rec coord.Record, req *reclaimerv1.RetryReclaimRequest) (*reclaimerv1.RetryReclaimResponse, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedHeader)) > 0 {
		return nil, status.Errorf(codes.Unavailable, "the reclaim of volume %q is held by replica %q, which this replica was told holds it too: ownership is changing, retry shortly", rec.Name, rec.Holder)
	}
	addr := ""
	if s.peer != nil && rec.Holder != "" {
		var err error
		if addr, err = s.peer(ctx, rec.Holder); err != nil {
			return nil, grpcError(fmt.Errorf("%w: %w", errJournal, err))
		}
	}
	if addr == "" {
		return nil, status.Errorf(codes.Unavailable, "the reclaim of volume %q is held by replica %q, whose address is not known: retry shortly", rec.Name, rec.Holder)
	}
	cc, err := grpcutil.Dial(addr, s.tls)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reach reclaimer replica %s at %s: %v", rec.Holder, addr, err)
	}
	defer cc.Close()
	ctx = metadata.AppendToOutgoingContext(auth.ForwardIncoming(ctx), forwardedHeader, s.c.member)
	return reclaimerv1.NewReclaimerServiceClient(cc).RetryReclaim(ctx, req)
}

// retryNow retries a FAILED reclaim this replica holds at once, resetting
// its backoff. It returns nil, nil when this replica does not hold the
// reclaim.
func (c *controller) retryNow(ctx context.Context, name string) (*reclaimerv1.Reclaim, error) {
	r := c.heldRecord(name)
	if r == nil {
		return nil, nil
	}
	if r.State != reclaimerv1.State_STATE_FAILED {
		return nil, &preconditionError{fmt.Sprintf("the reclaim of volume %q is %s (%s): only a FAILED reclaim can be retried", name, r.State, r.Message)}
	}
	r.State, r.Message, r.NextAttemptTime = reclaimerv1.State_STATE_PENDING, "retry requested", nil
	if err := c.save(ctx, r); err != nil {
		return nil, err
	}
	c.queue.Forget(name)
	c.queue.Add(name)
	c.log.Info("reclaim retry requested", "volume", name)
	r.UpdateTime = timestamppb.New(c.now())
	return r, nil
}
