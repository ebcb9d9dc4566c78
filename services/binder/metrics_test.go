package binder

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
)

// Each replica reports the objects it owns only, so that a sum of the
// pv_collector_* gauges over the replicas counts every object once (with
// the whole cache each, two replicas reported every object twice).
func TestCacheGaugesSumOverReplicas(t *testing.T) {
	ring := coord.NewRing([]string{"binder-a", "binder-b"})
	class := "fast"
	fill := func(s *store) {
		for i := range 40 {
			v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pv-%d", i), UID: "u"},
				Spec:   corev1.PersistentVolumeSpec{StorageClassName: class},
				Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable}}
			if i%2 == 0 {
				v.Status.Phase = corev1.VolumeBound
			}
			s.putVolume(v)
			c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("c-%d", i), UID: "u",
				CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Minute))},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class}}
			if i%4 == 0 {
				c.Status.Phase = corev1.ClaimBound
			}
			s.putClaim(c)
		}
	}
	sums := map[string]float64{}
	for _, self := range []string{"binder-a", "binder-b"} {
		c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
		c.owns = func(key string) bool { return ring.Owner(key) == self }
		fill(c.store)
		reporting.Store(c)
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(collector{})
		mfs, err := reg.Gather()
		reporting.Store(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				v := m.GetGauge().GetValue()
				if mf.GetName() == "pv_collector_bound_pv_count" && v == 40/2 {
					t.Errorf("%s reports every bound volume: it does not own them all", self)
				}
				sums[mf.GetName()] += v
			}
		}
	}
	for name, want := range map[string]float64{
		"pv_collector_bound_pv_count":    20,
		"pv_collector_unbound_pv_count":  20,
		"pv_collector_total_pv_count":    40,
		"pv_collector_bound_pvc_count":   10,
		"pv_collector_unbound_pvc_count": 30,
	} {
		if sums[name] != want {
			t.Errorf("sum of %s over the replicas = %v, want %v", name, sums[name], want)
		}
	}
}

// A replica that owns nothing (no etcd session) reports no object.
func TestCacheGaugesOwnNothing(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
	c.owns = func(string) bool { return false }
	c.store.putVolume(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", UID: "u"}})
	reporting.Store(c)
	defer reporting.Store(nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collector{})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "volplane_binder_binds_total" {
			t.Errorf("%s reported by a replica that owns nothing", mf.GetName())
		}
	}
}

// Create-to-Bound is observed by class and by how the volume came; a
// provisioned claim also counts as kube-controller-manager's "provision"
// operation.
func TestObserveBound(t *testing.T) {
	class := "observe-bound"
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c",
		CreationTimestamp: metav1.NewTime(time.Now().Add(-3 * time.Second)),
		Annotations:       map[string]string{kube.AnnStorageProvisioner: "hostpath.csi.volplane.io"}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class}}
	observeBound(claim, time.Now())
	var m dto.Metric
	if err := bindSeconds.WithLabelValues(class, "provisioned").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() < 3 || h.GetSampleSum() > 60 {
		t.Errorf("create-to-Bound of a claim created 3s ago: %d samples, sum %v", h.GetSampleCount(), h.GetSampleSum())
	}
}

// The oldest Pending claim leaves out a WaitForFirstConsumer claim that no
// pod was scheduled with (Pending by design: an alert on it would fire
// forever), and counts it once a node is selected.
func TestOldestPendingLeavesOutWaitingForConsumer(t *testing.T) {
	wffc, immediate := storagev1.VolumeBindingWaitForFirstConsumer, storagev1.VolumeBindingImmediate
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
	c.store.putClass(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "late"}, VolumeBindingMode: &wffc})
	c.store.putClass(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "now"}, VolumeBindingMode: &immediate})
	claim := func(name, class string, ann map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "u", Annotations: ann,
			CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Hour))}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class}}
	}
	c.store.putClaim(claim("waits", "late", nil))
	c.store.putClaim(claim("stuck", "now", nil))
	ages := func() map[string]bool {
		reporting.Store(c)
		defer reporting.Store(nil)
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(collector{})
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, mf := range mfs {
			if mf.GetName() == "volplane_binder_oldest_pending_claim_seconds" {
				for _, m := range mf.GetMetric() {
					out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue() > 3000
				}
			}
		}
		return out
	}
	if got := ages(); !got["now"] || len(got) != 1 {
		t.Errorf("oldest pending by class %v, want only class now, an hour old", got)
	}
	c.store.putClaim(claim("waits", "late", map[string]string{kube.AnnSelectedNode: "node-1"}))
	if got := ages(); !got["now"] || !got["late"] {
		t.Errorf("oldest pending by class %v, want now and late (a node is selected: it should bind)", got)
	}
}
