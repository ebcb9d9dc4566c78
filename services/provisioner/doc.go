// Package provisioner is volplane's provisioner service: it wraps CSI
// drivers (CreateVolume, DeleteVolume) for the binder and the reclaimer.
//
// Provision makes one attempt at a claim's volume (named from the claim's
// UID, so a retry finds the same volume) and its PersistentVolume;
// DeleteVolume deletes the backing volume of a Released or Failed volume
// with policy Delete that no live claim uses. Both read what they act on
// from the API server, journal the operation in etcd before calling the
// driver, and answer an outcome decided in one place (outcome.go).
// ListDrivers reports the drivers (name, version, capabilities, readiness
// from Probe); ListOperations the journal; GetCapacity the published
// CSIStorageCapacity objects; ListOrphans and DeleteOrphan the backing
// volumes nothing accounts for. The README states the contract, which
// pkg/conformance checks.
//
// Drivers are those of --csi-endpoint (a socket in the provisioner's pod)
// and, with --discover-sidecars, those served by volplane-csi-sidecars in
// the drivers' own pods (pkg/sidecar), found and checked at run time
// (discovery.go), called through the pool of their verified sidecars
// (sidecarpool.go), and remembered in etcd once seen (knowndrivers.go),
// so that a driver that goes away is listed not ready rather than
// forgotten (discovered.go).
package provisioner
