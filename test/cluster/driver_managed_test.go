package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// managed is the managed-cluster mode on the vendor's driver:
// kube-controller-manager's binder stays on throughout; volplane's
// provisioner, reclaimer and gateway run in standalone mode
// (deploy/overlays/standalone with the sidecar-drivers component, and
// one-node's for the cluster's one node; no binder); csi-provisioner's
// image is swapped to the sidecar's; a new claim provisions through the
// sidecar and kube-controller-manager binds it; its deletion deletes its volume (volplane's reclaimer); the image
// is swapped back and volplane's provisioner and reclaimer stopped; the
// driver's volumes match the PVs.
func (cu *vendorCutover) managed(t *testing.T) string {
	kcmBinderOff(t, false)
	start := time.Now()
	cu.standalone(t)
	installed := time.Since(start).Round(time.Second)
	before, after := swapProvisionerImage(t, cu.sidecarImage)
	t.Logf("managed mode: the driver's controller pod before and after the swap:\n%s", containersSideBySide(before, after))
	discovered := waitDiscovered(t)
	ns, n := cu.w.ns, cu.w.nonce
	c.Apply(t, ns, claimManifest("managed", classImmediate, "10Mi", "", "")+"---"+claimPod("managed", "managed", "managed "+n))
	got := readClaim(t, ns, "managed", "managed "+n)
	pv, h := claimVolume(t, ns, "managed")
	if m := managers(t, "pv", "", pv); slices.Contains(m, "csi-provisioner") {
		t.Errorf("PV %s was made by csi-provisioner: %v", pv, m)
	}
	claimManagers := managers(t, "pvc", ns, "managed")
	if !slices.Contains(claimManagers, "kube-controller-manager") {
		t.Errorf("claim managed was not bound by kube-controller-manager: managers %v", claimManagers)
	}
	c.Kubectl(t, "delete", "pod", "-n", ns, "managed", "--wait=true")
	c.Kubectl(t, "delete", "pvc", "-n", ns, "managed", "--wait=true")
	waitFor(t, 2*time.Minute, func() string {
		if _, ok := readDriverState(t).Volumes[h]; ok {
			return "claim managed's volume " + h + " is still in the driver"
		}
		if _, ok := volumeHandles(t)[h]; ok {
			return "claim managed's PV " + pv + " is still there"
		}
		return ""
	})
	deleted := logsMention(t, h)
	_, back := swapProvisionerImage(t, cu.provisionerImage)
	if fmt.Sprint(back) != fmt.Sprint(before) {
		t.Errorf("after swapping back the containers are %v, want %v", back, before)
	}
	c.Kubectl(t, "-n", volplaneNS, "scale", "deployment/volplane-provisioner", "statefulset/volplane-reclaimer", "--replicas=0")
	rows, problems := driverVolumesAgainstPVs(t)
	t.Logf("managed mode, swapped back: the driver's volumes against the PVs:\n%s", table(rows))
	for _, p := range problems {
		t.Error(p)
	}
	kcmBinderOff(t, false)
	return fmt.Sprintf("standalone Ready in %v; %s; %s; %s, %s=%s bound by kube-controller-manager (claim managers %v); deleted: volume and PV gone (%s); swapped back; %d driver volumes, %d problems",
		installed, changed(before, after), discovered, got, pv, h, claimManagers, deleted, len(rows)-1, len(problems))
}

// standalone applies deploy/overlays/standalone with the sidecar-drivers
// component (two provisioners: a real driver's volumes are not in the
// provisioner's pod) and the one-node component (etcd's members share the
// cluster's one node, as before) over the installed volplane, removes the
// binder's StatefulSet (at 0 since the rollback), and waits for every
// component.
func (cu *vendorCutover) standalone(t *testing.T) {
	dir := filepath.Join(cu.in.dir, "standalone")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeKustomization(t, dir, "resources: [%s]\ncomponents: [%s, %s]\nreplicas: [{name: volplane-provisioner, count: 2}]\n",
		"deploy/overlays/standalone", "deploy/components/sidecar-drivers", "deploy/components/one-node")
	c.Kubectl(t, "apply", "-k", dir)
	c.Kubectl(t, "-n", volplaneNS, "delete", "statefulset/volplane-binder", "--ignore-not-found", "--wait=true")
	for _, w := range []string{"deployment/volplane-provisioner", "statefulset/volplane-reclaimer", "deployment/volplane-gateway"} {
		c.Kubectl(t, "-n", volplaneNS, "rollout", "status", w, "--timeout=3m")
	}
	requireVolplaneReadyOf(t, maps(wantReplicas, "volplane-binder", 0))
	t.Logf("standalone: kubectl get pods -n %s -o wide:\n%s", volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
}
