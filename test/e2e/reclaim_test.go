package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Retain touches nothing: the volume stays Released with its data, and the
// reclaimer says so.
func TestReclaimRetainKeepsTheData(t *testing.T) {
	n, cls, dir := ns(t), "reclaim-retain", t.TempDir()
	writeTree(t, filepath.Join(dir, "vol"), filepath.Join(dir, "outside"))
	before := entries(t, filepath.Join(dir, "vol"))
	createPV(t, n+"-pv", "1Gi", cls, withHostPath(filepath.Join(dir, "vol")))
	bindAndRelease(t, n, n+"-pv", cls)

	r := waitReclaim(t, reclaimerClient(t, cluster.reclaimerAddr), n+"-pv", reclaimerv1.State_STATE_RETAINED)
	if r.ClaimNamespace != n || r.ClaimName != "data" || r.Method != reclaimerv1.Method_METHOD_NONE {
		t.Errorf("record %v", r)
	}
	consistently(t, 2*time.Second, func() string {
		if v := getPV(t, n+"-pv"); v.Status.Phase != corev1.VolumeReleased || v.Spec.ClaimRef == nil {
			return "the retained volume changed: " + string(v.Status.Phase)
		}
		if got := entries(t, filepath.Join(dir, "vol")); !slices.Equal(got, before) {
			return "the retained data changed"
		}
		return ""
	})
}

