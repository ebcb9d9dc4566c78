package dynamic

import (
	"testing"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// A certificate of the services' CA is not a service credential: the real
// provisioner refuses Provision, DeleteVolume, DeleteOrphan and the rest to
// a name its table does not list (PermissionDenied, naming it and the
// RPC), and lets the binder, the reclaimer and the gateway through to the
// RPCs each of them calls.
func TestProvisionerAuthorizesCallersByIdentity(t *testing.T) {
	cluster.e2e.CheckCallers(t, cluster.provisionerAddr, &provisionerv1.ProvisionerService_ServiceDesc)
}
