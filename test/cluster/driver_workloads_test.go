package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// vendorWorkloads are TestCluster's workloads of the vendor-deployed
// driver, in one namespace, each step building on the ones before.
type vendorWorkloads struct {
	ns, nonce string
	// keepPV and goneHandle are the Retain claim's PV and the Delete
	// claim's volume, for the steps after their claims are deleted.
	keepPV, keepHandle, goneHandle string
}

// The driver's classes and snapshot class (deploy/drivers/volplane-csi).
const (
	classImmediate = "volplane-csi-immediate"
	classWFFC      = "volplane-csi-wffc"
	classRetain    = "volplane-csi-retain"
	snapshotClass  = "volplane-csi-snapshots"
)

// statefulSet: two pods on claims of the WaitForFirstConsumer class, each
// writing its name; csi-provisioner made the volumes on the node the
// scheduler chose.
func (w *vendorWorkloads) statefulSet(t *testing.T) string {
	c.Apply(t, w.ns, statefulSet("web", classWFFC, w.nonce, 2))
	lines := readIDs(t, w.ns, "web", w.nonce, 2)
	for i := range 2 {
		pv, h := claimVolume(t, w.ns, fmt.Sprintf("data-web-%d", i))
		lines = append(lines, pv+"="+h)
	}
	return strings.Join(lines, "; ")
}

// snapshotRestore: a VolumeSnapshot of data-web-0 becomes ready (the
// snapshot controller and csi-snapshotter), and a claim restored from it
// reads web-0's data.
func (w *vendorWorkloads) snapshotRestore(t *testing.T) string {
	c.Apply(t, w.ns, fmt.Sprintf(`
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap}
spec:
  volumeSnapshotClassName: %s
  source: {persistentVolumeClaimName: data-web-0}
`, snapshotClass))
	waitFor(t, 2*time.Minute, func() string {
		out := c.Kubectl(t, "get", "volumesnapshot", "-n", w.ns, "snap", "-o",
			`jsonpath={.status.readyToUse} {.status.boundVolumeSnapshotContentName} {.status.error.message}`)
		if strings.HasPrefix(out, "true ") {
			return ""
		}
		return "snapshot not ready: " + out
	})
	content := c.Kubectl(t, "get", "volumesnapshot", "-n", w.ns, "snap", "-o", "jsonpath={.status.boundVolumeSnapshotContentName}")
	handle := c.Kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.status.snapshotHandle}")
	if !readDriverState(t).Snapshots[handle] {
		t.Errorf("the driver has no snapshot %s (content %s)", handle, content)
	}
	c.Apply(t, w.ns, claimManifest("restored", classWFFC, "10Mi", "VolumeSnapshot", "snap")+"---"+claimPod("restored", "restored", ""))
	got := readClaim(t, w.ns, "restored", "web-0 "+w.nonce)
	pv, h := claimVolume(t, w.ns, "restored")
	return fmt.Sprintf("snapshot %s ready; restored %s=%s, %s", handle, pv, h, got)
}

// clone: a claim whose data source is data-web-1 reads web-1's data.
func (w *vendorWorkloads) clone(t *testing.T) string {
	c.Apply(t, w.ns, claimManifest("clone", classWFFC, "10Mi", "PersistentVolumeClaim", "data-web-1")+"---"+claimPod("clone", "clone", ""))
	got := readClaim(t, w.ns, "clone", "web-1 "+w.nonce)
	pv, h := claimVolume(t, w.ns, "clone")
	return fmt.Sprintf("clone %s=%s, %s", pv, h, got)
}

