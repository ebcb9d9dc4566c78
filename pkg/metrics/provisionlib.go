package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of sig-storage-lib-external-provisioner v13 (its
// controller/metrics package, subsystem "controller" as
// external-provisioner v6.3.0 creates it), with its names, help, labels and
// buckets, so that dashboards built for csi-provisioner read volplane's. As
// the library counts them, per attempt:
//   - provision: class is the claim's spec.storageClassName ("" when nil),
//     source its spec.dataSource.kind ("" when none); an attempt that made
//     the PersistentVolume is counted in _total and its time observed, any
//     other in _failed_total;
//   - delete: class is the PersistentVolume's spec.storageClassName; an
//     attempt that deleted the backing volume and the PersistentVolume is
//     counted in _total and its time observed, any other in _failed_total.
var (
	provisionTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "controller",
		Name:      "persistentvolumeclaim_provision_total",
		Help:      "Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
	}, []string{"class", "source"})
	provisionFailedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "controller",
		Name:      "persistentvolumeclaim_provision_failed_total",
		Help:      "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim.",
	}, []string{"class", "source"})
	provisionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: "controller",
		Name:      "persistentvolumeclaim_provision_duration_seconds",
		Help:      "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim.",
		Buckets:   prometheus.DefBuckets,
	}, []string{"class", "source"})
	deleteTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "controller",
		Name:      "persistentvolume_delete_total",
		Help:      "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
	}, []string{"class"})
	deleteFailedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "controller",
		Name:      "persistentvolume_delete_failed_total",
		Help:      "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
	}, []string{"class"})
	deleteSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: "controller",
		Name:      "persistentvolume_delete_duration_seconds",
		Help:      "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
		Buckets:   prometheus.DefBuckets,
	}, []string{"class"})
)

func init() {
	Registry.MustRegister(provisionTotal, provisionFailedTotal, provisionSeconds, deleteTotal, deleteFailedTotal, deleteSeconds)
}

// ProvisionAttempt counts one provisioning attempt of a claim of class
// and data source kind source, as the library's updateProvisionStats:
// one that made the PersistentVolume (ok) with its duration d, any other
// as failed.
func ProvisionAttempt(class, source string, ok bool, d time.Duration) {
	if !ok {
		provisionFailedTotal.WithLabelValues(class, source).Inc()
		return
	}
	provisionSeconds.WithLabelValues(class, source).Observe(d.Seconds())
	provisionTotal.WithLabelValues(class, source).Inc()
}

// DeleteAttempt counts one deletion attempt of a PersistentVolume of
// class, as the library's updateDeleteStats: one that deleted the
// backing volume and the PersistentVolume (ok) with its duration d, any
// other as failed.
func DeleteAttempt(class string, ok bool, d time.Duration) {
	if !ok {
		deleteFailedTotal.WithLabelValues(class).Inc()
		return
	}
	deleteSeconds.WithLabelValues(class).Observe(d.Seconds())
	deleteTotal.WithLabelValues(class).Inc()
}
