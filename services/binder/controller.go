package binder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// controller is the binding state machine (kube-controller-manager's
// PersistentVolumeController), in parts by concern: what it coordinates
// with the other replicas, its caches and queues, what it reports, the
// watcher stream it follows, the services it calls, and the reservations
// of the volumes it binds.
type controller struct {
	log      *slog.Logger
	client   kubernetes.Interface
	recorder record.EventRecorder

	coordination  // coordination.go
	caches        // caches.go
	observability // observability.go
	watchStream   // stream.go
	services      // services.go
	// reservations hold free volumes for the claims being bound to them
	// (reservations.go).
	reservations *reservations
}

// The per-item backoff of the binder's work queues: a sync that failed
// (a conflict, an API error) is retried after queueBackoffBase, doubling
// up to queueBackoffMax.
const (
	queueBackoffBase = 5 * time.Millisecond
	queueBackoffMax  = 5 * time.Minute
)

// newController returns a controller with empty caches that owns every
// object and holds volumes in memory only, without etcd, services or a
// timeline: newWiredController (run.go) adds those.
func newController(log *slog.Logger, client kubernetes.Interface, recorder record.EventRecorder) *controller {
	limiter := func() workqueue.TypedRateLimiter[string] {
		// Per-item exponential backoff only: a conflict is retried after
		// queueBackoffBase, doubling up to queueBackoffMax, without the
		// global token bucket that would throttle retries during a burst
		// of binds.
		return workqueue.NewTypedItemExponentialFailureRateLimiter[string](queueBackoffBase, queueBackoffMax)
	}
	c := &controller{
		log:          log,
		client:       client,
		recorder:     recorder,
		coordination: coordination{owns: func(string) bool { return true }},
		caches: caches{
			store:       newStore(),
			pods:        newPodIndex(),
			claimQueue:  newQueue("claims", limiter()),
			volumeQueue: newQueue("volumes", limiter()),
			syncedCh:    make(chan struct{}),
		},
		services: services{
			provisions: newProvisions(DefaultProvisionCalls, DefaultRetryIntervalStart, DefaultRetryIntervalMax),
		},
	}
	c.reservations = newReservations(log, c.store)
	c.view = syncView{c.store, c.pods, c.selectedNodeLabels, c.reservations}
	c.stream = watchclient.NewFeed(c, watchKinds...)
	return c
}

// Apply implements watchclient.Subscriber: it updates the cache and
// queues the keys the change may affect.
func (c *controller) Apply(ev watchclient.Event) error {
	if ev.Type == watchclient.Deleted {
		switch ev.Kind {
		case watcherv1.Kind_KIND_POD:
			c.queueWaitingClaims(c.pods.remove(ev.Key))
		case watcherv1.Kind_KIND_PERSISTENT_VOLUME:
			c.volumeDeleted(ev.Key, ev.UID())
		case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
			if ev.Vanished && c.streams != nil && !c.streams(ev.Key) {
				// Left this replica's shard (a ring change): not deleted.
				// Its owner decides about it and its volumes.
				c.claimLeftShard(ev.Key)
				return nil
			}
			c.claimDeleted(ev.Key, ev.UID())
		case watcherv1.Kind_KIND_STORAGE_CLASS:
			c.store.deleteClass(ev.Key)
		}
		return nil
	}
	switch o := ev.Object.(type) {
	case *watcherv1.Pod:
		// The claims whose waiting pods changed: their next sync gives
		// the event that fits now, rather than at the next resync
		// (kube-controller-manager waits for its resync).
		c.queueWaitingClaims(c.pods.put(ev.Key, o, ev.ResourceVersion))
	case *corev1.PersistentVolume:
		old := c.store.volume(ev.Key)
		if v := c.store.putVolume(o); v != nil {
			if c.foreign != nil && old != nil && old != v && old.UID == v.UID && c.owns(volumeOwnerKey(v)) {
				c.foreign.observe(foreignChange{kind: "volume", name: v.Name, uid: v.UID, rv: v.ResourceVersion, fields: volumeBindingChanges(old, v)})
			}
			c.volumeChanged(v)
		}
	case *corev1.PersistentVolumeClaim:
		old := c.store.claim(ev.Key)
		if old == nil {
			c.noteSeen(o, ev.Observed)
		}
		if cur := c.store.putClaim(o); cur != nil {
			// A binding field changed that no write of this replica's had
			// brought into the cache first: another binder's, maybe.
			if c.foreign != nil && old != nil && old != cur && old.UID == cur.UID && c.owns("pvc/"+ev.Key) {
				c.foreign.observe(foreignChange{kind: "claim", namespace: cur.Namespace, name: cur.Name, uid: cur.UID, rv: cur.ResourceVersion, fields: claimBindingChanges(old, cur)})
			}
			c.claimQueue.add(ev.Key)
			c.claimChanged(ev.Key)
		}
	case *storagev1.StorageClass:
		c.store.putClass(o)
		// Claims of this class may now be provisioned or bound.
		for _, k := range c.store.unboundClaimsOfClass(o.Name) {
			c.claimQueue.add(k)
		}
		// A new default class is assigned to pending claims without one
		// (retroactive default class) now, not at the next resync.
		if o.Annotations[kube.AnnDefaultStorageClass] == "true" || o.Annotations[kube.AnnBetaDefaultStorageClass] == "true" {
			for _, k := range c.store.unboundClaimsOfClass("") {
				c.claimQueue.add(k)
			}
		}
	}
	return nil
}