// Node-local Recycle removes every entry (hidden files, nested
// directories, a symbolic link without following it), keeps the
// directory, makes the volume Available, and a new claim binds it.
func TestReclaimNodeLocalRecycle(t *testing.T) {
	n, cls, dir := ns(t), "reclaim-recycle", t.TempDir()
	vol, outside := filepath.Join(dir, "vol"), filepath.Join(dir, "outside")
	writeTree(t, vol, outside)
	createPV(t, n+"-pv", "1Gi", cls, withHostPath(vol), withPolicy(corev1.PersistentVolumeReclaimRecycle))
	bindAndRelease(t, n, n+"-pv", cls)

	v := pvPhase(t, n+"-pv", corev1.VolumeAvailable)
	if v.Spec.ClaimRef != nil || annotated(v.ObjectMeta, kube.AnnBoundByController) {
		t.Errorf("recycled volume keeps claimRef %+v or bound-by-controller", v.Spec.ClaimRef)
	}
	if got := entries(t, vol); len(got) != 0 {
		t.Errorf("left after the scrub: %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "not the volume's" {
		t.Errorf("the scrub followed a symbolic link: %q %v", b, err)
	}
	hasEvent(t, "default", "PersistentVolume", n+"-pv", kube.EventVolumeRecycled, "Volume recycled")
	r := waitReclaim(t, reclaimerClient(t, cluster.reclaimerAddr), n+"-pv", reclaimerv1.State_STATE_SUCCEEDED)
	if r.Method != reclaimerv1.Method_METHOD_NODE_LOCAL || !r.DataRemoved {
		t.Errorf("record %v", r)
	}

	createPVC(t, n, "next", "1Gi", cls)
	if c := pvcPhase(t, n, "next", corev1.ClaimBound); c.Spec.VolumeName != n+"-pv" {
		t.Errorf("the new claim bound %q", c.Spec.VolumeName)
	}
}

// A claim with the released claim's name that points at the volume (here
// it exists before the volume is released to it) is never scrubbed: the
// reclaimer refuses while it exists, and recycles once it is gone.
func TestReclaimNeverScrubsARecreatedClaim(t *testing.T) {
	n, cls, dir := ns(t), "reclaim-recreated", t.TempDir()
	vol := filepath.Join(dir, "vol")
	writeTree(t, vol, filepath.Join(dir, "outside"))
	before := entries(t, vol)
	createPVC(t, n, "data", "1Gi", cls, wantVolume(n+"-pv"))
	createPV(t, n+"-pv", "1Gi", cls, withHostPath(vol), withPolicy(corev1.PersistentVolumeReclaimRecycle),
		withClaimRef(n, "data", "uid-of-the-deleted-claim"), withAnnotation(kube.AnnBoundByController, "yes"))
	pvPhase(t, n+"-pv", corev1.VolumeReleased)

	client := reclaimerClient(t, cluster.reclaimerAddr)
	r := waitReclaim(t, client, n+"-pv", reclaimerv1.State_STATE_PENDING)
	eventually(t, 30*time.Second, func() string {
		resp, err := client.GetReclaim(t.Context(), &reclaimerv1.GetReclaimRequest{VolumeName: n + "-pv"})
		if err != nil || !strings.Contains(resp.Reclaim.Message, "asks for this volume") {
			return "not refused yet: " + r.String()
		}
		return ""
	})
	consistently(t, 3*time.Second, func() string {
		if got := entries(t, vol); !slices.Equal(got, before) {
			return "scrubbed while a claim points at the volume"
		}
		if v := getPV(t, n+"-pv"); v.Status.Phase != corev1.VolumeReleased || v.Spec.ClaimRef == nil {
			return "the volume changed: " + string(v.Status.Phase)
		}
		return ""
	})

	if err := cluster.client.CoreV1().PersistentVolumeClaims(n).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pvPhase(t, n+"-pv", corev1.VolumeAvailable)
	if got := entries(t, vol); len(got) != 0 {
		t.Errorf("left after the scrub: %q", got)
	}
}

// A static volume with policy Delete: nothing can delete it, so it goes
// Failed with Kubernetes' VolumeFailedDelete message: its PV controller
// tries its host_path deleter (which refuses paths outside /tmp; under
// /tmp it would remove the directory on its own node, which volplane does
// not do) and has no deleter for NFS.
func TestReclaimDeleteOfStaticHostPathFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  func(pv string) pvOpt
		want func(pv string) string
	}{
		{"hostPath outside /tmp", func(pv string) pvOpt { return withHostPath("/data/" + pv) },
			func(pv string) string {
				return "host_path deleter only supports /tmp/.+ but received provided /data/" + pv
			}},
		{"hostPath under /tmp", func(pv string) pvOpt { return withHostPath("/tmp/volplane-e2e/" + pv) },
			func(pv string) string {
				return "volplane does not run kube-controller-manager's test-only host_path deleter: delete /tmp/volplane-e2e/" + pv + " on its node by hand"
			}},
		{"NFS", func(string) pvOpt { return withNFS("nfs.example", "/exports/x") },
			func(pv string) string {
				return `error getting deleter volume plugin for volume "` + pv + `": no deletable volume plugin matched`
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, cls := ns(t), "reclaim-delete-static"
			pv := n + "-pv"
			createPV(t, pv, "1Gi", cls, withPolicy(corev1.PersistentVolumeReclaimDelete), tc.src(pv))
			createPVC(t, n, "data", "1Gi", cls, wantVolume(pv))
			pvcPhase(t, n, "data", corev1.ClaimBound)
			if err := cluster.client.CoreV1().PersistentVolumeClaims(n).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			want := tc.want(pv)
			v := pvPhase(t, pv, corev1.VolumeFailed)
			if v.Status.Message != want {
				t.Errorf("status message %q, want %q", v.Status.Message, want)
			}
			hasEvent(t, "default", "PersistentVolume", pv, kube.EventVolumeFailedDelete, want)
			r := waitReclaim(t, reclaimerClient(t, cluster.reclaimerAddr), pv, reclaimerv1.State_STATE_FAILED)
			if r.Method != reclaimerv1.Method_METHOD_UNSUPPORTED || r.Message != want {
				t.Errorf("record %v", r)
			}
		})
	}
}

// A Delete volume of a provisioner volplane does not serve stays Released,
// with no Event: its own deleter owns it.
func TestReclaimDeleteOfAnotherProvisionersVolumeIsSkipped(t *testing.T) {
	n, cls := ns(t), "reclaim-delete-other"
	createPV(t, n+"-pv", "1Gi", cls, withPolicy(corev1.PersistentVolumeReclaimDelete), withAnnotation(kube.AnnDynamicallyProvisioned, "example.com/other"))
	bindAndRelease(t, n, n+"-pv", cls)
	waitReclaim(t, reclaimerClient(t, cluster.reclaimerAddr), n+"-pv", reclaimerv1.State_STATE_SKIPPED)
	consistently(t, time.Second, func() string {
		if v := getPV(t, n+"-pv"); v.Status.Phase != corev1.VolumeReleased {
			return "phase " + string(v.Status.Phase)
		}
		return ""
	})
	list, err := cluster.client.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + n + "-pv"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) > 0 {
		t.Errorf("events about a volume of another provisioner: %s: %s", list.Items[0].Reason, list.Items[0].Message)
	}
}
