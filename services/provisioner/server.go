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

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// server is the gRPC face of the provisioner: it validates requests and
// turns errors into status codes, here and nowhere else.
type server struct {
	provisionerv1.UnimplementedProvisionerServiceServer
	p *provisioner
}

// Provision makes one attempt at the claim's volume and says how it ended.
func (s *server) Provision(ctx context.Context, req *provisionerv1.ProvisionRequest) (*provisionerv1.ProvisionResponse, error) {
	claim, class, err := validateProvision(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if claim == nil {
		if claim, err = s.p.client.CoreV1().PersistentVolumeClaims(req.GetClaimNamespace()).Get(ctx, req.GetClaimName(), metav1.GetOptions{}); err != nil {
			return nil, apiStatus(err, "claim "+req.GetClaimNamespace()+"/"+req.GetClaimName())
		}
		if req.GetClaimUid() != "" && string(claim.UID) != req.GetClaimUid() {
			return nil, status.Errorf(codes.FailedPrecondition, "claim %s/%s has UID %s, not claim_uid %s: it was recreated", claim.Namespace, claim.Name, claim.UID, req.GetClaimUid())
		}
	}
	if class == nil {
		name := match.ClaimClass(claim)
		if name == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "claim %s/%s names no StorageClass: nothing to provision", claim.Namespace, claim.Name)
		}
		if class, err = s.p.client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, apiStatus(err, "StorageClass "+name)
		}
	}
	if want := match.ClaimClass(claim); want != class.Name {
		return nil, status.Errorf(codes.InvalidArgument, "storage_class is %q but the claim asks for class %q", class.Name, want)
	}
	res, err := s.p.provision(ctx, claim, class, false)
	if err != nil {
		return nil, toStatus(err)
	}
	outcomes.WithLabelValues(kindProvision, res.outcome.String()).Inc()
	out := &provisionerv1.ProvisionResponse{Outcome: res.outcome, VolumeName: VolumeName(s.p.prefix, claim), Message: res.message}
	if res.volume != nil {
		if out.Volume, err = kube.EncodeProto(res.volume); err != nil {
			return nil, status.Errorf(codes.Internal, "encode volume: %v", err)
		}
	}
	return out, nil
}

// DeleteVolume deletes a PV's backing volume (not the PV).
func (s *server) DeleteVolume(ctx context.Context, req *provisionerv1.DeleteVolumeRequest) (*provisionerv1.DeleteVolumeResponse, error) {
	if req.GetVolumeName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_name is required")
	}
	var pv *corev1.PersistentVolume
	var err error
	if len(req.GetVolume()) == 0 {
		if pv, err = s.p.client.CoreV1().PersistentVolumes().Get(ctx, req.GetVolumeName(), metav1.GetOptions{}); err != nil {
			return nil, apiStatus(err, "PersistentVolume "+req.GetVolumeName())
		}
	} else if pv, err = kube.DecodeVolume(req.GetVolume()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume: %v", err)
	}
	if pv.Name != req.GetVolumeName() {
		return nil, status.Errorf(codes.InvalidArgument, "volume_name %q does not match the volume's metadata.name %q", req.GetVolumeName(), pv.Name)
	}
	res, err := s.p.deleteVolume(ctx, pv)
	if err != nil {
		return nil, toStatus(err)
	}
	outcomes.WithLabelValues(kindDelete, res.outcome.String()).Inc()
	return &provisionerv1.DeleteVolumeResponse{Outcome: res.outcome, Message: res.message}, nil
}

// ListDrivers lists the configured CSI drivers as last probed.
func (s *server) ListDrivers(context.Context, *provisionerv1.ListDriversRequest) (*provisionerv1.ListDriversResponse, error) {
	return &provisionerv1.ListDriversResponse{Drivers: s.p.drivers.list()}, nil
}

// ListOperations lists the journaled operations in flight.
func (s *server) ListOperations(ctx context.Context, _ *provisionerv1.ListOperationsRequest) (*provisionerv1.ListOperationsResponse, error) {
	ops, err := s.p.operations(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &provisionerv1.ListOperationsResponse{Operations: ops}, nil
}

// validateProvision checks the request and decodes the objects it carries;
// a nil claim or class is to be read from the API.
func validateProvision(req *provisionerv1.ProvisionRequest) (*corev1.PersistentVolumeClaim, *storagev1.StorageClass, error) {
	var errs []string
	var claim *corev1.PersistentVolumeClaim
	var class *storagev1.StorageClass
	if req.GetClaimNamespace() == "" {
		errs = append(errs, "claim_namespace is required")
	}
	if req.GetClaimName() == "" {
		errs = append(errs, "claim_name is required")
	}
	if len(req.GetClaim()) > 0 {
		if req.GetClaimUid() == "" {
			errs = append(errs, "claim_uid is required with claim")
		}
		if c, err := kube.DecodeClaim(req.GetClaim()); err != nil {
			errs = append(errs, "claim: "+err.Error())
		} else if c.Namespace != req.GetClaimNamespace() || c.Name != req.GetClaimName() || string(c.UID) != req.GetClaimUid() {
			errs = append(errs, fmt.Sprintf("claim is %s/%s (uid %s), not the claim_namespace/claim_name/claim_uid of the request", c.Namespace, c.Name, c.UID))
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

// apiStatus turns an API server error reading what into a gRPC status.
func apiStatus(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.NotFound, "%s not found", what)
	case apierrors.IsForbidden(err):
		return status.Errorf(codes.PermissionDenied, "read %s: %v", what, err)
	default:
		return status.Errorf(codes.Unavailable, "read %s: %v", what, err)
	}
}

// toStatus converts the provisioner's errors to gRPC codes.
func toStatus(err error) error {
	switch {
	case errors.Is(err, errNotServed):
		return status.Error(codes.FailedPrecondition, err.Error())
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
