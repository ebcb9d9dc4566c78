// Package bench measures volplane against a local kube-apiserver: it starts
// the dev environment, runs the watcher and binder binaries as child
// processes, creates N volumes and then N claims, waits until every claim is
// Bound, and reports binds per second, create-to-Bound latency percentiles
// and the binder's peak memory and CPU time. In dynamic mode it runs the dev
// CSI driver and the provisioner as well, creates no volumes, and measures
// claims provisioned and Bound per second.
package bench
