// Package kcm runs volplane's fidelity checks (test/harness/e2e) against
// kube-controller-manager itself: the expectations the volplane tests
// assert are what the real PV controller does on the same objects.
//
// It needs the pinned kube-controller-manager (`make
// kube-controller-manager`, or VOLPLANE_KUBE_CONTROLLER_MANAGER) and skips
// without it.
package kcm

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

var client kubernetes.Interface

// findKCM returns the kube-controller-manager binary:
// $VOLPLANE_KUBE_CONTROLLER_MANAGER, else the Makefile's cache; "" when
// there is none.
func findKCM() string {
	if p := os.Getenv("VOLPLANE_KUBE_CONTROLLER_MANAGER"); p != "" {
		return p
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache")
	}
	p := filepath.Join(cache, "volplane", "kube-controller-manager-"+devenv.KubeVersion)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/kcm: skipped in -short mode")
		os.Exit(0)
	}
	bin := findKCM()
	if bin == "" {
		fmt.Println("e2e/kcm: skipped: no kube-controller-manager (make kube-controller-manager, or set VOLPLANE_KUBE_CONTROLLER_MANAGER)")
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
	// Only the PV controller, as volplane's binder replaces it.
	kcm, err := devenv.StartProcess(c.Dir(), "kube-controller-manager", bin,
		"--kubeconfig", c.Kubeconfig,
		"--controllers", "persistentvolume-binder-controller",
		"--kube-api-content-type", "application/vnd.kubernetes.protobuf",
		"--leader-elect=false", "--secure-port=0", "--v=2")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/kcm:", err)
		return 1
	}
	defer kcm.Stop()
	code := m.Run()
	if code != 0 {
		if b, err := os.ReadFile(kcm.LogPath); err == nil {
			const max = 64 << 10
			if len(b) > max {
				b = b[len(b)-max:]
			}
			fmt.Fprintf(os.Stderr, "---- kube-controller-manager log (last %d bytes) ----\n%s\n", len(b), b)
		}
	}
	return code
}
