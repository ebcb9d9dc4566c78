package provisioner

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/timeline"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// TestGetClaimTimeline: the spans of a claim by UID, marked with this
// service and replica; a UID that is not one is refused before the store
// is looked at.
func TestGetClaimTimeline(t *testing.T) {
	tl := timeline.New(10, 10, nil)
	s := &server{p: &provisioner{member: "p-1", timeline: tl}}
	_, step := tl.Start(context.Background(), "3f2c1e0a-1111-4000-8000-000000000001", "CreateVolume")
	step.EndErr(status.Error(codes.DeadlineExceeded, "driver slow"), "")
	tl.Add(context.Background(), "3f2c1e0a-1111-4000-8000-000000000001", "provision", time.Now().Add(-time.Second), time.Now(), "IN_BACKGROUND", "")

	resp, err := s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "3f2c1e0a-1111-4000-8000-000000000001"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetSpans()) != 2 || resp.Spans[0].GetName() != "provision" || resp.Spans[1].GetCode() != "DeadlineExceeded" ||
		resp.Spans[1].GetService() != "provisioner" || resp.Spans[1].GetMemberId() != "p-1" {
		t.Errorf("spans %v", resp.GetSpans())
	}
	if resp, err := s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "unknown"}); err != nil || len(resp.GetSpans()) != 0 {
		t.Errorf("unknown claim: %v %v", resp, err)
	}
	off := &server{p: &provisioner{member: "p-1"}}
	if _, err := off.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "3f2c1e0a-1111-4000-8000-000000000001"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("timeline off: %v, want FailedPrecondition", err)
	}
	for name, uid := range map[string]string{
		"empty":       "",
		"a path":      "../../etc",
		"a space":     "a b",
		"too long":    strings.Repeat("a", 129),
		"a newline":   "uid\n",
		"a long junk": strings.Repeat("é", 70),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: uid}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%q: %v, want InvalidArgument", uid, err)
			}
		})
	}
}
