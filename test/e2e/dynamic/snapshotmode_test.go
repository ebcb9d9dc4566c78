package dynamic

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// --prevent-volume-mode-conversion, on by default as upstream: a claim
// restoring a snapshot as a volume of another mode than its source's is
// refused with external-provisioner's words and retried, nothing asked of
// the driver, until the VolumeSnapshotContent carries
// snapshot.storage.kubernetes.io/allow-volume-mode-change: "true". The dev
// driver makes no Block volumes, so the content says its source was Block
// and the claim is Filesystem (the API server's default).
func TestRestoreMayNotChangeTheVolumeMode(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	e2e.InstallSnapshotCRDs(t, dyn)
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	_, src := bound(t, ns, "source")
	if err := os.WriteFile(filepath.Join(cluster.driver.VolumePath(src.Spec.CSI.VolumeHandle), "disk.img"), []byte("raw blocks"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := cluster.csi.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{SourceVolumeId: src.Spec.CSI.VolumeHandle, Name: "snapshot-" + string(src.UID)})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	handle := snap.GetSnapshot().GetSnapshotId()
	content := "snapcontent-" + ns
	e2e.ReadySnapshot(t, dyn, ns, "snap", "source", content, driverName, handle, map[string]any{"sourceVolumeMode": "Block"})
	t.Cleanup(func() {
		_ = dyn.Resource(e2e.VolumeSnapshotContents).Delete(t.Context(), content, metav1.DeleteOptions{})
	})

	apiGroup := "snapshot.storage.k8s.io"
	restored := createClaim(t, ns, "mounted", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "snap"}
	})
	hasEventFrom(t, restored, kube.EventProvisioningFailed, fmt.Sprintf("error getting handle for DataSource Type VolumeSnapshot by Name snap: "+
		"requested volume %s/mounted modifies the mode of the source volume but does not have permission to do so. "+
		"snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent %s", ns, content), driverName)
	if reqs := cluster.requests.createsFor(pvName(restored)); len(reqs) != 0 {
		t.Fatalf("CreateVolume called for a refused restore: %v", reqs)
	}

	// The snapshot's owner allows it: the claim's retries succeed.
	obj, err := dyn.Resource(e2e.VolumeSnapshotContents).Get(t.Context(), content, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.SetAnnotations(map[string]string{"snapshot.storage.kubernetes.io/allow-volume-mode-change": "true"})
	if _, err := dyn.Resource(e2e.VolumeSnapshotContents).Update(t.Context(), obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, pv := bound(t, ns, "mounted")
	if pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		t.Errorf("PV volume mode %v, want Filesystem", pv.Spec.VolumeMode)
	}
	reqs := cluster.requests.createsFor(pv.Name)
	last := reqs[len(reqs)-1]
	if got := last.GetVolumeContentSource().GetSnapshot().GetSnapshotId(); got != handle {
		t.Errorf("content source %v, want snapshot %s", last.GetVolumeContentSource(), handle)
	}
	if last.GetVolumeCapabilities()[0].GetMount() == nil {
		t.Errorf("capabilities %v, want a mount", last.GetVolumeCapabilities())
	}
	if b, err := os.ReadFile(filepath.Join(cluster.driver.VolumePath(pv.Spec.CSI.VolumeHandle), "disk.img")); err != nil || string(b) != "raw blocks" {
		t.Errorf("restored volume holds %q, %v", b, err)
	}
}
