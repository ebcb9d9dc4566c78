// Package kcm runs the drop-in fidelity scenarios that test/e2e runs
// against volplane against kube-controller-manager's own PV binder, on
// the same kube-apiserver, so that every expectation there is upstream's
// behaviour: `make compare-kcm`. Skipped unless
// VOLPLANE_KUBE_CONTROLLER_MANAGER names the binary (make
// kube-controller-manager builds it).
package kcm

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/internal/devenv"
	"github.com/volplane/volplane/internal/e2e"
)

var client kubernetes.Interface

func TestMain(m *testing.M) {
	flag.Parse()
	bin := os.Getenv("VOLPLANE_KUBE_CONTROLLER_MANAGER")
	if testing.Short() || bin == "" {
		fmt.Println("e2e/kcm: skipped: set VOLPLANE_KUBE_CONTROLLER_MANAGER (make compare-kcm)")
		os.Exit(0)
	}
	os.Exit(run(m, bin))
}

func run(m *testing.M, bin string) int {
	c, err := e2e.StartCluster(context.Background(), "e2e/kcm", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/kcm:", err)
		return 1
	}
	defer c.Stop()
	client = c.Client
	// Only the PV binder, as kube-controller-manager runs it by default
	// (no --enable-hostpath-provisioner).
	kcm, err := devenv.StartProcess(c.Dir(), "kube-controller-manager", bin,
		"--kubeconfig", c.Kubeconfig, "--controllers", "persistentvolume-binder-controller",
		"--leader-elect=false", "--secure-port=0", "--v=2")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/kcm:", err)
		return 1
	}
	defer kcm.Stop()
	return m.Run()
}

func TestInTree(t *testing.T) {
	e2e.InTree(t, client, e2e.Namespace(t, client))
}
