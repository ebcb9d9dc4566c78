package binder

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// caches are the controller's copy of the API objects it reads, fed by the
// watcher stream (controller.Apply), and the work queues of the keys to
// sync: kube-controller-manager's volumes and claims caches, listers,
// claimQueue and volumeQueue.
type caches struct {
	store       *store
	pods        *podIndex // pods that use claims (pods.go)
	view        claimView // store and pods as a claim's sync reads them (decide.go)
	claimQueue  *queue
	volumeQueue *queue

	// synced is set, and syncedCh closed, once the stream's first list
	// is in the caches (kube-controller-manager's ListerSynced).
	synced     atomic.Bool
	syncedCh   chan struct{}
	syncedOnce sync.Once
}

// volumeChanged queues the volume and the claims it can serve now: the
// claim its claimRef names, claims that asked for it by name, and, when it
// is free, the waiting claims it fits (Kubernetes leaves those to its 15s
// resync).
func (c *caches) volumeChanged(v *corev1.PersistentVolume) {
	c.volumeQueue.add(v.Name)
	for _, k := range c.store.unboundClaimsFor(v) {
		c.claimQueue.add(k)
	}
}

// enqueueAll queues every object (periodic resync, membership change).
func (c *caches) enqueueAll() {
	claims, volumes := c.store.snapshot()
	for _, k := range claims {
		c.claimQueue.add(k)
	}
	for _, n := range volumes {
		c.volumeQueue.add(n)
	}
}

// resyncSlice is how many objects a periodic resync queues at a time.
const resyncSlice = 500

// resyncPaced queues every object, as enqueueAll, but a slice at a time:
// the next slice waits until the queues hold fewer than resyncSlice keys,
// so what arrives meanwhile (a burst's new claims, the events of their
// binds) waits behind one slice, not behind every object of a large
// cluster. Every object is still synced once per pass (kube-controller-
// manager queues them all at once; the outcome is the same). A pass that
// outlasts the period delays the next one (the ticker drops ticks).
func (c *caches) resyncPaced(ctx context.Context) {
	claims, volumes := c.store.snapshot()
	for len(claims) > 0 || len(volumes) > 0 {
		for c.claimQueue.Len()+c.volumeQueue.Len() >= resyncSlice {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		n := min(len(claims), resyncSlice/2)
		for _, k := range claims[:n] {
			c.claimQueue.add(k)
		}
		claims = claims[n:]
		n = min(len(volumes), resyncSlice-n)
		for _, k := range volumes[:n] {
			c.volumeQueue.add(k)
		}
		volumes = volumes[n:]
	}
}

// uidOf is the UID of the claim or volume key names as the cache has it
// now, empty when it has none: with the key it tells a recreated object
// from the one a log line was about.
func (c *caches) uidOf(q *queue, key string) string {
	if q == c.claimQueue {
		if cl := c.store.claim(key); cl != nil {
			return string(cl.UID)
		}
		return ""
	}
	if v := c.store.volume(key); v != nil {
		return string(v.UID)
	}
	return ""
}
