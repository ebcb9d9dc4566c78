package binder

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	"github.com/volplane/volplane/pkg/metrics"
)

// collector reports the cache as kube-controller-manager's PV collector
// does (same metric names and labels), plus the binds this replica made.
// It counts only the objects this replica owns (the ring of binder
// members: ownership.go), so that a sum over the replicas counts each
// object once; while the ring changes hands, an object may briefly be
// counted by no replica. It is registered once per process and reports
// the binder running in it (tests that run several in one process: the
// first).
type collector struct{}

// reporting is the binder the collector reports; nil before one runs.
var reporting atomic.Pointer[controller]

func init() {
	metrics.Registry.MustRegister(collector{}, retriesTotal, foreignBindsTotal, bindSeconds)
}

var (
	totalPVDesc = prometheus.NewDesc("pv_collector_total_pv_count",
		"Gauge measuring total number of persistent volumes", []string{"plugin_name", "volume_mode"}, nil)
	boundPVDesc = prometheus.NewDesc("pv_collector_bound_pv_count",
		"Gauge measuring number of persistent volume currently bound", []string{"storage_class"}, nil)
	unboundPVDesc = prometheus.NewDesc("pv_collector_unbound_pv_count",
		"Gauge measuring number of persistent volume currently unbound", []string{"storage_class"}, nil)
	boundPVCDesc = prometheus.NewDesc("pv_collector_bound_pvc_count",
		"Gauge measuring number of persistent volume claim currently bound", []string{"namespace", "storage_class", "volume_attributes_class"}, nil)
	unboundPVCDesc = prometheus.NewDesc("pv_collector_unbound_pvc_count",
		"Gauge measuring number of persistent volume claim currently unbound", []string{"namespace", "storage_class", "volume_attributes_class"}, nil)
	bindsDesc = prometheus.NewDesc("volplane_binder_binds_total",
		"Claims this binder replica bound to a volume.", nil, nil)
	pendingAgeDesc = prometheus.NewDesc("volplane_binder_oldest_pending_claim_seconds",
		"Age of the oldest claim this replica owns that is not Bound (Pending or Lost), by storage class; claims of a WaitForFirstConsumer class that no pod has been scheduled with yet are left out (Pending by design). Absent when there is none.", []string{"storage_class"}, nil)
)

// waitsForConsumer: a claim of a WaitForFirstConsumer class without a
// selected node, which stays Pending until the scheduler picks a node.
func waitsForConsumer(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim) bool {
	return class != nil && class.VolumeBindingMode != nil && *class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer &&
		claim.Annotations[kube.AnnSelectedNode] == "" && claim.Spec.VolumeName == ""
}

// bindSeconds is create-to-Bound: from a claim's creationTimestamp to the
// bind that made it Bound, observed by the replica that wrote it.
var bindSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "volplane_binder_claim_bind_duration_seconds",
	Help:    "Time from a claim's creation to its bind (phase Bound), by storage class and how its volume came: provisioned (the claim asked a provisioner) or existing (a volume that was there).",
	Buckets: metrics.OperationBuckets,
}, []string{"storage_class", "volume"})

// observeBound records that claim became Bound at now; a claim that asked
// a provisioner also counts as kube-controller-manager's "provision"
// operation (volume_operation_total_seconds), which its dashboards read.
func observeBound(claim *corev1.PersistentVolumeClaim, now time.Time) {
	d := now.Sub(claim.CreationTimestamp.Time)
	if claim.CreationTimestamp.IsZero() || d < 0 {
		return
	}
	how := "existing"
	p := claim.Annotations[kube.AnnStorageProvisioner]
	if p == "" {
		p = claim.Annotations[kube.AnnBetaStorageProvisioner]
	}
	if p != "" {
		how = "provisioned"
		metrics.VolumeOperationDone(p, metrics.OperationProvision, d)
	}
	bindSeconds.WithLabelValues(match.ClaimClass(claim), how).Observe(d.Seconds())
}

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{totalPVDesc, boundPVDesc, unboundPVDesc, boundPVCDesc, unboundPVCDesc, bindsDesc, pendingAgeDesc} {
		ch <- d
	}
}