// retainAndDelete: a claim of the Retain class and one of the Immediate
// (Delete) class, each written by its pod and read back.
func (w *vendorWorkloads) retainAndDelete(t *testing.T) string {
	c.Apply(t, w.ns, claimManifest("keep", classRetain, "10Mi", "", "")+"---"+claimPod("keep", "keep", "keep "+w.nonce)+
		"---"+claimManifest("gone", classImmediate, "10Mi", "", "")+"---"+claimPod("gone", "gone", "gone "+w.nonce))
	keep := readClaim(t, w.ns, "keep", "keep "+w.nonce)
	gone := readClaim(t, w.ns, "gone", "gone "+w.nonce)
	w.keepPV, w.keepHandle = claimVolume(t, w.ns, "keep")
	_, w.goneHandle = claimVolume(t, w.ns, "gone")
	for name, policy := range map[string]string{"keep": "Retain", "gone": "Delete"} {
		pv, _ := claimVolume(t, w.ns, name)
		if got := c.Kubectl(t, "get", "pv", pv, "-o", "jsonpath={.spec.persistentVolumeReclaimPolicy}"); got != policy {
			t.Errorf("claim %s's PV %s: reclaim policy %s, want %s", name, pv, got, policy)
		}
	}
	return fmt.Sprintf("Retain %s=%s, %s; Delete %s, %s", w.keepPV, w.keepHandle, keep, w.goneHandle, gone)
}

// expand: data-web-0 asks for 20Mi; csi-resizer expands the volume in the
// driver (the dev driver needs no node step) and the claim's capacity,
// the PV's and the driver's own record say 20Mi, while its pod runs on.
func (w *vendorWorkloads) expand(t *testing.T) string {
	return expandClaim(t, w.ns, "data-web-0", "web-0")
}

// expandClaim asks for 20Mi for claim (of 10Mi), used by pod, and waits
// until the claim's capacity, its PV's and the driver's record say 20Mi
// and the pod is still Ready.
func expandClaim(t *testing.T, ns, claim, pod string) string {
	c.Kubectl(t, "patch", "pvc", "-n", ns, claim, "-p", `{"spec":{"resources":{"requests":{"storage":"20Mi"}}}}`)
	pv, handle := claimVolume(t, ns, claim)
	var got string
	waitFor(t, 2*time.Minute, func() string {
		pvc, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		v, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), pv, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		bytes := readDriverState(t).Volumes[handle].CapacityBytes
		got = fmt.Sprintf("claim status %s, PV %s, driver %d bytes", capacity(pvc.Status.Capacity), capacity(v.Spec.Capacity), bytes)
		if capacity(pvc.Status.Capacity) == "20Mi" && capacity(v.Spec.Capacity) == "20Mi" && bytes == 20<<20 {
			return ""
		}
		return got
	})
	c.WaitPodReady(t, ns, pod, time.Minute)
	return got
}

// deleteClaims: the pods and claims of keep and gone go; gone's PV and
// the driver's volume go (Delete), keep's PV is Released and its volume
// and data stay (Retain).
func (w *vendorWorkloads) deleteClaims(t *testing.T) string {
	c.Kubectl(t, "delete", "pod", "-n", w.ns, "keep", "gone", "--wait=true")
	c.Kubectl(t, "delete", "pvc", "-n", w.ns, "keep", "gone", "--wait=true")
	waitFor(t, 2*time.Minute, func() string {
		st := readDriverState(t)
		if _, ok := st.Volumes[w.goneHandle]; ok {
			return "the Delete claim's volume " + w.goneHandle + " is still in the driver"
		}
		if _, err := os.Stat(filepath.Join(devDriverRoot, "volumes", w.goneHandle)); err == nil {
			return "the Delete claim's volume directory is still on the node"
		}
		// csi-provisioner deletes the volume, then the PV.
		if pv, ok := volumeHandles(t)[w.goneHandle]; ok {
			return "the Delete claim's PV " + pv + " is still there"
		}
		if p := pvPhase(t, w.keepPV); p != "Released" {
			return "the Retain claim's PV " + w.keepPV + " is " + p
		}
		return ""
	})
	if _, ok := readDriverState(t).Volumes[w.keepHandle]; !ok {
		t.Errorf("the Retain claim's volume %s is gone from the driver", w.keepHandle)
	}
	b, err := os.ReadFile(filepath.Join(devDriverRoot, "volumes", w.keepHandle, "id"))
	if err != nil || string(b) != "keep "+w.nonce {
		t.Errorf("the retained data on the node: %q, %v", b, err)
	}
	return fmt.Sprintf("Delete: volume %s gone; Retain: PV %s Released, volume %s kept, data %q", w.goneHandle, w.keepPV, w.keepHandle, b)
}

