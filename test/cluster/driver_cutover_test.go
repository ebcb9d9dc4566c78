package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// vendorCutover is TestCluster's cutover of the vendor-deployed driver
// to volplane-csi-sidecar by docs/install.md, its rollback and the
// managed mode, after the "before" workloads w.
type vendorCutover struct {
	w  *vendorWorkloads
	in *Install
	// provisionerImage is csi-provisioner's image, sidecarImage
	// volplane-csi-sidecar's.
	provisionerImage, sidecarImage string
	// The volumes csi-provisioner made before the cutover.
	preKeepPV, preKeepHandle, preGoneHandle string
	// made are the claims volplane provisioned and their volumes.
	made map[string]string
}

// newVendorCutover prepares docs/install.md's steps with the local
// cluster's settings: the overlay one-node (cluster-dev, whose etcd
// members may share the cluster's one node), the dev driver's
// controller Deployment as the driver to swap, a working directory of the
// cluster's state directory (the files the steps write stay there).
func newVendorCutover(t *testing.T, w *vendorWorkloads) *vendorCutover {
	dir := clusterDir()
	work := filepath.Join(dir, "install")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	in := newInstall(t, map[string]string{
		"PATH":            filepath.Dir(c.KubectlBin) + ":" + binDir(t) + ":" + os.Getenv("PATH"),
		"KUBECONFIG":      c.Kubeconfig,
		"OVERLAY":         filepath.Join(repoRoot(t), "deploy/overlays/one-node"),
		"DRIVERS":         driverNS + "/deployment/" + driverController,
		"VOLPLANE_CA_DIR": filepath.Join(dir, "volplane-ca"),
		"CLUSTER_CA":      filepath.Join(dir, "pki/ca.crt"),
		"KCM_MANIFEST":    filepath.Join(dir, "manifests/kube-controller-manager.yaml"),
		"CHECK_CLASS":     classImmediate,
	})
	in.dir = work
	return &vendorCutover{w: w, in: in, made: map[string]string{}}
}

