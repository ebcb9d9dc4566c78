package provisioner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	"github.com/volplane/volplane/pkg/paging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner/capacity"
	"github.com/volplane/volplane/services/provisioner/orphans"
)

// server is the gRPC face of the provisioner: its methods (here and in
// plan.go, orphans.go, capacity.go and guard.go) validate requests and
// turn errors into status codes; the code below them returns plain
// errors. It never acts on
// an object a caller sent: claims, classes and volumes are read from the
// API server (or the claim and class cache, when it holds the very version
// sent).
type server struct {
	provisionerv1.UnimplementedProvisionerServiceServer
	p *provisioner
	// hints checks sent claims and classes (guard.go).
	hints hints
	// claims finds the claims pointing at a volume.
	claims guard.Claims
	// capacity publishes CSIStorageCapacity objects; nil when tracking is
	// off (package capacity).
	capacity *capacity.Controller
	// orphans finds and deletes orphans (package orphans).
	orphans *orphans.Scanner
}

// Provision makes one attempt at the claim's volume and says how it ended.
// The claim and its class are the API server's: a claim or class in the
// request only saves a read when the claim and class cache holds that very
// version, so secrets are read only as the real class names them for the
// real claim.
func (s *server) Provision(ctx context.Context, req *provisionerv1.ProvisionRequest) (*provisionerv1.ProvisionResponse, error) {
	sentClaim, sentClass, err := validateProvision(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	claim, err := s.readClaim(ctx, req.GetClaimNamespace(), req.GetClaimName(), sentClaim)
	if err != nil {
		return nil, err
	}
	if req.GetClaimUid() != "" && string(claim.UID) != req.GetClaimUid() {
		return nil, status.Errorf(codes.FailedPrecondition, "claim %s/%s has UID %s, not claim_uid %s: it was recreated", claim.Namespace, claim.Name, claim.UID, req.GetClaimUid())
	}
	name := match.ClaimClass(claim)
	if name == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "claim %s/%s names no StorageClass: nothing to provision", claim.Namespace, claim.Name)
	}
	if v := claim.Spec.VolumeName; v != "" && !s.p.ownVolumeName(v, claim) {
		return nil, status.Errorf(codes.FailedPrecondition, "claim %s/%s asks for volume %s (spec.volumeName): nothing to provision", claim.Namespace, claim.Name, v)
	}
	class, err := s.readClass(ctx, name, sentClass)
	if err != nil {
		return nil, err
	}
	ctx, step := s.p.timeline.Start(ctx, string(claim.UID), "provision")
	start := time.Now()
	res, err := s.p.provision(ctx, claim, class, "")
	countProvision(claim, res, err, start)
	if err != nil {
		step.EndErr(err, "")
		return nil, toStatus(err)
	}
	step.End(strings.TrimPrefix(res.outcome.String(), "OUTCOME_"), res.message)
	outcomes.WithLabelValues(kindProvision, res.outcome.String()).Inc()
	out := &provisionerv1.ProvisionResponse{Outcome: res.outcome, VolumeName: s.p.volumeNameFor(class, claim), Message: res.message,
		Infeasible: res.infeasible, StorageClassUid: string(class.UID)}
	if res.volume != nil {
		if out.Volume, err = kube.EncodeProto(res.volume); err != nil {
			return nil, status.Errorf(codes.Internal, "encode volume: %v", err)
		}
	}
	return out, nil
}

