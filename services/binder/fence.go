package binder

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// errGone ends a sync whose object the API answered NotFound for: it is
// dropped from the cache and not retried; the watch's deletion event does
// the rest.
var errGone = errors.New("the object is gone from the API")

// errNotOwner ends a sync whose object this replica no longer owns (the
// ring changed, or its etcd session is lost) before a step with side
// effects: the owner syncs it.
var errNotOwner = errors.New("this replica does not own the object now")

// errNoRebind refuses to move a Released or Failed volume back to Bound.
var errNoRebind = errors.New("a Released or Failed volume is never bound again")

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
func (c *controller) fence(ctx context.Context) error {
	key, _ := ctx.Value(ownerKey{}).(string)
	if key == "" || c.owns(key) {
		return nil
	}
	return fmt.Errorf("%s: %w", key, errNotOwner)
}

// claimWriteFailed turns the error of a write to claim into the sync's
// error: NotFound drops the claim from the cache (it is gone; an update's
// NotFound never means "create it").
func (c *controller) claimWriteFailed(claim *corev1.PersistentVolumeClaim, err error, format string, args ...any) error {
	if apierrors.IsNotFound(err) {
		c.store.dropClaim(claimKey(claim), claim.UID)
		return fmt.Errorf("%s: claim %s: %w", fmt.Sprintf(format, args...), claimKey(claim), errGone)
	}
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)
}

// volumeWriteFailed is claimWriteFailed for a write to volume.
func (c *controller) volumeWriteFailed(volume *corev1.PersistentVolume, err error, format string, args ...any) error {
	if apierrors.IsNotFound(err) {
		c.store.dropVolume(volume.Name, volume.UID)
		return fmt.Errorf("%s: volume %s: %w", fmt.Sprintf(format, args...), volume.Name, errGone)
	}
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)
}
