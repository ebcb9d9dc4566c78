// Package bench measures volplane against a local control plane. Every
// run starts its own etcd (volplane-etcd) and kube-apiserver as processes,
// then what binds: volplane's watcher and binder (and, for dynamic
// provisioning, the dev CSI driver and the provisioner) as processes,
// kube-controller-manager's PV binder (with csi-provisioner when dynamic)
// for comparison, or the ceiling, a bare client doing only a bind's API
// writes (ceiling.go). It creates the run's volumes (static), then the
// measured claims, and times each from its create to the first watch
// event that shows it Bound.
//
// The measured claims arrive as a burst, all created at once from Clients
// goroutines (binds/s and latency; burst.go), or open loop at a fixed rate
// whatever the binds do (latency per rate; rate.go). compare.go
// interleaves bursts of the binder and of the ceiling, A/B/A/B on fresh
// control planes. existing.go pre-creates a large population of Bound and
// Available volumes before the services start. delete.go measures a burst
// of deletions instead (--dynamic --delete): the claims of N provisioned
// volumes deleted at once, each timed until its PersistentVolume is gone,
// the run until the dev CSI driver holds no volume.
//
// Every run reports each process's peak RSS and CPU time (usage.go, from
// /proc) and what the apiserver and etcd served per claim, from their
// /metrics read before and after the measured phase (metrics.go). With
// ProfileDir, what binds and kube-apiserver are CPU-profiled during the
// measured phase, and a burst ends with each profiled process's CPU per
// claim split by cause and by caller (causes.go).
package bench