// writeKustomization writes dir/kustomization.yaml: body, whose %s
// verbs are the tree's directories rel, each made relative to dir
// (kustomize takes no absolute path).
func writeKustomization(t testing.TB, dir, body string, rel ...string) {
	t.Helper()
	args := make([]any, len(rel))
	for i, r := range rel {
		p, err := filepath.Rel(dir, filepath.Join(repoRoot(t), r))
		if err != nil {
			t.Fatal(err)
		}
		args[i] = p
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + fmt.Sprintf(body, args...)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
}

// images reads csi-provisioner's image in the driver's pod and derives
// volplane-csi-sidecar's from the volplane image's tag (hack/cluster
// imports both, of the same VERSION).
func (cu *vendorCutover) images(t *testing.T) {
	for _, r := range driverContainers(t) {
		switch r[0] {
		case provisionerSidecar:
			cu.provisionerImage = r[1]
		case "volplane-csi":
			cu.sidecarImage = strings.Replace(r[1], "/volplane:", "/volplane-csi-sidecar:", 1)
		}
	}
	if cu.provisionerImage == "" || !strings.Contains(cu.sidecarImage, "volplane-csi-sidecar:") {
		t.Fatalf("no csi-provisioner image (%q) or no volplane image to derive the sidecar's from (%q)", cu.provisionerImage, cu.sidecarImage)
	}
}

// before: a Retain volume and a Delete volume that csi-provisioner makes,
// each written by its pod, for the cutover to find.
func (cu *vendorCutover) before(t *testing.T) string {
	cu.images(t)
	ns, n := cu.w.ns, cu.w.nonce
	c.Apply(t, ns, claimManifest("pre-keep", classRetain, "10Mi", "", "")+"---"+claimPod("pre-keep", "pre-keep", "pre-keep "+n)+
		"---"+claimManifest("pre-gone", classImmediate, "10Mi", "", "")+"---"+claimPod("pre-gone", "pre-gone", "pre-gone "+n))
	keep := readClaim(t, ns, "pre-keep", "pre-keep "+n)
	gone := readClaim(t, ns, "pre-gone", "pre-gone "+n)
	cu.preKeepPV, cu.preKeepHandle = claimVolume(t, ns, "pre-keep")
	goneOf, goneHandle := claimVolume(t, ns, "pre-gone")
	cu.preGoneHandle = goneHandle
	for _, pv := range []string{cu.preKeepPV, goneOf} {
		if m := managers(t, "pv", "", pv); !slices.Contains(m, "csi-provisioner") {
			t.Errorf("PV %s was not made by csi-provisioner: managers %v", pv, m)
		}
	}
	return fmt.Sprintf("by csi-provisioner: Retain %s=%s, %s; Delete %s=%s, %s", cu.preKeepPV, cu.preKeepHandle, keep, goneOf, goneHandle, gone)
}

// managers are the field managers of an object (kind, namespace, name).
func managers(t testing.TB, kind, ns, name string) []string {
	t.Helper()
	args := []string{"get", kind, name, "--show-managed-fields", "-o", `jsonpath={.metadata.managedFields[*].manager}`}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	return strings.Fields(c.Kubectl(t, args...))
}

// install runs docs/install.md's install (the overlay with the binder at
// 0, the certificates, the driver's grant) and waits for every component
// to be Ready, the binder at 0 replicas, while kube-controller-manager
// still binds and csi-provisioner still provisions.
func (cu *vendorCutover) install(t *testing.T) string {
	cu.images(t)
	cu.in.Setenv("SIDECAR_IMAGE", cu.sidecarImage)
	kcmBinderOff(t, false)
	cu.in.Run(t, "prerequisites")
	if out := cu.in.Run(t, "find-sidecars"); !strings.Contains(out, driverNS+"/Deployment/"+driverController+":") {
		t.Errorf("find-sidecars does not list %s/%s:\n%s", driverNS, driverController, out)
	}
	start := time.Now()
	cu.in.Run(t, "apply")
	cu.in.Run(t, "grant-sidecars")
	cu.in.Run(t, "rollout")
	want := maps(wantReplicas, "volplane-binder", 0)
	waitFor(t, 5*time.Minute, func() string { return volplaneNotReadyOf(t, want) })
	took := time.Since(start).Round(time.Second)
	t.Logf("kubectl get pods -n %s -o wide:\n%s", volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
	if got := c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "jsonpath={.items[*].spec.containers[*].name}"); strings.Contains(got, "csi") {
		t.Errorf("volplane-system runs a driver's container: %s", got)
	}
	kcmBinderOff(t, false)
	return fmt.Sprintf("cluster-dev + volplane-certs + the driver's grant: every component Ready in %v, binder at 0, no driver in %s, kube-controller-manager binds", took, volplaneNS)
}

// maps is m with key set to v (a copy).
func maps(m map[string]int, key string, v int) map[string]int {
	out := map[string]int{}
	for k, n := range m {
		out[k] = n
	}
	out[key] = v
	return out
}

// flip runs docs/install.md's flip: csi-provisioner's image swapped to
// the sidecar's, kube-controller-manager's binder off, volplane's on. It
// measures the window without a binder with a claim created as soon as
// kube-controller-manager's binder is off, and the window without a
// provisioner from the swap.
func (cu *vendorCutover) flip(t *testing.T) string {
	start := time.Now()
	at := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }
	rows := [][]string{{"AT", "EVENT"}, {"0s", "csi-provisioner's image swapped (swap-sidecars)"}}
	before, after := swapProvisionerImageBy(t, cu.sidecarImage, func() { cu.in.Run(t, "swap-sidecars") })
	t.Logf("the driver's controller pod before and after the swap:\n%s", containersSideBySide(before, after))
	rows = append(rows, []string{at(), "the driver's pods rolled out with the sidecar"})
	discovered := waitDiscovered(t)
	rows = append(rows, []string{at(), "every provisioner uses the sidecar"})
	off := time.Now()
	cu.in.Run(t, "kcm-binder-off")
	cu.in.Run(t, "kcm-wait")
	kcmBinderOff(t, true)
	c.Apply(t, cu.w.ns, claimManifest("at-flip", classImmediate, "10Mi", "", ""))
	rows = append(rows, []string{at(), "kube-controller-manager restarted without its binder; claim at-flip created"})
	cu.in.Run(t, "binder-on")
	rows = append(rows, []string{at(), "volplane's binder Ready (2 replicas)"})
	waitFor(t, 3*time.Minute, func() string {
		if p := claimPhase(t, cu.w.ns, "at-flip"); p != "Bound" {
			return "claim at-flip is " + p
		}
		return ""
	})
	window, noBinder := at(), time.Since(off).Round(100*time.Millisecond)
	rows = append(rows, []string{window, "claim at-flip Bound by volplane's binder"})
	t.Logf("the window without a binder (%v from kube-controller-manager's binder off) and without a provisioner (%s from the swap):\n%s",
		noBinder, window, table(rows))
	if m := managers(t, "pvc", cu.w.ns, "at-flip"); slices.Contains(m, "kube-controller-manager") {
		t.Errorf("claim at-flip was touched by kube-controller-manager: %v", m)
	}
	pv, h := claimVolume(t, cu.w.ns, "at-flip")
	cu.made["at-flip"] = h
	pvManagers := managers(t, "pv", "", pv)
	if slices.Contains(pvManagers, "csi-provisioner") {
		t.Errorf("PV %s was made by csi-provisioner: %v", pv, pvManagers)
	}
	requireVolplaneReady(t)
	return fmt.Sprintf("%s; %s; no binder for %v, no provisioner for %s; at-flip %s=%s, PV managers %v",
		changed(before, after), discovered, noBinder, window, pv, h, pvManagers)
}

