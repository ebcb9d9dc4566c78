package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// kube-controller-manager's end-to-end volume operation metrics, with its
// names, labels and buckets: plugin_name is the provisioner (the
// StorageClass's, or the CSI driver of a volume), operation_name
// "provision" or "delete".
var (
	volumeOperationSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "volume_operation_total_seconds",
		Help:    "Storage operation end to end duration in seconds",
		Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"plugin_name", "operation_name"})
	volumeOperationErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volume_operation_total_errors",
		Help: "Total volume operation errors",
	}, []string{"plugin_name", "operation_name"})
)

// The operation_name values of the volume operation metrics.
const (
	OperationProvision = "provision"
	OperationDelete    = "delete"
)

// pluginName is kube-controller-manager's label value for an unknown
// plugin.
func pluginName(p string) string {
	if p == "" {
		return "N/A"
	}
	return p
}

// VolumeOperationDone records a volume operation of plugin that took d
// end to end (volume_operation_total_seconds).
func VolumeOperationDone(plugin, operation string, d time.Duration) {
	volumeOperationSeconds.WithLabelValues(pluginName(plugin), operation).Observe(d.Seconds())
}

// VolumeOperationFailed counts a failed attempt of a volume operation
// (volume_operation_total_errors).
func VolumeOperationFailed(plugin, operation string) {
	volumeOperationErrors.WithLabelValues(pluginName(plugin), operation).Inc()
}
