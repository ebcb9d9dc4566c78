// Package guard decides whether a PersistentVolume's data may be destroyed
// (its backing volume deleted, or its contents scrubbed), from the API
// server and never from an object a caller sent. The provisioner's
// DeleteVolume and the reclaimer's Reclaim, RetryReclaim and every
// destructive step of a reclaim ask it, so "may this volume's data go" has
// one answer in volplane:
//
//   - the volume is Released or Failed (never Available, Bound or Pending);
//   - its reclaim policy asks for the step (Delete for a deletion, Delete or
//     Recycle for a reclaim; Retain never destroys anything);
//   - no live claim points at it: the claim its claimRef names does not
//     exist, or exists with another UID than a claimRef UID that is set;
//     and no claim that is not being deleted asks for it by
//     spec.volumeName (a claim recreated under the old name, pre-bound to
//     the volume).
//
// Released is the weaker check for a step that destroys no data but gives
// the volume up (marking it Failed because nothing can delete or recycle
// it): the volume is released as kube-controller-manager's
// isVolumeReleased has it, so its claimRef's claim may still exist if it
// is bound to another volume.
//
// A refusal is a *Refusal whose Reason says why, for gRPC's
// FailedPrecondition; any other error is a failure to read the API.
package guard