// check runs docs/install.md's checks: the gateway lists the driver, and
// a claim of CHECK_CLASS binds.
func (cu *vendorCutover) check(t *testing.T) string {
	out := cu.in.Run(t, "gateway")
	if !strings.Contains(out, devDriverName) {
		t.Errorf("kubectl volplane drivers does not list %s:\n%s", devDriverName, out)
	}
	cu.in.Run(t, "check-claim")
	return "kubectl volplane drivers lists " + devDriverName + "; claim check Bound and explained"
}

// changed names the containers whose image differs.
func changed(before, after [][]string) string {
	var out []string
	for i := range before {
		if i < len(after) && before[i][1] != after[i][1] {
			out = append(out, fmt.Sprintf("%s: %s -> %s", before[i][0], before[i][1], after[i][1]))
		}
	}
	return fmt.Sprintf("%d of %d containers changed (%s)", len(out), len(before), strings.Join(out, ", "))
}

// claimPhase is a claim's phase.
func claimPhase(t testing.TB, ns, name string) string {
	t.Helper()
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(pvc.Status.Phase)
}

// waitDiscovered waits until every provisioner pod logged that it uses
// the dev driver's sidecar registration ("volplane-csi-sidecar
// registered"; "CSI driver discovered" comes only with a driver that etcd
// did not remember), and returns those lines.
func waitDiscovered(t *testing.T) string {
	var lines []string
	waitFor(t, 2*time.Minute, func() string {
		lines = nil
		var last string // the last line about a sidecar, for the failure
		pods := podsOf(t, "volplane-provisioner")
		for _, p := range pods {
			out, _ := c.Run(t.Context(), "", "logs", "-n", volplaneNS, p.Name)
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "sidecar") {
					last = p.Name + ": " + l
				}
				if strings.Contains(l, "volplane-csi-sidecar registered") && strings.Contains(l, "driver="+devDriverName) {
					lines = append(lines, p.Name+": "+l)
					break
				}
			}
		}
		if len(pods) == 0 || len(lines) < len(pods) {
			return fmt.Sprintf("%d of %d provisioner pods use a sidecar of %s (last: %s)", len(lines), len(pods), devDriverName, last)
		}
		return ""
	})
	t.Logf("the provisioners' logs:\n  %s", strings.Join(lines, "\n  "))
	return fmt.Sprintf("%d provisioners use the sidecar of %s", len(lines), devDriverName)
}

// volplaneNotReadyOf is volplaneNotReady with other replica counts of
// volplane's pods (the driver's as driverReplicas).
func volplaneNotReadyOf(t testing.TB, want map[string]int) string {
	missing := notReadyIn(t, volplaneNS, want)
	if d := notReadyIn(t, driverNS, driverReplicas); d != "" {
		missing = strings.TrimPrefix(missing+"; the driver: "+d, "; ")
	}
	return missing
}

