package reclaimer

import (
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// The reclaimer's own work, on its --debug-address /metrics. Each replica
// counts what it carries out (the reclaims whose journal lock it holds),
// so sums over replicas are right.
var (
	reclaimsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_reclaimer_reclaims_total",
		Help: "Reclaims this replica carried out and ended, by reclaim policy (Delete, Recycle, Retain) and result: succeeded, cancelled (no longer needed: the volume is gone or bound again), or retained or skipped (the policy changed meanwhile to Retain, or to a Delete left to another deleter). A Released volume that needs nothing (Retain) is not counted.",
	}, []string{"policy", "result"})
	reclaimSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "volplane_reclaimer_reclaim_duration_seconds",
		Help:    "Time from the start of a reclaim (the volume Released and handed to the reclaimer) to its end, by policy and result (succeeded, cancelled).",
		Buckets: metrics.OperationBuckets,
	}, []string{"policy", "result"})
	reclaimFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_reclaimer_failures_total",
		Help: "Reclaim attempts that failed and turned the volume Failed (retried with backoff), by policy and the Event's reason (VolumeFailedDelete, VolumeFailedRecycle).",
	}, []string{"policy", "reason"})
	reclaimRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_reclaimer_retries_total",
		Help: "Reclaim steps retried after a backoff, by reason: in_use (a live claim or a pod still uses the volume), failed (the step failed, the volume is Failed), etcd (the journal could not be written), api (the API server refused or did not answer), provisioner (the provisioner or its driver did not finish the deletion), other.",
	}, []string{"reason"})
	recyclerPods = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_reclaimer_recycler_pods_total",
		Help: "Recycler pods, by what became of them: started, succeeded, failed (the pod failed or outlived its deadline).",
	}, []string{"result"})
	inProgressDesc = prometheus.NewDesc("volplane_reclaimer_reclaims_in_progress",
		"Reclaims this replica holds now (their journal lock is this replica's), by policy.", []string{"policy"}, nil)
)

// The reasons of volplane_reclaimer_retries_total.
const (
	retryInUse       = "in_use"
	retryFailed      = "failed"
	retryEtcd        = "etcd"
	retryAPI         = "api"
	retryProvisioner = "provisioner"
	retryOther       = "other"
)

func init() {
	metrics.Registry.MustRegister(reclaimsTotal, reclaimSeconds, reclaimFailures, reclaimRetries, recyclerPods, inProgress{})
}

// reporting is the controller whose reclaims in progress /metrics
// reports: one per process in production, the first in tests.
var reporting atomic.Pointer[controller]

type inProgress struct{}

func (inProgress) Describe(ch chan<- *prometheus.Desc) { ch <- inProgressDesc }

func (inProgress) Collect(ch chan<- prometheus.Metric) {
	c := reporting.Load()
	if c == nil {
		return
	}
	held := map[string]int{}
	c.mu.Lock()
	for _, e := range c.entries {
		if e.held {
			held[e.rec.Policy]++
		}
	}
	c.mu.Unlock()
	for p, n := range held {
		ch <- prometheus.MustNewConstMetric(inProgressDesc, prometheus.GaugeValue, float64(n), p)
	}
}

// stateName is a State as a label value: "succeeded", "cancelled", ...
func stateName(s reclaimerv1.State) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
}

// ended records a reclaim that ended in state at now.
func ended(r *reclaimerv1.Reclaim, state reclaimerv1.State, now time.Time) {
	reclaimsTotal.WithLabelValues(r.Policy, stateName(state)).Inc()
	if r.CreateTime == nil || state != reclaimerv1.State_STATE_SUCCEEDED && state != reclaimerv1.State_STATE_CANCELLED {
		return
	}
	d := now.Sub(r.CreateTime.AsTime())
	reclaimSeconds.WithLabelValues(r.Policy, stateName(state)).Observe(d.Seconds())
	if state == reclaimerv1.State_STATE_SUCCEEDED && r.Method == reclaimerv1.Method_METHOD_PROVISIONER {
		// kube-controller-manager's "delete" operation, end to end.
		metrics.VolumeOperationDone(r.Driver, metrics.OperationDelete, d)
	}
}

// failedStep is a step that failed and turned the volume Failed.
type failedStep struct{ msg string }

func (e failedStep) Error() string { return e.msg }

// retryReason classifies a failed step for volplane_reclaimer_retries_total.
func retryReason(err error) string {
	var refused *refusal
	var apiErr apierrors.APIStatus
	switch {
	case errors.As(err, &refused):
		return retryInUse
	case errors.As(err, new(failedStep)):
		return retryFailed
	case errors.Is(err, errJournal):
		return retryEtcd
	case errors.As(err, new(provisionerError)):
		return retryProvisioner
	case errors.As(err, &apiErr):
		return retryAPI
	}
	return retryOther
}

// provisionerError is a deletion the provisioner did not finish (it could
// not be reached, or its driver may still be working).
type provisionerError struct{ err error }

func (e provisionerError) Error() string { return e.err.Error() }
func (e provisionerError) Unwrap() error { return e.err }

// reportJournal sets the age of the oldest reclaim record.
func reportJournal(recs []coord.Record, now time.Time) {
	var oldest time.Duration
	for _, rec := range recs {
		r, err := reclaimjournal.Decode(rec)
		if err != nil || r.CreateTime == nil {
			continue
		}
		if age := now.Sub(r.CreateTime.AsTime()); age > oldest {
			oldest = age
		}
	}
	coord.ReportJournalAge(reclaimjournal.Kind, oldest)
}
