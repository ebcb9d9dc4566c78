package binder

import (
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/match"
)

// collector reports the cache as kube-controller-manager's PV collector
// does (same metric names), plus the binds this replica made.
type collector struct {
	c *controller
}

var (
	boundPVDesc = prometheus.NewDesc("pv_collector_bound_pv_count",
		"Gauge measuring number of persistent volume currently bound", []string{"storage_class"}, nil)
	unboundPVDesc = prometheus.NewDesc("pv_collector_unbound_pv_count",
		"Gauge measuring number of persistent volume currently unbound", []string{"storage_class"}, nil)
	boundPVCDesc = prometheus.NewDesc("pv_collector_bound_pvc_count",
		"Gauge measuring number of persistent volume claim currently bound", []string{"namespace", "storage_class"}, nil)
	unboundPVCDesc = prometheus.NewDesc("pv_collector_unbound_pvc_count",
		"Gauge measuring number of persistent volume claim currently unbound", []string{"namespace", "storage_class"}, nil)
	bindsDesc = prometheus.NewDesc("volplane_binder_binds_total",
		"Claims this binder replica bound to a volume.", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{boundPVDesc, unboundPVDesc, boundPVCDesc, unboundPVCDesc, bindsDesc} {
		ch <- d
	}
}

func (col collector) Collect(ch chan<- prometheus.Metric) {
	type nsClass struct{ ns, class string }
	boundPV, unboundPV := map[string]int{}, map[string]int{}
	boundPVC, unboundPVC := map[nsClass]int{}, map[nsClass]int{}
	s := col.c.store
	s.mu.RLock()
	for _, v := range s.volumes {
		if v.Status.Phase == corev1.VolumeBound {
			boundPV[v.Spec.StorageClassName]++
		} else {
			unboundPV[v.Spec.StorageClassName]++
		}
	}
	for _, c := range s.claims {
		k := nsClass{c.Namespace, match.ClaimClass(c)}
		if c.Status.Phase == corev1.ClaimBound {
			boundPVC[k]++
		} else {
			unboundPVC[k]++
		}
	}
	s.mu.RUnlock()
	for cls, n := range boundPV {
		ch <- prometheus.MustNewConstMetric(boundPVDesc, prometheus.GaugeValue, float64(n), cls)
	}
	for cls, n := range unboundPV {
		ch <- prometheus.MustNewConstMetric(unboundPVDesc, prometheus.GaugeValue, float64(n), cls)
	}
	for k, n := range boundPVC {
		ch <- prometheus.MustNewConstMetric(boundPVCDesc, prometheus.GaugeValue, float64(n), k.ns, k.class)
	}
	for k, n := range unboundPVC {
		ch <- prometheus.MustNewConstMetric(unboundPVCDesc, prometheus.GaugeValue, float64(n), k.ns, k.class)
	}
	ch <- prometheus.MustNewConstMetric(bindsDesc, prometheus.CounterValue, float64(col.c.bindsTotal.Load()))
}