// requireVolplaneReadyOf waits until want's pods are all Ready.
func requireVolplaneReadyOf(t testing.TB, want map[string]int) {
	t.Helper()
	waitFor(t, 5*time.Minute, func() string { return volplaneNotReadyOf(t, want) })
}

// dataKept: the pods made before the cutover read their data.
func (cu *vendorCutover) dataKept(t *testing.T) string {
	lines := readIDs(t, cu.w.ns, "web", cu.w.nonce, 2)
	for _, p := range []string{"pre-keep", "pre-gone"} {
		lines = append(lines, readClaim(t, cu.w.ns, p, p+" "+cu.w.nonce))
	}
	return strings.Join(lines, "; ")
}

// preVolumes: the claims csi-provisioner made before the cutover go;
// volplane deletes the Delete volume (csi-provisioner is no longer in the
// pod) and keeps the Retain one, its PV Released and its data on the node.
func (cu *vendorCutover) preVolumes(t *testing.T) string {
	c.Kubectl(t, "delete", "pod", "-n", cu.w.ns, "pre-keep", "pre-gone", "--wait=true")
	c.Kubectl(t, "delete", "pvc", "-n", cu.w.ns, "pre-keep", "pre-gone", "--wait=true")
	waitFor(t, 2*time.Minute, func() string {
		if _, ok := readDriverState(t).Volumes[cu.preGoneHandle]; ok {
			return "the Delete claim's volume " + cu.preGoneHandle + " is still in the driver"
		}
		if _, ok := volumeHandles(t)[cu.preGoneHandle]; ok {
			return "the Delete claim's PV is still there"
		}
		if p := pvPhase(t, cu.preKeepPV); p != "Released" {
			return "the Retain claim's PV " + cu.preKeepPV + " is " + p
		}
		return ""
	})
	if _, ok := readDriverState(t).Volumes[cu.preKeepHandle]; !ok {
		t.Errorf("the Retain claim's volume %s is gone from the driver", cu.preKeepHandle)
	}
	b, err := os.ReadFile(filepath.Join(devDriverRoot, "volumes", cu.preKeepHandle, "id"))
	if err != nil || string(b) != "pre-keep "+cu.w.nonce {
		t.Errorf("the retained data on the node: %q, %v", b, err)
	}
	return fmt.Sprintf("Delete: volume %s and its PV gone (%s); Retain: PV %s Released, volume kept, data %q",
		cu.preGoneHandle, logsMention(t, cu.preGoneHandle), cu.preKeepPV, b)
}

// logsMention names the volplane pods whose logs mention s.
func logsMention(t *testing.T, s string) string {
	var pods []string
	for _, app := range []string{"volplane-binder", "volplane-provisioner", "volplane-reclaimer"} {
		for _, p := range podsOf(t, app) {
			if out, err := c.Run(t.Context(), "", "logs", "-n", volplaneNS, p.Name); err == nil && strings.Contains(out, s) {
				pods = append(pods, p.Name)
			}
		}
	}
	return "logged by " + strings.Join(pods, ", ")
}

// provision: a new claim, a restore from the snapshot taken before the
// cutover and a clone of data-web-1 provision through the sidecar (PVs
// of the driver that csi-provisioner did not make) and read their data;
// the gateway lists the driver discovered.
func (cu *vendorCutover) provision(t *testing.T) string {
	ns, n := cu.w.ns, cu.w.nonce
	c.Apply(t, ns, claimManifest("new", classImmediate, "10Mi", "", "")+"---"+claimPod("new", "new", "new "+n)+
		"---"+claimManifest("restored-2", classWFFC, "10Mi", "VolumeSnapshot", "snap")+"---"+claimPod("restored-2", "restored-2", "")+
		"---"+claimManifest("clone-2", classWFFC, "10Mi", "PersistentVolumeClaim", "data-web-1")+"---"+claimPod("clone-2", "clone-2", ""))
	lines := []string{
		readClaim(t, ns, "new", "new "+n),
		readClaim(t, ns, "restored-2", "web-0 "+n),
		readClaim(t, ns, "clone-2", "web-1 "+n),
	}
	for _, claim := range []string{"new", "restored-2", "clone-2"} {
		pv, h := claimVolume(t, ns, claim)
		cu.made[claim] = h
		if m := managers(t, "pv", "", pv); slices.Contains(m, "csi-provisioner") {
			t.Errorf("claim %s's PV %s was made by csi-provisioner: %v", claim, pv, m)
		}
		lines = append(lines, claim+": "+pv+"="+h)
	}
	out := cu.in.Run(t, "gateway")
	if !strings.Contains(out, devDriverName) {
		t.Errorf("kubectl volplane drivers does not list %s:\n%s", devDriverName, out)
	}
	return strings.Join(lines, "; ") + "; kubectl volplane drivers lists " + devDriverName
}

