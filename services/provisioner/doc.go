// Package provisioner is volplane's provisioner service: it wraps CSI
// drivers (CreateVolume, DeleteVolume) for the binder and the reclaimer.
//
// This release connects to the configured CSI drivers and reports them
// (ListDrivers: name, version, capabilities, readiness from Probe), and
// validates Provision and DeleteVolume requests; carrying them out through
// CreateVolume and DeleteVolume is the next step of the roadmap, and until
// then both answer Unimplemented.
package provisioner
