// Package cluster tests volplane's local single-node cluster (make
// cluster: a kubelet, containerd, kube-proxy, CoreDNS and the control
// plane, all from pinned parts) and what runs in it.
//
// The tests need the running cluster: $VOLPLANE_CLUSTER_KUBECONFIG names
// its admin kubeconfig, $VOLPLANE_KUBECTL the kubectl to use (the cluster's
// version; "kubectl" on the PATH otherwise). Without a kubeconfig the
// package is skipped, but for TestInstallDocSteps (docs/install.md's
// steps parse). `make test-cluster-smoke` starts the cluster, runs
// TestSmoke and stops it, even when the test fails; `make test-cluster`
// does the same with TestCluster: the dev driver deployed as a vendor's
// chart does, volplane installed and cut over by docs/install.md's steps,
// workloads, faults, the defects of issue 24, the rollback and managed
// mode (volplane_test.go). `make test-cluster-multi` starts a cluster of
// three nodes (make cluster NODES=3) and runs TestMultiNode
// (multinode_test.go), which the other targets skip.
//
// The tests run on the cluster's node (they check hostPath volumes on the
// host's file system). The helpers in helpers_test.go (Cluster, kubectl,
// waitFor, a namespace per test) are meant for every test of the package.
package cluster

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// c is the cluster every test uses (set by TestMain).
var c *Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	kubeconfig := os.Getenv("VOLPLANE_CLUSTER_KUBECONFIG")
	if testing.Short() || kubeconfig == "" {
		// Only the check of docs/install.md's steps, which needs no cluster.
		fmt.Println("cluster: skipped: no cluster (make test-cluster, make test-cluster-smoke, or make cluster and set VOLPLANE_CLUSTER_KUBECONFIG); checking docs/install.md's steps only")
		if err := flag.Set("test.run", "^TestInstallDocSteps$"); err != nil {
			fmt.Fprintln(os.Stderr, "cluster:", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	}
	var err error
	c, err = NewCluster(kubeconfig, os.Getenv("VOLPLANE_KUBECTL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
	code := m.Run()
	c.Close()
	os.Exit(code)
}
