package reclaimer

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// TestDeleteWaitsForAGoneDiscoveredDriver: the provisioner lists a
// discovered driver whose volplane-csi-sidecars are gone (driver and
// provisioner names set, not ready) and answers DeleteVolume with
// IN_BACKGROUND. The reclaim is the provisioner's (never SKIPPED as
// another deleter's), stays journaled and is retried, and finishes once
// the driver is back.
func TestDeleteWaitsForAGoneDiscoveredDriver(t *testing.T) {
	const driver = "vendor.csi.example.com"
	gone := "CSI driver \"" + driver + "\" is not ready: no volplane-csi-sidecar of driver " + driver + " is registered; last seen 2026-12-06T22:00:00Z in pod vendor/ctrl-0"
	kc, j := newFakeCluster(), newFakeJournal()
	p := &fakeProvisioner{drivers: []*provisionerv1.Driver{{DriverName: driver, ProvisionerName: driver, Endpoint: "volplane-csi-sidecar: " + driver,
		Message: "no volplane-csi-sidecar of driver " + driver + " is registered"}}}
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, Message: gone}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	v := releasedPV("pvc-1", corev1.PersistentVolumeReclaimDelete, withCSI(driver), withProvisionedBy(driver))
	kc.addPV(v)
	rec := r.start(t, v)
	if rec.State != reclaimerv1.State_STATE_PENDING || rec.Method != reclaimerv1.Method_METHOD_PROVISIONER || rec.Driver != driver {
		t.Fatalf("a gone discovered driver's volume started as %v, want PENDING through the provisioner", rec)
	}
	rec = r.step(t, "pvc-1")
	if rec.State != reclaimerv1.State_STATE_RUNNING || !strings.Contains(rec.Message, "no volplane-csi-sidecar of driver "+driver) ||
		rec.NextAttemptTime == nil || j.len() != 1 {
		t.Fatalf("after the attempt: %v (journal %d), want RUNNING, journaled, retried, naming the driver", rec, j.len())
	}
	if got := kc.pv("pvc-1"); got == nil || got.Status.Phase != corev1.VolumeReleased {
		t.Errorf("volume %+v, want it kept Released while its driver is away", got)
	}
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	if rec = r.step(t, "pvc-1"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Errorf("once the driver is back: %v, want SUCCEEDED", rec)
	}
}
