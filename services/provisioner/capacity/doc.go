// Package capacity is the provisioner's storage capacity tracking
// (--enable-capacity): for every driver with the GET_CAPACITY controller
// capability, one CSIStorageCapacity object per topology segment and
// StorageClass, of the shape external-provisioner publishes, so the
// scheduler places the pods of WaitForFirstConsumer claims where their
// volumes fit.
//
// A Controller syncs a driver at a time: it computes the objects the
// driver should have (its classes in every segment of a node where it is
// installed), asks GetCapacity for each, and creates, updates or deletes
// objects to match. Only the replica holding the etcd reservation
// capacity/<driver> writes. What it needs of the provisioner (its drivers,
// their nodes' segments) is the Drivers interface, declared here;
// services/provisioner implements it and serves GetCapacity from
// Published. The provisioner's README states the contract.
package capacity
