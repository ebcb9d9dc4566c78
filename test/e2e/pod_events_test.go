package e2e

import (
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// A WaitForFirstConsumer claim says WaitForFirstConsumer while no pod uses
// it, WaitForPodScheduled ("waiting for pod web to be scheduled") while a
// pod that uses it waits for the scheduler (none runs here), and
// WaitForFirstConsumer again once no such pod is left: the events
// kube-controller-manager gives (test/e2e/kcm runs the same check on it).
// The binder learns of pods from the watcher's KIND_POD stream and syncs
// the claim at once, so no step waits for a resync (10 minutes here).
func TestWaitForPodScheduled(t *testing.T) {
	e2e.CheckWaitForPodScheduled(t, cluster.client, ns(t), kube.ControllerComponent, 30*time.Second)
}