// claimChanged queues the volumes whose hand-off to the reclaimer was
// refused while their claimRef names this claim: the refusal (a live
// claim) may not hold any more. Other volumes naming the claim need
// nothing from its change (a deletion queues them all, claimDeleted).
func (c *controller) claimChanged(key string) {
	for _, n := range c.store.volumesClaimedBy(key) {
		if c.refused.has(n) {
			c.volumeQueue.add(n)
		}
	}
}

// volumeDeleted handles a volume's deletion: uid is the deleted object's
// (a watch event), empty when a relist did not mention the volume.
func (c *controller) volumeDeleted(name string, uid types.UID) {
	c.refused.forget(name)
	c.handed.forget(name)
	old := c.store.deleteVolume(name, uid)
	if old != nil && old.Spec.ClaimRef != nil {
		// The claim turns Lost now rather than at the next resync.
		c.claimQueue.add(refKey(old.Spec.ClaimRef))
	}
}

// claimDeleted handles a claim's deletion; see volumeDeleted.
func (c *controller) claimDeleted(key string, uid types.UID) {
	c.provisions.forget(key)
	old := c.store.deleteClaim(key, uid)
	if old != nil {
		c.waits.end(old.UID)
	}
	if old != nil && old.Spec.VolumeName != "" {
		// The volume is Released now rather than at the next resync.
		c.volumeQueue.add(old.Spec.VolumeName)
	}
	for _, n := range c.store.volumesClaimedBy(key) {
		c.volumeQueue.add(n)
	}
}

// claimLeftShard forgets a claim that the watcher stream no longer
// carries because it is another replica's now. Unlike claimDeleted it
// queues nothing and leaves no tombstone: the claim lives, and this
// replica must never release, fail or recycle a volume because it no
// longer holds the claim (its volumes are owned, by volumeOwnerKey, by the
// replica that does).
func (c *controller) claimLeftShard(key string) {
	c.provisions.forget(key)
	c.store.forgetClaim(key)
}

// run starts workers claim workers and as many volume workers, once the
// cache is synced, and blocks until ctx ends.
func (c *controller) run(ctx context.Context, workers int, resync time.Duration) error {
	go func() {
		<-ctx.Done()
		c.claimQueue.ShutDownWithDrain()
		c.volumeQueue.ShutDownWithDrain()
	}()
	select {
	case <-c.syncedCh:
	case <-ctx.Done():
		return nil
	}
	c.log.Info("cache synced, starting workers", "workers", workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(2)
		go func() { defer wg.Done(); c.worker(ctx, c.claimQueue, c.syncClaimKey) }()
		go func() { defer wg.Done(); c.worker(ctx, c.volumeQueue, c.syncVolumeKey) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); c.reservations.releaser(ctx) }()
	if resync > 0 {
		t := time.NewTicker(resync)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				c.resyncPaced(ctx)
				continue
			case <-ctx.Done():
			}
			break
		}
	} else {
		<-ctx.Done()
	}
	wg.Wait()
	return nil
}

func (c *controller) worker(ctx context.Context, q *queue, sync func(context.Context, string) error) {
	for {
		key, quit := q.get()
		if quit {
			return
		}
		err := sync(ctx, key)
		switch {
		case err == nil, ctx.Err() != nil:
			q.forget(key)
		case errors.Is(err, errGone), errors.Is(err, errNotOwner):
			// The object is gone, or another replica has it now: nothing
			// to retry here.
			c.log.Debug("sync ended", "key", key, "uid", c.uidOf(q, key), "reason", err)
			q.forget(key)
		default:
			reason := retryReason(err)
			retriesTotal.WithLabelValues(reason).Inc()
			delay := q.retry(key)
			if q == c.claimQueue {
				c.noteRetry(ctx, key, reason, err.Error(), delay)
			}
			lvl := slog.LevelWarn
			if reason == reasonConflict || reason == reasonReserved {
				lvl = slog.LevelDebug // expected under concurrency: sync again
			}
			c.log.Log(ctx, lvl, "sync failed, retrying with backoff", "key", key, "error", err, "reason", reason, "retries", q.retries(key), "after", delay)
		}
		q.Done(key)
	}
}

func (c *controller) syncClaimKey(ctx context.Context, key string) error {
	if !c.owns("pvc/" + key) {
		return nil
	}
	since := c.claimQueue.queuedSince(key)
	claim := c.store.claim(key)
	if claim == nil {
		return nil
	}
	c.noteQueued(ctx, claim, since)
	return c.syncClaim(ctx, claim)
}

func (c *controller) syncVolumeKey(ctx context.Context, name string) error {
	v := c.store.volume(name)
	if v == nil || !c.owns(volumeOwnerKey(v)) {
		return nil
	}
	return c.syncVolume(ctx, v)
}

// errNotSynced answers API calls before the cache is filled.
var errNotSynced = fmt.Errorf("the binder's cache is not synced with the watcher yet")