// expand: csi-resizer, untouched, expands a claim volplane provisioned.
func (cu *vendorCutover) expand(t *testing.T) string {
	return "new: " + expandClaim(t, cu.w.ns, "new", "new")
}

// rollback: after docs/install.md's rollback of volplane (testCutover:
// volplane's binder, provisioner and reclaimer stopped once their
// operations are done, kube-controller-manager's binder on), its last
// step, csi-provisioner's image back; then csi-provisioner provisions a
// new claim.
func (cu *vendorCutover) rollback(t *testing.T) string {
	kcmBinderOff(t, false)
	start := time.Now()
	before, after := swapProvisionerImageBy(t, cu.provisionerImage, func() { cu.in.Run(t, "sidecars-back") })
	t.Logf("the driver's controller pod before and after the swap back:\n%s", containersSideBySide(before, after))
	took := time.Since(start).Round(time.Second)
	ns, n := cu.w.ns, cu.w.nonce
	c.Apply(t, ns, claimManifest("after-rollback", classImmediate, "10Mi", "", "")+"---"+claimPod("after-rollback", "after-rollback", "after-rollback "+n))
	got := readClaim(t, ns, "after-rollback", "after-rollback "+n)
	pv, _ := claimVolume(t, ns, "after-rollback")
	if m := managers(t, "pv", "", pv); !slices.Contains(m, "csi-provisioner") {
		t.Errorf("after the rollback, PV %s was not made by csi-provisioner: %v", pv, m)
	}
	return fmt.Sprintf("swapped back in %v; %s; csi-provisioner provisions again: %s", took, changed(before, after), got)
}

// rollbackDeletes: the claims volplane provisioned go, and csi-provisioner
// deletes their volumes; the driver's volumes match the PVs; the pods of
// before read their data.
func (cu *vendorCutover) rollbackDeletes(t *testing.T) string {
	ns := cu.w.ns
	var claims []string
	for claim := range cu.made {
		claims = append(claims, claim)
	}
	slices.Sort(claims)
	c.Kubectl(t, append([]string{"delete", "pod", "-n", ns, "--ignore-not-found", "--wait=true"}, claims...)...)
	c.Kubectl(t, append([]string{"delete", "pvc", "-n", ns, "--wait=true"}, claims...)...)
	waitFor(t, 2*time.Minute, func() string {
		vols, handles := readDriverState(t).Volumes, volumeHandles(t)
		for _, claim := range claims {
			h := cu.made[claim]
			if _, ok := vols[h]; ok {
				return fmt.Sprintf("claim %s's volume %s is still in the driver", claim, h)
			}
			if pv, ok := handles[h]; ok {
				return fmt.Sprintf("claim %s's PV %s is still there", claim, pv)
			}
		}
		return ""
	})
	rows, problems := driverVolumesAgainstPVs(t)
	t.Logf("after the rollback, the driver's volumes against the PVs:\n%s", table(rows))
	for _, p := range problems {
		t.Error(p)
	}
	lines := readIDs(t, ns, "web", cu.w.nonce, 2)
	return fmt.Sprintf("csi-provisioner deleted %d volumes volplane made (%s); %d driver volumes, %d problems; %s",
		len(claims), strings.Join(claims, ", "), len(rows)-1, len(problems), strings.Join(lines, "; "))
}

// cleanup gives the Retain volume of before the cutover back to the
// driver (policy Delete), then the workloads' cleanup.
func (cu *vendorCutover) cleanup(t *testing.T) string {
	c.Kubectl(t, "patch", "pv", cu.preKeepPV, "-p", `{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
	return cu.w.cleanup(t)
}
