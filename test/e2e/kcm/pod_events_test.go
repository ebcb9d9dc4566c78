package kcm

import (
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// The check test/e2e's TestWaitForPodScheduled runs on volplane, on
// kube-controller-manager: it syncs claims every 15s, hence the longer
// wait per step.
func TestWaitForPodScheduled(t *testing.T) {
	e2e.CheckWaitForPodScheduled(t, client, e2e.Namespace(t, client), kube.ControllerComponent, time.Minute)
}
