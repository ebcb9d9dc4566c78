package binder

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// errGone ends a sync whose object the API answered NotFound for: it is
// dropped from the cache and not retried; the watch's deletion event does
// the rest.
var errGone = errors.New("the object is gone from the API")

// errNoRebind refuses to move a Released or Failed volume back to Bound.
var errNoRebind = errors.New("a Released or Failed volume is never bound again")

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
