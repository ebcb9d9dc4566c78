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
package provisioner
