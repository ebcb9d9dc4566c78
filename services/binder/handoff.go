package binder

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
