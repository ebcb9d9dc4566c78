package dynamic

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

const finalizerSnapshotSource = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"

// readySnapshot takes a snapshot of claim source with the dev driver and
// creates its VolumeSnapshotContent and VolumeSnapshot name, ready to use,
// as the snapshot controller would.
func readySnapshot(t *testing.T, dyn dynamic.Interface, ns, name string, source *corev1.PersistentVolume) {
	t.Helper()
	snap, err := cluster.csi.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{SourceVolumeId: source.Spec.CSI.VolumeHandle, Name: "snapshot-" + ns + "-" + name})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	handle := snap.GetSnapshot().GetSnapshotId()
	content := "snapcontent-" + ns + "-" + name
	e2e.ReadySnapshot(t, dyn, ns, name, source.Spec.ClaimRef.Name, content, driverName, handle, nil)
}

func snapshotFinalizers(t *testing.T, dyn dynamic.Interface, ns, name string) ([]string, error) {
	t.Helper()
	u, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return u.GetFinalizers(), nil
}

// External-provisioner v6.2's snapshot-as-source protection: the
// VolumeSnapshot a claim is restored from carries
// provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection
// from before CreateVolume until the volume is provisioned, so deleting
// the snapshot mid-restore waits for the restore (which goes on); v6.3's
// sweeper removes a finalizer no Pending claim needs.
func TestSnapshotAsSourceProtection(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	e2e.InstallSnapshotCRDs(t, dyn)
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	_, src := bound(t, ns, "source")
	readySnapshot(t, dyn, ns, "snap", src)
	apiGroup := "snapshot.storage.k8s.io"
	restore := func(name string) *corev1.PersistentVolumeClaim {
		return createClaim(t, ns, name, "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "snap"}
		})
	}
	has := func(want bool) func() string {
		return func() string {
			f, err := snapshotFinalizers(t, dyn, ns, "snap")
			if err != nil || slices.Contains(f, finalizerSnapshotSource) != want {
				return fmt.Sprintf("snapshot finalizers %v (%v), want the snapshot-as-source one: %v", f, err, want)
			}
			return ""
		}
	}

	// Protected while the driver works on the restore, released after.
	f := faults(t)
	f.FailNext("CreateVolume", 2, codes.Unavailable, "restoring")
	restore("first")
	e2e.Eventually(t, 30*time.Second, has(true))
	bound(t, ns, "first")
	e2e.Eventually(t, 30*time.Second, has(false))

	// Deleted mid-restore: the snapshot waits, the restore finishes, then
	// the snapshot goes.
	f.FailNext("CreateVolume", 1000, codes.Unavailable, "restoring")
	second := restore("second")
	e2e.Eventually(t, 30*time.Second, has(true))
	e2e.Eventually(t, 30*time.Second, func() string {
		if f.Failed("CreateVolume") == 0 {
			return "CreateVolume not asked yet"
		}
		return ""
	})
	if err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Delete(t.Context(), "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		u, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Get(t.Context(), "snap", metav1.GetOptions{})
		if err != nil || u.GetDeletionTimestamp() == nil {
			return fmt.Sprintf("snapshot %v (%v), want it Terminating", u, err)
		}
		return ""
	})
	f.Clear("CreateVolume")
	_, pv := bound(t, ns, second.Name)
	reqs := cluster.requests.createsFor(pv.Name)
	if reqs[len(reqs)-1].GetVolumeContentSource().GetSnapshot() == nil {
		t.Errorf("the restore after the deletion asked for %v, want the snapshot", reqs[len(reqs)-1].GetVolumeContentSource())
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		if _, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Get(t.Context(), "snap", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the deleted snapshot is still there after its restore (%v)", err)
		}
		return ""
	})

	// A restore from a snapshot being deleted that no restore protects
	// (another finalizer holds it) is refused.
	readySnapshot(t, dyn, ns, "held", src)
	u, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Get(t.Context(), "held", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetFinalizers([]string{"example.io/hold"})
	if _, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if u, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Get(context.Background(), "held", metav1.GetOptions{}); err == nil {
			u.SetFinalizers(nil)
			_, _ = dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Update(context.Background(), u, metav1.UpdateOptions{})
		}
	})
	if err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Delete(t.Context(), "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	late := createClaim(t, ns, "late", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "held"}
	})
	hasEventFrom(t, late, kube.EventProvisioningFailed, fmt.Sprintf("VolumeSnapshot %s/held is being deleted", ns), driverName)
	if f, _ := snapshotFinalizers(t, dyn, ns, "held"); slices.Contains(f, finalizerSnapshotSource) {
		t.Errorf("a refused restore protected the snapshot: %v", f)
	}
}

// The sweeper removes a snapshot-as-source finalizer that no Pending claim
// needs (a provisioner stopped between setting and removing it, say), and
// keeps one a Pending restore still needs.
func TestOrphanedSnapshotFinalizerIsSwept(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	e2e.InstallSnapshotCRDs(t, dyn)
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	_, src := bound(t, ns, "source")
	readySnapshot(t, dyn, ns, "orphan", src)
	readySnapshot(t, dyn, ns, "needed", src)
	// "needed" has a Pending restore, created before the finalizers are
	// set (as a restore sets it): a class nobody serves leaves it Pending
	// for good.
	apiGroup := "snapshot.storage.k8s.io"
	createClaim(t, ns, "waiting", "1Gi", "nobody-serves-"+ns, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "needed"}
	})
	for _, name := range []string{"orphan", "needed"} {
		u, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.SetFinalizers(append(u.GetFinalizers(), finalizerSnapshotSource))
		if _, err := dyn.Resource(e2e.VolumeSnapshots).Namespace(ns).Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		f, err := snapshotFinalizers(t, dyn, ns, "orphan")
		if err != nil || slices.Contains(f, finalizerSnapshotSource) {
			return fmt.Sprintf("orphaned finalizer not swept: %v (%v)", f, err)
		}
		return ""
	})
	// The sweep that released "orphan" saw "needed" too (one list).
	if f, err := snapshotFinalizers(t, dyn, ns, "needed"); err != nil || !slices.Contains(f, finalizerSnapshotSource) {
		t.Errorf("the finalizer of a snapshot a Pending claim restores from was swept: %v (%v)", f, err)
	}
}
