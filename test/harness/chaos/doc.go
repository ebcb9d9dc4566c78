// Package chaos runs volplane as an operator would, then breaks it: every
// part a separate process (etcd, kube-apiserver, the dev CSI driver, 2
// watchers, 3 binders, 2 provisioners, 2 reclaimers and the gateway, all
// on mutual TLS, etcd over TLS with client certificates), a seeded storm of
// static PV/PVC pairs, dynamically provisioned claims and deletions while
// they bind and provision, and faults: a random replica killed with
// SIGKILL every few seconds (and started again, as a new member), etcd
// restarted once (each member in turn with three), the apiserver
// restarted once and the CSI driver killed once. Then it waits for the
// cluster to converge and checks the invariants of docs/chaos.md:
//
//   - no claim bound to two volumes, no volume to two claims;
//   - every live claim Bound;
//   - no CSI volume with neither a PV nor a journal record, no journal
//     record left, no volume of a deleted claim left (Delete), no Recycle
//     volume left Released or Failed;
//   - no data of a live claim deleted or scrubbed: a marker file written
//     into each volume while its claim is Bound must survive as long as
//     the claim;
//   - every binder replica's cache, read through its own ListClaims and
//     ListVolumes, equal to the API;
//   - no PersistentVolume seen by a watch moving from Released or Failed
//     straight back to Bound;
//   - no replica exiting on its own, and the time to converge after the
//     last fault.
//
// With Options.RebindReleased the binder's rebind of Released volumes is
// on for the run (docs/rebind.md), deleted claims are created again under
// their name, and every rebind a watch sees is checked against its rules
// (the same namespace/name, the policy, Retain and Released, no reclaim
// journaled before, the earlier claim's data kept, one claim per volume)
// and counted.
//
// StartCluster alone is the process-level cluster the crash tests use
// (with a fault point armed in one replica's environment, pkg/faultpoint).
// test/cmd/volplane-chaos (`make chaos`) and test/chaos (a short seeded run in
// `make test`) run Run.
package chaos
