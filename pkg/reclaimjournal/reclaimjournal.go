// Package reclaimjournal is the journal record of a reclaim: one record per
// Released volume in pkg/coord's journal, written by the reclaimer replica
// that holds the reclaim's lock and read by anyone.
//
// The record is also the only journal of a Delete's backing volume: the
// reclaimer copies the PersistentVolume into it right before it asks the
// provisioner to delete the backing volume, and the provisioner, which
// journals nothing of its own for a deletion, finishes the deletion from
// that copy when the PersistentVolume is gone meanwhile. One logical
// operation, one record, one owner.
package reclaimjournal

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Kind is the kind of the reclaim records in pkg/coord's journal; each is
// named by its volume.
const Kind = "reclaim"

// DeletingMessage is a reclaim's message while it asks a provisioner to
// delete the backing volume; another message of a deletion in flight is
// the last attempt's error.
const DeletingMessage = "deleting the backing volume through the provisioner"

// Encode is the record's value.
func Encode(r *reclaimerv1.Reclaim) ([]byte, error) {
	b, err := proto.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode reclaim record of %s: %w", r.GetVolumeName(), err)
	}
	return b, nil
}

// Decode reads a record; its owner is whoever holds its lock now.
func Decode(rec coord.Record) (*reclaimerv1.Reclaim, error) {
	r := &reclaimerv1.Reclaim{}
	if err := proto.Unmarshal(rec.Value, r); err != nil {
		return nil, fmt.Errorf("decode reclaim record of %s: %w", rec.Name, err)
	}
	if r.VolumeName != rec.Name {
		return nil, fmt.Errorf("reclaim record %s names volume %q", rec.Name, r.VolumeName)
	}
	r.Owner = rec.Holder
	return r, nil
}

// Deleting returns the PersistentVolume whose backing volume the reclaim
// is deleting, as it was when the deletion began, and nil when no deletion
// is in flight: the reclaim is not a Delete through a provisioner, has not
// called it yet, is done with it, or has failed finally (a FAILED reclaim
// asks again only through its PersistentVolume, as Kubernetes does). A
// deletion that began and was then refused by the guard (PENDING: a claim
// points at the volume again) is still in flight: its driver may have
// acted.
func Deleting(r *reclaimerv1.Reclaim) (*corev1.PersistentVolume, error) {
	if r.GetMethod() != reclaimerv1.Method_METHOD_PROVISIONER || r.GetDataRemoved() ||
		r.GetState() == reclaimerv1.State_STATE_FAILED || len(r.GetDeletingVolume()) == 0 {
		return nil, nil
	}
	v, err := kube.DecodeVolume(r.GetDeletingVolume())
	if err != nil {
		return nil, fmt.Errorf("reclaim record of %s: the volume being deleted: %w", r.GetVolumeName(), err)
	}
	switch {
	case v.Name != r.GetVolumeName() || string(v.UID) != r.GetVolumeUid():
		return nil, fmt.Errorf("reclaim record of %s (uid %s) holds volume %s (uid %s)", r.GetVolumeName(), r.GetVolumeUid(), v.Name, v.UID)
	case v.Spec.CSI == nil:
		return nil, fmt.Errorf("reclaim record of %s: the volume being deleted is not a CSI volume", r.GetVolumeName())
	}
	return v, nil
}
