// Package standalone tests volplane's standalone mode end to end: the
// provisioner and the reclaimer run with --standalone beside
// kube-controller-manager's own PV binder (as on a managed cluster, where
// it cannot be turned off), no volplane binder runs, and every part is a
// real process: etcd, kube-apiserver, kube-controller-manager, the dev
// CSI driver, the watcher, two provisioner replicas and a reclaimer.
// TestSlowRetryAndMetricsParity starts a cluster of its own (one
// provisioner, with --retry-interval-max 5m and a --debug-address to
// scrape) to compare volplane with csi-provisioner v6.3.0 on an
// infeasible claim and on the library's metrics.
//
// It needs the pinned kube-apiserver and kube-controller-manager (`make
// kube-apiserver kube-controller-manager`, or VOLPLANE_KUBE_APISERVER and
// VOLPLANE_KUBE_CONTROLLER_MANAGER) and skips without them.
package standalone
