package binder

import (
	"context"
	"errors"
	"fmt"
)

// coordination is what the controller knows of the other replicas: which
// objects are its own and whether it can act at all. Every step with side
// effects asks it right before it is taken (fence); the reservations of
// free volumes are their own part (reservations.go).
// kube-controller-manager runs one active replica and needs none of it.
type coordination struct {
	// owns reports whether this replica may act on an object ("pvc/ns/name"
	// or "pv/name") now: it owns it in the ring, on a live etcd session.
	// Every step with side effects asks it right before it is taken.
	owns func(key string) bool
	// canAct reports whether the replica can act at all: a live etcd
	// session lists it, etcd raises no alarm and the API server answers;
	// nil means yes.
	canAct func() bool
	// etcdHealth says why etcd keeps the replica from acting ("etcd:
	// NOSPACE alarm", "etcd: no session"), for the readiness log; nil
	// (unit tests) says nothing.
	etcdHealth func() error
}

// coordinated reports whether the replica can act at all (canAct); its
// readiness follows it.
func (co *coordination) coordinated() bool { return co.canAct == nil || co.canAct() }

// errNotOwner ends a sync whose object this replica no longer owns (the
// ring changed, or its etcd session is lost) before a step with side
// effects: the owner syncs it.
var errNotOwner = errors.New("this replica does not own the object now")

// ownerKey is the context key of the object a sync acts for.
type ownerKey struct{}

// forObject returns ctx for a sync of the object key ("pvc/ns/name",
// "pv/name"): every write in it is fenced on this replica owning key.
func forObject(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, ownerKey{}, key)
}

// fence is asked right before every step with side effects (an API write,
// a provisioning or reclaim call): the sync's object must still be this
// replica's, on a live etcd session. A replica that lost its session or
// the object in a ring change stops between two steps, never taking one
// more; the API's resourceVersion check covers the step already under way.
func (co *coordination) fence(ctx context.Context) error {
	key, _ := ctx.Value(ownerKey{}).(string)
	if key == "" || co.owns(key) {
		return nil
	}
	return fmt.Errorf("%s: %w", key, errNotOwner)
}
