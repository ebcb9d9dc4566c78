// Package metrics serves a service's Prometheus metrics and health
// (/readyz, /livez: pkg/health) on a debug HTTP address, and pprof profiles
// only when asked (Debug.Pprof, --enable-pprof). It registers, at init and
// under the names Kubernetes operators already know: client-go's work
// queue metrics (workqueue_depth, workqueue_adds_total, ..., labelled by
// queue name), client-go's REST client metrics (rest_client_*: request
// latency, results by code, rate-limiter waits), kube-controller-manager's
// volume_operation_total_seconds and _errors, and volplane_build_info.
//
// Registry remembers its collectors: Descs lists every metric registered,
// samples or not, so that docs/metrics.md is checked against it.
package metrics