// swapAndBack rehearses the cutover's mechanics with no volplane: the
// csi-provisioner container's image is swapped to the same image named by
// its digest (a different reference, so a rollout, and the same
// csi-provisioner), a new claim provisions through it, and the image is
// swapped back. The lead's cutover swaps to volplane-csi-sidecar instead.
func (w *vendorWorkloads) swapAndBack(t *testing.T) string {
	before := driverContainers(t)
	var image string
	for _, r := range before {
		if r[0] == provisionerSidecar {
			image = r[1]
		}
	}
	byDigest := imageByDigest(t, image)
	_, swapped := swapProvisionerImage(t, byDigest)
	t.Logf("containers before and after the swap:\n%s", containersSideBySide(before, swapped))
	c.Apply(t, w.ns, claimManifest("after-swap", classImmediate, "10Mi", "", "")+"---"+claimPod("after-swap", "after-swap", "after-swap "+w.nonce))
	got := readClaim(t, w.ns, "after-swap", "after-swap "+w.nonce)
	_, back := swapProvisionerImage(t, image)
	if fmt.Sprint(back) != fmt.Sprint(before) {
		t.Errorf("after swapping back the containers are %v, want %v", back, before)
	}
	return fmt.Sprintf("%s -> %s -> back; provisioned while swapped: %s", image, byDigest, got)
}

// imageByDigest is the repo@sha256 reference the node reports for image
// (the kubelet's node status lists every name of an image).
func imageByDigest(t testing.TB, image string) string {
	t.Helper()
	nodes, err := c.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	repo := image[:strings.LastIndex(image, ":")]
	for _, n := range nodes.Items {
		for _, img := range n.Status.Images {
			tagged, digest := false, ""
			for _, name := range img.Names {
				tagged = tagged || name == image
				if strings.HasPrefix(name, repo+"@sha256:") {
					digest = name
				}
			}
			if tagged && digest != "" {
				return digest
			}
		}
	}
	t.Fatalf("no node lists %s by digest", image)
	return ""
}

// containersSideBySide is a table of two lists of containers.
func containersSideBySide(before, after [][]string) string {
	rows := [][]string{{"CONTAINER", "IMAGE BEFORE", "IMAGE AFTER", ""}}
	for i, b := range before {
		a, mark := "-", ""
		if i < len(after) {
			a = after[i][1]
		}
		if a != b[1] {
			mark = "changed"
		}
		rows = append(rows, []string{b[0], b[1], a, mark})
	}
	return table(rows)
}

// cleanup deletes every workload, snapshot and claim, then the retained
// PV (policy changed to Delete, as an administrator done with its data
// would): the driver ends with no volume and no snapshot, and no PV of
// the driver is left.
func (w *vendorWorkloads) cleanup(t *testing.T) string {
	c.Kubectl(t, "delete", "statefulset,pod", "--all", "-n", w.ns, "--wait=true")
	c.Kubectl(t, "delete", "volumesnapshot,pvc", "--all", "-n", w.ns, "--wait=false")
	c.Kubectl(t, "patch", "pv", w.keepPV, "-p", `{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
	waitFor(t, 3*time.Minute, func() string {
		st := readDriverState(t)
		handles := volumeHandles(t)
		contents, err := c.Run(t.Context(), "", "get", "volumesnapshotcontents", "-o", "name")
		if err != nil {
			return err.Error()
		}
		if left := len(st.Volumes) + len(st.Snapshots) + len(handles) + len(strings.Fields(contents)); left > 0 {
			return fmt.Sprintf("left: %d driver volumes, %d driver snapshots, %d PVs of the driver, VolumeSnapshotContents %q",
				len(st.Volumes), len(st.Snapshots), len(handles), contents)
		}
		return ""
	})
	return "no driver volume, snapshot, PV or VolumeSnapshotContent left"
}
