// Package metrics serves a service's Prometheus metrics, pprof profiles and
// health (/readyz, /livez: pkg/health) on a debug HTTP address, and gives client-go's work queues the metric
// names Kubernetes operators already know (workqueue_depth,
// workqueue_adds_total, workqueue_queue_duration_seconds, ...), labelled
// by queue name as in kube-controller-manager.
package metrics
