package provisioner

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// GetCapacity's errors (the options' are package capacity's test).
func TestCapacityRPCErrors(t *testing.T) {
	g := newGuarded(t)
	if _, err := g.s.GetCapacity(t.Context(), &provisionerv1.GetCapacityRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown driver: %v", err)
	}
	if _, err := g.s.GetCapacity(t.Context(), &provisionerv1.GetCapacityRequest{Name: "hostpath.csi.volplane.io"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("tracking off: %v", err)
	}
}
