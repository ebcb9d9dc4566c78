// Package orphans is the provisioner's orphan scan: the backing volumes
// of each driver with LIST_VOLUMES that no PersistentVolume names and no
// journal record explains, and the PersistentVolumes whose volume the
// driver does not list (ListOrphans, DeleteOrphan,
// volplane_provisioner_orphans).
//
// Scan orders its reads (PVs, the drivers' volumes, the journal, PVs
// again) so that a volume being provisioned is never reported, and marks
// uncertain the volumes of a driver with provisionings in flight. What it
// needs of the provisioner is declared here: Drivers (their facts and
// ListVolumes/DeleteVolume) and Journal (provisionings in flight, PVs
// whose deletion is journaled); services/provisioner implements both and
// keeps the RPCs. The provisioner's README states the contract; its
// orphans_test.go tests the RPCs against the dev driver.
package orphans
