package dynamic

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// reclaimOf reads the reclaimer's record of a volume ("" state when it has
// none).
func reclaimOf(t *testing.T, volume string) *reclaimerv1.Reclaim {
	t.Helper()
	cc, err := cluster.e2e.Dial(cluster.reclaimerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := reclaimerv1.NewReclaimerServiceClient(cc).GetReclaim(t.Context(), &reclaimerv1.GetReclaimRequest{VolumeName: volume})
	if err != nil {
		return &reclaimerv1.Reclaim{Message: err.Error()}
	}
	return resp.Reclaim
}

// deleted waits until the PV object and the driver's volume are gone, and
// the reclaim SUCCEEDED with nothing left in either journal.
func deleted(t *testing.T, pv *corev1.PersistentVolume) {
	t.Helper()
	handle := pv.Spec.CSI.VolumeHandle
	e2e.Eventually(t, 30*time.Second, func() string {
		if got, err := cluster.client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{}); err == nil {
			return fmt.Sprintf("PV %s still there (%s, finalizers %v, deleting %v)", pv.Name, got.Status.Phase, got.Finalizers, got.DeletionTimestamp != nil)
		}
		if driverVolumes(t)[handle] {
			return "the driver still holds volume " + handle
		}
		if r := reclaimOf(t, pv.Name); r.State != reclaimerv1.State_STATE_SUCCEEDED {
			return fmt.Sprintf("reclaim %s: %s", r.State, r.Message)
		}
		return ""
	})
	if n := len(cluster.requests.deletesOf(handle)); n < 1 {
		t.Errorf("%d DeleteVolume calls for %s", n, handle)
	}
	noJournal(t, pv.Name)
}

// Delete removes the CSI volume through the provisioner, then the PV (its
// external-provisioner finalizer removed).
func TestReclaimDeletesTheCSIVolume(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "data", "1Gi", sc.Name)
	c, pv := bound(t, ns, "data")
	if !driverVolumes(t)[pv.Spec.CSI.VolumeHandle] {
		t.Fatalf("the driver has no volume %s", pv.Spec.CSI.VolumeHandle)
	}
	deleteClaim(t, c)
	deleted(t, pv)
	if r := reclaimOf(t, pv.Name); r.Method != reclaimerv1.Method_METHOD_PROVISIONER || r.Driver != driverName || !r.DataRemoved {
		t.Errorf("record %v", r)
	}
	if evs, _ := e2e.Events(cluster.client, "default", "PersistentVolume", pv.Name); len(evs) > 0 {
		t.Errorf("events on a cleanly deleted volume: %s: %s", evs[0].Reason, evs[0].Message)
	}
}

// A PV deleted first, while its claim still uses it, stays (Terminating,
// held by the finalizer); once the claim goes, the backing volume is
// deleted and the PV with it.
func TestReclaimDeletesAVolumeWhosePVWasDeletedFirst(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "data", "1Gi", sc.Name)
	c, pv := bound(t, ns, "data")
	if err := cluster.client.CoreV1().PersistentVolumes().Delete(t.Context(), pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Consistently(t, time.Second, func() string {
		got, err := cluster.client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{})
		if err != nil {
			return "the PV went while its claim uses it: " + err.Error()
		}
		if got.DeletionTimestamp == nil || !driverVolumes(t)[pv.Spec.CSI.VolumeHandle] {
			return "the PV is not Terminating, or its volume went"
		}
		return ""
	})
	deleteClaim(t, c)
	deleted(t, pv)
}

// A final driver error fails the volume with the driver's message
// (VolumeFailedDelete) and is retried with backoff until the driver
// recovers.
func TestReclaimRetriesDriverErrors(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "data", "1Gi", sc.Name)
	c, pv := bound(t, ns, "data")
	f := faults(t)
	f.FailNext("DeleteVolume", 2, codes.Internal, "disk is busy")
	deleteClaim(t, c)

	failed := e2e.VolumePhase(t, cluster.client, pv.Name, corev1.VolumeFailed, 30*time.Second)
	e2e.HasEvent(t, cluster.client, "default", "PersistentVolume", pv.Name, kube.EventVolumeFailedDelete, "disk is busy", kube.ControllerComponent, 30*time.Second)
	if r := reclaimOf(t, pv.Name); r.State != reclaimerv1.State_STATE_FAILED && r.State != reclaimerv1.State_STATE_RUNNING || r.NextAttemptTime == nil && r.State == reclaimerv1.State_STATE_FAILED {
		t.Errorf("record while failing: %v", r)
	}
	if failed.Status.Message == "" {
		t.Error("the Failed volume says nothing about why")
	}
	deleted(t, pv)
	if n := len(cluster.requests.deletesOf(pv.Spec.CSI.VolumeHandle)); n < 3 {
		t.Errorf("%d DeleteVolume calls, want the two failures and the success", n)
	}
}

// A driver that may still be deleting (Unavailable) is asked again; the
// volume stays Released meanwhile, with no Event.
func TestReclaimRetriesADriverStillWorking(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "data", "1Gi", sc.Name)
	c, pv := bound(t, ns, "data")
	f := faults(t)
	f.FailNext("DeleteVolume", 1, codes.Unavailable, "try later")
	deleteClaim(t, c)
	deleted(t, pv)
	evs, err := e2e.Events(cluster.client, "default", "PersistentVolume", pv.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Reason == kube.EventVolumeFailedDelete {
			t.Errorf("a transient error failed the volume: %s", e.Message)
		}
	}
}
