package provisioner

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volplane/volplane/pkg/metrics"
)

var (
	// csiOperations is external-provisioner's own metric, with its name and
	// labels, so its dashboards and alerts work unchanged.
	csiOperations = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "csi_sidecar_operations_seconds",
		Help:    "Duration of CSI calls by driver, method and gRPC status code.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"driver_name", "method_name", "grpc_status_code"})
	// outcomes counts how provisioning and deletion attempts ended.
	outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_provisioner_attempts_total",
		Help: "Provisioning and deletion attempts by operation (provision, delete) and outcome (FINISHED, IN_BACKGROUND, NO_CHANGE, RESCHEDULE).",
	}, []string{"operation", "outcome"})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() { metrics.Registry.MustRegister(csiOperations, outcomes) })
}
