package kcm

import (
	"testing"

	"github.com/volplane/volplane/test/harness/e2e"
)

// The in-tree, migrated and no-provisioner scenario test/e2e runs against
// volplane (TestInTreeFidelity), here against kube-controller-manager.
func TestInTree(t *testing.T) {
	e2e.InTree(t, client, e2e.Namespace(t, client))
}
