package reclaimer

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// libDeletes reads external-provisioner's deletion metrics of class from
// the registry /metrics serves: deleted, failed, and the duration
// histogram's count.
func libDeletes(t *testing.T, class string) (deleted, failed, observed float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if !hasLabel(m, "class", class) {
				continue
			}
			switch f.GetName() {
			case "controller_persistentvolume_delete_total":
				deleted = m.GetCounter().GetValue()
			case "controller_persistentvolume_delete_failed_total":
				failed = m.GetCounter().GetValue()
			case "controller_persistentvolume_delete_duration_seconds":
				observed = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return deleted, failed, observed
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// Each attempt at a Delete reclaim through the provisioner is counted as
// sig-storage-lib-external-provisioner counts external-provisioner's:
// controller_persistentvolume_delete_failed_total{class} per failed
// attempt (the driver failed, the volume stays), then
// controller_persistentvolume_delete_total{class} and one duration
// observation when the backing volume and the PV are gone. A step the
// guard refuses (a live claim still points at the volume) is no attempt.
func TestDeleteAttemptsAreCountedAsExternalProvisioner(t *testing.T) {
	const class = "metrics-delete"
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	r := newReplica(t, "me", kc, j, p, config{})
	v := releasedPV("pvc-m", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver),
		func(v *corev1.PersistentVolume) {
			v.Spec.StorageClassName = class
			v.Finalizers = []string{kube.FinalizerExternalProvisioner}
		})
	kc.addPV(v)
	r.start(t, v)
	want := func(when string, deleted, failed, observed float64) {
		t.Helper()
		if d, f, o := libDeletes(t, class); d != deleted || f != failed || o != observed {
			t.Fatalf("%s: delete_total %v, delete_failed_total %v, duration count %v; want %v, %v, %v", when, d, f, o, deleted, failed, observed)
		}
	}

	// A live claim (the released one, recreated with its UID) refuses it.
	kc.addPVC(claim("ns", "data", "claim-uid", ""))
	r.step(t, "pvc-m")
	want("refused by the guard", 0, 0, 0)
	kc.deletePVC("ns", "data")

	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, Message: "rpc error: code = Internal desc = disk busy"}, nil)
	r.step(t, "pvc-m")
	want("the driver failed", 0, 1, 0)

	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	if rec := r.step(t, "pvc-m"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Fatalf("after the retry: %v", rec)
	}
	want("deleted", 1, 1, 1)
}
