package binder

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// handOff is how handing a Released volume to the reclaimer ended.
type handOff int

const (
	// handOffTaken: the reclaimer has the volume (or has nothing to do
	// with it, e.g. Retain).
	handOffTaken handOff = iota
	// handOffRefused: the reclaimer refused for the state of the volume
	// or of its claims (a live claim still points at it, it is no longer
	// Released, it is gone or was recreated). Asking again changes nothing
	// until that state does: the volume is handed over again when it or
	// its claim changes (watch events) and at the resync, never in a
	// backoff loop.
	handOffRefused
	// handOffRetry: no answer, or a failure that may pass by itself (the
	// reclaimer or its etcd unreachable, a timeout, the binder's cache
	// stale): retried with the volume's backoff.
	handOffRetry
)

// decideHandOff decides, in this one place, what the reclaimer's answer
// to Reclaim means. FailedPrecondition is gRPC's "do not retry until the
// system's state is fixed", which is what the reclaimer answers for every
// refusal of state (services/reclaimer's README); any other error may pass.
func decideHandOff(err error) handOff {
	if err == nil {
		return handOffTaken
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.FailedPrecondition {
		return handOffRefused
	}
	return handOffRetry
}

// refusals are the volumes whose last hand-off the reclaimer refused, with
// its reason: a change of their claim hands them over again, and a
// refusal is logged at info only when its reason is new.
type refusals struct {
	mu     sync.Mutex
	reason map[string]string // volume name → why
}

// note records a refusal and reports whether its reason is new.
func (r *refusals) note(volume, why string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reason == nil {
		r.reason = map[string]string{}
	}
	old, ok := r.reason[volume]
	r.reason[volume] = why
	return !ok || old != why
}

// forget drops a volume's refusal: handed over, or gone.
func (r *refusals) forget(volume string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.reason, volume)
}

// has reports whether the volume's last hand-off was refused.
func (r *refusals) has(volume string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.reason[volume]
	return ok
}

// handOffKey is what a hand-off was about: the volume object, the claim it
// was released from and its policy. A change of any of them is a new
// release, handed over again at once.
type handOffKey struct {
	volumeUID, claimUID types.UID
	policy              corev1.PersistentVolumeReclaimPolicy
}

// keyOf is the hand-off key of a Released (or Failed) volume.
func keyOf(v *corev1.PersistentVolume) handOffKey {
	k := handOffKey{volumeUID: v.UID, policy: v.Spec.PersistentVolumeReclaimPolicy}
	if v.Spec.ClaimRef != nil {
		k.claimUID = v.Spec.ClaimRef.UID
	}
	return k
}

// handedOver are the volumes the reclaimer took, so that the volume's
// next changes (Released, Failed, the finalizer removed, Terminating: each
// a watch event and a sync) do not hand it over again: one Reclaim call
// per release. The reclaimer journals a reclaim that acts before it
// answers, so a taken volume is finished (or taken over) without the
// binder; a failed call is not remembered and is retried with backoff.
// A hand-off is remembered for ttl (the resync period; 0: until the
// volume or its release changes), so the resync still hands every
// Released volume over once per period, the safety net for a record the
// reclaimer kept in memory only (Retain, a volume no driver served yet).
type handedOver struct {
	mu  sync.Mutex
	ttl time.Duration
	at  map[string]handOffEntry // volume name → its last hand-off
}

// handOffEntry is one remembered hand-off.
type handOffEntry struct {
	key handOffKey
	at  time.Time
}

// taken remembers that the reclaimer took the volume's release at now.
func (h *handedOver) taken(v *corev1.PersistentVolume, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at == nil {
		h.at = map[string]handOffEntry{}
	}
	h.at[v.Name] = handOffEntry{key: keyOf(v), at: now}
}

// done reports whether the reclaimer already took this very release, less
// than ttl before now.
func (h *handedOver) done(v *corev1.PersistentVolume, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.at[v.Name]
	if !ok || e.key != keyOf(v) {
		return false
	}
	return h.ttl <= 0 || now.Sub(e.at) < h.ttl
}

// forget drops a volume's hand-off: refused, failed, or the volume gone.
func (h *handedOver) forget(volume string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.at, volume)
}
