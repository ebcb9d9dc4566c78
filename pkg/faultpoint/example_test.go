package faultpoint_test

import "github.com/volplane/volplane/pkg/faultpoint"

// A step that must survive a crash right after it: run the process with
// VOLPLANE_FAULTPOINT=provisioner/after-create-volume and it exits with
// status 86 here; without the variable the line costs a nil check.
func ExampleHit() {
	// ... CreateVolume succeeded ...
	faultpoint.Hit(faultpoint.ProvisionerAfterCreateVolume)
	// ... create the PersistentVolume ...
}
