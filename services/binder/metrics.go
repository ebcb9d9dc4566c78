package binder

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/match"
	"github.com/volplane/volplane/pkg/metrics"
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

// retriesTotal counts failed syncs retried with backoff, by reason.
var retriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "volplane_binder_retries_total",
	Help: "Syncs of a claim or volume that failed and were retried after the key's backoff, by reason.",
}, []string{"reason"})

// The reasons of retriesTotal.
const (
	reasonConflict    = "conflict"     // the cache was behind the API
	reasonReserved    = "reserved"     // another claim or replica holds the volume
	reasonSessionLost = "session_lost" // the etcd session ended mid-sync
	reasonEtcd        = "etcd"         // a reservation could not be written
	reasonUnavailable = "unavailable"  // the API server timed out, throttled or was unreachable
	reasonRefused     = "refused"      // the API server refused the write (invalid, forbidden)
	reasonReclaimer   = "reclaimer"    // the reclaimer could not be reached or refused
	reasonProvision   = "provisioning" // a provisioning call did not finish
	reasonOther       = "other"
)

// retryReason classifies a failed sync for retriesTotal.
func retryReason(err error) string {
	var netErr net.Error
	switch {
	case apierrors.IsConflict(err):
		return reasonConflict
	case errors.Is(err, errReserved):
		return reasonReserved
	case errors.Is(err, coord.ErrSessionLost):
		return reasonSessionLost
	case errors.Is(err, errReclaim):
		return reasonReclaimer
	case errors.Is(err, errEtcd):
		return reasonEtcd
	case apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err), apierrors.IsUnauthorized(err):
		return reasonRefused
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		return reasonUnavailable
	case errors.As(err, &netErr), errors.Is(err, context.DeadlineExceeded):
		// No answer from the API server: it could not be reached.
		return reasonUnavailable
	}
	return reasonOther
}

// registerRetries registers retriesTotal once per process.
var registerRetries = sync.OnceFunc(func() { metrics.Registry.MustRegister(retriesTotal) })
