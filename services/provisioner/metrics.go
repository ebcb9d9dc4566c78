package provisioner

import (
	"sync"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/volplane/volplane/pkg/metrics"
)

var (
	// outcomes counts how provisioning and deletion attempts ended.
	outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_provisioner_attempts_total",
		Help: "Provisioning and deletion attempts by operation (provision, delete) and outcome (FINISHED, IN_BACKGROUND, NO_CHANGE, RESCHEDULE).",
	}, []string{"operation", "outcome"})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() { metrics.Registry.MustRegister(outcomes) })
}

// newCSIMetrics is the CSI sidecars' own metrics manager (csi-lib-utils),
// one per driver since it labels every call with one driver name: its
// csi_sidecar_operations_seconds{driver_name,method_name,grpc_status_code}
// is external-provisioner's metric, so its dashboards and alerts work
// unchanged. /metrics serves its registry; the driver name is set once the
// driver has said who it is (driver.probe).
func newCSIMetrics() csimetrics.CSIMetricsManager {
	m := csimetrics.NewCSIMetricsManagerWithOptions("", csimetrics.WithProcessStartTime(false))
	metrics.AddGatherer(m.GetRegistry())
	return m
}