// DeleteVolume deletes a PV's backing volume (not the PV). The PV is read
// from the API server, and its backing volume deleted only while it is
// Released or Failed, has policy Delete and no live claim points at it. The
// backing volume of a PV that is gone is deleted only while its reclaim
// record in the journal has that deletion in flight, from the record's copy
// of the PV. A volume sent in the request is never used.
func (s *server) DeleteVolume(ctx context.Context, req *provisionerv1.DeleteVolumeRequest) (*provisionerv1.DeleteVolumeResponse, error) {
	sent, err := validateDeleteVolume(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	var res result
	pv, err := s.p.client.CoreV1().PersistentVolumes().Get(ctx, req.GetVolumeName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		var found bool
		if res, found, err = s.p.deleteJournaled(ctx, req.GetVolumeName(), sent); err != nil {
			return nil, toStatus(err)
		}
		if !found {
			return nil, status.Errorf(codes.FailedPrecondition, "PersistentVolume %s does not exist and no deletion of it is journaled: there is nothing this provisioner may delete", req.GetVolumeName())
		}
	case err != nil:
		return nil, apiStatus(err, "PersistentVolume "+req.GetVolumeName())
	case sent != nil && sent.UID != pv.UID:
		return nil, status.Errorf(codes.FailedPrecondition, "PersistentVolume %s has uid %s, not the uid %s of the volume sent: it was recreated", pv.Name, pv.UID, sent.UID)
	default:
		if err := s.guardDelete(ctx, pv); err != nil {
			return nil, err
		}
		if res, err = s.p.deleteVolume(ctx, pv); err != nil {
			return nil, toStatus(err)
		}
	}
	outcomes.WithLabelValues(kindDelete, res.outcome.String()).Inc()
	return &provisionerv1.DeleteVolumeResponse{Outcome: res.outcome, Message: res.message}, nil
}

// ListDrivers lists a page of the configured CSI drivers as last probed,
// by provisioner name (then endpoint, for drivers not probed yet).
func (s *server) ListDrivers(_ context.Context, req *provisionerv1.ListDriversRequest) (*provisionerv1.ListDriversResponse, error) {
	page, err := newPage[*provisionerv1.Driver]("provisioner.drivers", req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	for _, d := range s.p.drivers.list() {
		page.Offer(paging.Key(d.GetProvisionerName(), d.GetEndpoint()), d)
	}
	drivers, next := page.Page()
	return &provisionerv1.ListDriversResponse{Drivers: drivers, NextPageToken: next}, nil
}

// ListOperations lists a page of the journaled operations in flight, by
// kind, then volume name.
func (s *server) ListOperations(ctx context.Context, req *provisionerv1.ListOperationsRequest) (*provisionerv1.ListOperationsResponse, error) {
	if uid := req.GetClaimUid(); uid != "" {
		if err := guard.CheckText("claim_uid", uid); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if strings.Contains(uid, "/") {
			return nil, status.Errorf(codes.InvalidArgument, "claim_uid %q is not a UID", uid)
		}
		op, err := s.p.claimOperation(ctx, uid)
		if err != nil {
			return nil, toStatus(err)
		}
		resp := &provisionerv1.ListOperationsResponse{}
		if op != nil {
			resp.Operations = append(resp.Operations, op)
		}
		return resp, nil
	}
	kind, driver, ns := req.GetKind(), req.GetDriver(), req.GetClaimNamespace()
	if kind != "" && kind != kindProvision && kind != kindDelete {
		return nil, status.Errorf(codes.InvalidArgument, "kind %q is not a kind of operation: use %s or %s, or leave it empty for both", kind, kindProvision, kindDelete)
	}
	if ns != "" {
		if err := guard.CheckName("claim_namespace", ns, guard.Namespace); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if err := guard.CheckText("driver", driver); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	page, err := newPage[*provisionerv1.Operation]("provisioner.operations", req.GetPageSize(), req.GetPageToken(),
		"kind", kind, "driver", driver, "claimNamespace", ns)
	if err != nil {
		return nil, err
	}
	ops, err := s.p.operations(ctx, kind)
	if err != nil {
		return nil, toStatus(err)
	}
	for _, op := range ops {
		if (driver != "" && op.GetProvisioner() != driver) || (ns != "" && op.GetClaimNamespace() != ns) {
			continue
		}
		page.Offer(paging.Key(op.GetKind(), op.GetVolumeName()), op)
	}
	items, next := page.Page()
	return &provisionerv1.ListOperationsResponse{Operations: items, NextPageToken: next}, nil
}

// newPage starts a page of a list, InvalidArgument for a bad size or token.
func newPage[T any](list string, size int32, token string, filters ...string) (*paging.Pager[T], error) {
	p, err := paging.New[T](list, size, token, filters...)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return p, nil
}

// validateProvision checks the request up front and decodes the objects
// it carries (nil when it carries none): they are hints, checked against
// the cache by UID and resourceVersion, and must at least name the
// request's claim.
func validateProvision(req *provisionerv1.ProvisionRequest) (*corev1.PersistentVolumeClaim, *storagev1.StorageClass, error) {
	var errs []string
	var claim *corev1.PersistentVolumeClaim
	var class *storagev1.StorageClass
	if err := guard.CheckName("claim_namespace", req.GetClaimNamespace(), guard.Namespace); err != nil {
		errs = append(errs, err.Error())
	}
	if err := guard.CheckName("claim_name", req.GetClaimName(), guard.ClaimName); err != nil {
		errs = append(errs, err.Error())
	}
	if err := guard.CheckText("claim_uid", req.GetClaimUid()); err != nil {
		errs = append(errs, err.Error())
	}
	if len(req.GetClaim()) > 0 {
		if req.GetClaimUid() == "" {
			errs = append(errs, "claim_uid is required with claim")
		}
		if c, err := kube.DecodeClaim(req.GetClaim()); err != nil {
			errs = append(errs, "claim: "+err.Error())
		} else if c.Namespace != req.GetClaimNamespace() || c.Name != req.GetClaimName() || string(c.UID) != req.GetClaimUid() {
			errs = append(errs, fmt.Sprintf("claim is %q/%q (uid %q), not the claim_namespace/claim_name/claim_uid of the request", c.Namespace, c.Name, c.UID))
		} else {
			claim = c
		}
	}
	if len(req.GetStorageClass()) > 0 {
		if sc, err := kube.DecodeStorageClass(req.GetStorageClass()); err != nil {
			errs = append(errs, "storage_class: "+err.Error())
		} else {
			class = sc
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.New(strings.Join(errs, "; "))
	}
	return claim, class, nil
}

// validateDeleteVolume checks a DeleteVolume request up front and decodes
// the volume it carries, nil when none: only its UID is compared with the
// API server's.
func validateDeleteVolume(req *provisionerv1.DeleteVolumeRequest) (*corev1.PersistentVolume, error) {
	if err := guard.CheckName("volume_name", req.GetVolumeName(), guard.VolumeName); err != nil {
		return nil, err
	}
	if len(req.GetVolume()) == 0 {
		return nil, nil
	}
	pv, err := kube.DecodeVolume(req.GetVolume())
	if err != nil {
		return nil, fmt.Errorf("volume: %w", err)
	}
	if pv.Name != req.GetVolumeName() {
		return nil, fmt.Errorf("volume_name %q does not match the volume's metadata.name %q", req.GetVolumeName(), pv.Name)
	}
	return pv, nil
}

// toStatus converts the provisioner's errors to gRPC codes.
func toStatus(err error) error {
	switch {
	case errors.Is(err, errNotServed), errors.Is(err, errRecreated):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errBadRecord):
		return status.Error(codes.Internal, err.Error())
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.Canceled, err.Error())
	default:
		// etcd or the API server could not be reached or refused: try again.
		return status.Error(codes.Unavailable, err.Error())
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
