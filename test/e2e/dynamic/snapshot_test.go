package dynamic

import (
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// A claim restored from a VolumeSnapshot fails clearly while the snapshot
// CRDs are missing, and once they are installed (and the snapshot is ready)
// gets a volume with the snapshot's content.
func TestRestoreFromAVolumeSnapshot(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	_, src := bound(t, ns, "source")
	if err := os.WriteFile(filepath.Join(cluster.driver.VolumePath(src.Spec.CSI.VolumeHandle), "state.db"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}

	apiGroup := "snapshot.storage.k8s.io"
	restored := createClaim(t, ns, "restored", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "snap"}
	})
	hasEventFrom(t, restored, "ProvisioningFailed", "CRDs (snapshot.storage.k8s.io) are not installed", driverName)

	e2e.InstallSnapshotCRDs(t, dyn)
	snap, err := cluster.csi.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{SourceVolumeId: src.Spec.CSI.VolumeHandle, Name: "snapshot-" + string(src.UID)})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	handle := snap.GetSnapshot().GetSnapshotId()
	content := "snapcontent-" + ns
	e2e.ReadySnapshot(t, dyn, ns, "snap", "source", content, driverName, handle, nil)

	// The claim's retries (with backoff) now succeed.
	_, pv := bound(t, ns, "restored")
	reqs := cluster.requests.createsFor(pv.Name)
	if got := reqs[len(reqs)-1].GetVolumeContentSource().GetSnapshot().GetSnapshotId(); got != handle {
		t.Errorf("content source %v, want snapshot %s", reqs[len(reqs)-1].GetVolumeContentSource(), handle)
	}
	b, err := os.ReadFile(filepath.Join(cluster.driver.VolumePath(pv.Spec.CSI.VolumeHandle), "state.db"))
	if err != nil || string(b) != "v1" {
		t.Errorf("restored volume holds %q, %v", b, err)
	}
}
