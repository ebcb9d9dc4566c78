// Package nodedeploy tests distributed provisioning for node-local drivers
// (csi-provisioner's --node-deployment) end to end, in this process: a
// real kube-apiserver and etcd; three Node objects in zones a, b and c;
// per node, the dev CSI driver with its own state directory, its own node
// name and its own capacity, and volplane-csi-sidecar (csisidecar.Run)
// started with csi-provisioner's --node-deployment command line, as a
// DaemonSet's pod on that node would run them (the pods are Pod objects
// whose status the test sets: there is no kubelet); and volplane's
// watcher, binder, provisioner (--discover-sidecars) and reclaimer. The
// same claims then go through csi-provisioner v6.3.0 with
// --node-deployment in front of the same kind of drivers, with
// kube-controller-manager's binder, and the two runs are compared side by
// side (parity_test.go).
package nodedeploy

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/nodedeploy: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(m.Run())
}
