package e2e

import (
	"testing"

	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// A certificate of the services' CA is not a service credential: the real
// watcher, binder and reclaimer refuse every RPC to a name their table
// does not list (PermissionDenied, naming it and the RPC), and let the
// services that call each RPC through.
func TestServicesAuthorizeCallersByIdentity(t *testing.T) {
	t.Run("watcher", func(t *testing.T) {
		cluster.e2e.CheckCallers(t, cluster.watcherAddr, &watcherv1.WatcherService_ServiceDesc)
	})
	t.Run("binder", func(t *testing.T) {
		cluster.e2e.CheckCallers(t, cluster.binderAddr, &binderv1.BinderService_ServiceDesc)
	})
	t.Run("reclaimer", func(t *testing.T) {
		cluster.e2e.CheckCallers(t, cluster.reclaimerAddr, &reclaimerv1.ReclaimerService_ServiceDesc)
	})
}