// volumePlugin is the plugin_name of pv_collector_total_pv_count: the
// plugins kube-controller-manager's PV controller knows (host-path, nfs),
// a CSI volume as kubernetes.io/csi:<driver> (where kube-controller-manager,
// which holds no CSI plugin, says N/A), else N/A.
func volumePlugin(v *corev1.PersistentVolume) string {
	switch s := v.Spec.PersistentVolumeSource; {
	case s.CSI != nil:
		return kube.PluginCSI + ":" + s.CSI.Driver
	case s.HostPath != nil:
		return kube.PluginHostPath
	case s.NFS != nil:
		return kube.PluginNFS
	}
	return "N/A"
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	c := reporting.Load()
	if c == nil {
		return
	}
	type nsClass struct{ ns, class, vac string }
	type pluginMode struct{ plugin, mode string }
	total := map[pluginMode]int{}
	boundPV, unboundPV := map[string]int{}, map[string]int{}
	boundPVC, unboundPVC := map[nsClass]int{}, map[nsClass]int{}
	oldest := map[string]time.Time{}
	s := c.store
	s.mu.RLock()
	for _, v := range s.volumes {
		if !c.owns(volumeOwnerKey(v)) {
			continue
		}
		mode := corev1.PersistentVolumeFilesystem
		if v.Spec.VolumeMode != nil {
			mode = *v.Spec.VolumeMode
		}
		total[pluginMode{volumePlugin(v), string(mode)}]++
		if v.Status.Phase == corev1.VolumeBound {
			boundPV[v.Spec.StorageClassName]++
		} else {
			unboundPV[v.Spec.StorageClassName]++
		}
	}
	for key, cl := range s.claims {
		if !c.owns("pvc/" + key) {
			continue
		}
		k := nsClass{cl.Namespace, "", ""}
		// kube-controller-manager labels by spec.storageClassName as
		// written (empty when unset).
		if cl.Spec.StorageClassName != nil {
			k.class = *cl.Spec.StorageClassName
		}
		if cl.Spec.VolumeAttributesClassName != nil {
			k.vac = *cl.Spec.VolumeAttributesClassName
		}
		if cl.Status.Phase == corev1.ClaimBound {
			boundPVC[k]++
			continue
		}
		unboundPVC[k]++
		class := match.ClaimClass(cl)
		if waitsForConsumer(s.classes[class], cl) {
			continue // Pending by design until a pod using it is scheduled
		}
		if t, ok := oldest[class]; !ok || cl.CreationTimestamp.Time.Before(t) {
			oldest[class] = cl.CreationTimestamp.Time
		}
	}
	s.mu.RUnlock()
	for k, n := range total {
		ch <- prometheus.MustNewConstMetric(totalPVDesc, prometheus.GaugeValue, float64(n), k.plugin, k.mode)
	}
	for cls, n := range boundPV {
		ch <- prometheus.MustNewConstMetric(boundPVDesc, prometheus.GaugeValue, float64(n), cls)
	}
	for cls, n := range unboundPV {
		ch <- prometheus.MustNewConstMetric(unboundPVDesc, prometheus.GaugeValue, float64(n), cls)
	}
	for k, n := range boundPVC {
		ch <- prometheus.MustNewConstMetric(boundPVCDesc, prometheus.GaugeValue, float64(n), k.ns, k.class, k.vac)
	}
	for k, n := range unboundPVC {
		ch <- prometheus.MustNewConstMetric(unboundPVCDesc, prometheus.GaugeValue, float64(n), k.ns, k.class, k.vac)
	}
	now := time.Now()
	for cls, t := range oldest {
		ch <- prometheus.MustNewConstMetric(pendingAgeDesc, prometheus.GaugeValue, now.Sub(t).Seconds(), cls)
	}
	ch <- prometheus.MustNewConstMetric(bindsDesc, prometheus.CounterValue, float64(c.bindsTotal.Load()))
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
