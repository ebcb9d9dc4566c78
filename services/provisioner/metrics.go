package provisioner

import (
	"encoding/json"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/services/provisioner/orphans"
)

var (
	// outcomes counts how provisioning and deletion attempts ended.
	outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_provisioner_attempts_total",
		Help: "Provisioning and deletion attempts by operation (provision, delete) and outcome (FINISHED, IN_BACKGROUND, NO_CHANGE, RESCHEDULE).",
	}, []string{"operation", "outcome"})
	// failures counts provisioning attempts that failed, and where.
	failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_provisioner_failures_total",
		Help: "Provisioning attempts that failed (each with a ProvisioningFailed event), by provisioner, stage (before_call: the request could not be made, e.g. a secret is missing; create_volume: the driver's CreateVolume failed; save_volume: the volume was made but its PersistentVolume could not be saved) and gRPC code of the error (Unknown when it is not the driver's).",
	}, []string{"provisioner", "stage", "code"})
	// provisionSeconds is create-to-provisioned.
	provisionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "volplane_provisioner_claim_provision_duration_seconds",
		Help:    "Time from a claim's creation to the creation of its provisioned PersistentVolume, by provisioner, observed by the replica that created it.",
		Buckets: metrics.OperationBuckets,
	}, []string{"provisioner"})
)

func init() {
	metrics.Registry.MustRegister(outcomes, failures, provisionSeconds, orphans.Gauge)
}

// failed counts a failed provisioning attempt.
func failed(provisioner, stage string, err error) {
	failures.WithLabelValues(provisioner, stage, status.Code(err).String()).Inc()
	metrics.VolumeOperationFailed(provisioner, metrics.OperationProvision)
}

// Stages of volplane_provisioner_failures_total.
const (
	stageBeforeCall   = "before_call"
	stageCreateVolume = "create_volume"
	stageSaveVolume   = "save_volume"
)

// observeJournal sets the age of the oldest provisioning record.
func observeJournal(recs []coord.Record, now time.Time) {
	var oldest time.Duration
	for _, r := range recs {
		var op provisionOp
		if json.Unmarshal(r.Value, &op) != nil || op.Start.IsZero() {
			continue
		}
		if age := now.Sub(op.Start); age > oldest {
			oldest = age
		}
	}
	coord.ReportJournalAge(kindProvision, oldest)
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
