package provisioner

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/volplane/volplane/pkg/timeline"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// GetClaimTimeline implements ProvisionerService: the steps this replica
// took for the claim, from its bounded timeline.
func (s *server) GetClaimTimeline(_ context.Context, req *provisionerv1.GetClaimTimelineRequest) (*provisionerv1.GetClaimTimelineResponse, error) {
	uid := req.GetClaimUid()
	if uid == "" || len(uid) > 128 || len(validation.IsValidLabelValue(uid)) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "claim_uid %q is not a claim UID", truncateUID(uid))
	}
	if s.p.timeline == nil {
		return nil, status.Error(codes.FailedPrecondition, "this provisioner records no timeline (started with --timeline=false)")
	}
	spans, dropped := s.p.timeline.Spans(uid)
	return &provisionerv1.GetClaimTimelineResponse{Spans: timeline.ToAPI(spans, Service, s.p.member), Dropped: int32(dropped)}, nil
}

func truncateUID(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
