// Package reclaimer is volplane's reclaimer service: it carries out the
// reclaim policy of Released PersistentVolumes, as kube-controller-manager's
// PersistentVolume controller does, with the same phases and Events. The
// binder hands it every volume whose claim is gone (Reclaim, on every sync
// of a Released or Failed volume).
//
//   - Retain: nothing is touched; the volume stays Released (RETAINED).
//   - Delete of a volume whose CSI driver volplane's provisioner serves:
//     DeleteVolume through the provisioner, then the PersistentVolume object
//     is deleted and the external-provisioner finalizer removed. A volume
//     provisioned by a provisioner volplane does not serve is left to its own
//     deleter (SKIPPED, no Event). A volume nothing can delete (a static
//     hostPath volume) goes Failed with a VolumeFailedDelete Event.
//   - Recycle: the volume's contents are scrubbed, by a recycler pod (as
//     Kubernetes does) or, for hostPath and local volumes, by this process on
//     its own node; then the claimRef is cleared and the volume is Available.
//
// Safety: right before every destructive step (DeleteVolume, a scrub,
// creating a recycler pod, clearing the claimRef) the volume and the claims
// are read again from the API server, not a cache, and the step is refused
// while a live claim points at the volume (and, for Recycle, while a pod
// uses the released claim). See guard.
//
// Replicas: every reclaim that acts is journaled in etcd (pkg/coord's
// journal, kind "reclaim", one record per volume name) under a lock on the
// replica's lease, and every record write is fenced on that lock. Another
// replica asked for the same volume answers with the owner's state and does
// nothing. A replica that stops (or loses its lease) leaves its records
// without a holder; any replica, including a restarted one, takes them over
// (at start and every TakeoverPeriod) and resumes from the recorded step:
// a recycler pod that was created is watched, not created again; a backing
// volume that was deleted is not deleted again.
//
// Failures are retried with per-volume exponential backoff (client-go's work
// queue rate limiter); RetryReclaim retries a FAILED reclaim at once.
//
// With an OTLP endpoint, every attempt and its DeleteVolume, PV deletion,
// recycler pod or scrub are OpenTelemetry spans naming the volume and the
// UID of the claim it last served (trace.go); they are exported only, not
// kept for the claim timeline API, which cannot find a deleted claim.
package reclaimer
