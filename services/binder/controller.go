package binder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/timeline"
	"github.com/volplane/volplane/pkg/watchclient"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// reclaimer is what the binder needs of the reclaimer service.
type reclaimer interface {
	Reclaim(ctx context.Context, volume *corev1.PersistentVolume) error
}

// provisioner is what the binder needs of the provisioner service.
type provisioner interface {
	// Serves reports whether volplane provisions volumes of StorageClass
	// provisioner name; classes of other provisioners are left to them.
	Serves(ctx context.Context, name string) bool
	// Provision makes one attempt at the claim's volume.
	Provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (provisionResult, error)
}

// provisionResult is how a provisioning attempt ended.
type provisionResult struct {
	outcome provisionerv1.Outcome
	volume  *corev1.PersistentVolume // the new PV, when FINISHED
	message string
}

// controller is the binding state machine with its cache and work queues.
type controller struct {
	log      *slog.Logger
	client   kubernetes.Interface
	recorder record.EventRecorder
	// reservations hold free volumes for the claims being bound to them
	// (reservations.go).
	reservations *reservations
	reclaimer    reclaimer   // nil: Released volumes wait for another reclaimer
	provisioner  provisioner // nil: every class is left to external provisioners
	provisions   *provisions // the provisioner's calls in flight and finished
	// served: the drivers the provisioner serves, for the
	// external-provisioner finalizer of their volumes
	// (reclaimfinalizer.go); nil: none.
	served servedNow
	// refused: the volumes whose hand-off the reclaimer refused
	// (handoff.go), looked at again when their claim changes.
	refused refusals
	// journal says whether a reclaim of a volume is journaled, read right
	// before a rebind (rebind.go); nil reads none.
	journal reclaimJournal
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

	store       *store
	pods        *podIndex // pods that use claims (pods.go)
	view        claimView // store and pods as a claim's sync reads them (decide.go)
	claimQueue  *queue
	volumeQueue *queue

	synced     atomic.Bool
	syncedCh   chan struct{}
	syncedOnce sync.Once
	bindsTotal atomic.Int64
	// feed is the watcher subscription and how current it is (stream.go);
	// nil in unit tests.
	feed *feed
	// foreign notices another binder's writes (foreign.go); nil: not
	// looked for.
	foreign *foreignBinders
	// timeline records the steps taken for each claim (timeline.go); nil
	// records nothing.
	timeline *timeline.Store
	// waits: the claims waiting for their first consumer, since when
	// (timeline.go).
	waits consumerWaits

	// stream turns the watcher stream into the events Apply takes
	// (stream.go).
	stream *watchclient.Feed
	// shard is the claim shard the stream asks for (ownership.shard); nil:
	// every claim.
	shard *watchclient.Shard
	// streams says whether the stream under way carries a claim ("ns/name"):
	// the shard's Streams; nil: every claim.
	streams func(claimKey string) bool
}

func newController(log *slog.Logger, client kubernetes.Interface, recorder record.EventRecorder) *controller {
	limiter := func() workqueue.TypedRateLimiter[string] {
		// Per-item exponential backoff only: a conflict is retried after
		// 5ms, 10ms, ... up to 5 minutes, without the global token bucket
		// that would throttle retries during a burst of binds.
		return workqueue.NewTypedItemExponentialFailureRateLimiter[string](5*time.Millisecond, 5*time.Minute)
	}
	c := &controller{
		log:         log,
		client:      client,
		recorder:    recorder,
		owns:        func(string) bool { return true },
		store:       newStore(),
		pods:        newPodIndex(),
		claimQueue:  newQueue("claims", limiter()),
		volumeQueue: newQueue("volumes", limiter()),
		syncedCh:    make(chan struct{}),
		provisions:  newProvisions(DefaultProvisionCalls, DefaultRetryIntervalStart, DefaultRetryIntervalMax),
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
				c.foreign.observe(foreignChange{kind: "volume", name: v.Name, uid: v.UID, fields: volumeBindingChanges(old, v)})
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
				c.foreign.observe(foreignChange{kind: "claim", namespace: cur.Namespace, name: cur.Name, uid: cur.UID, fields: claimBindingChanges(old, cur)})
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

// volumeChanged queues the volume and the claims it can serve now: the
// claim its claimRef names, claims that asked for it by name, and, when it
// is free, the waiting claims it fits (Kubernetes leaves those to its 15s
// resync).
func (c *controller) volumeChanged(v *corev1.PersistentVolume) {
	c.volumeQueue.add(v.Name)
	for _, k := range c.store.unboundClaimsFor(v) {
		c.claimQueue.add(k)
	}
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

// enqueueAll queues every object (periodic resync, membership change).
func (c *controller) enqueueAll() {
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
func (c *controller) resyncPaced(ctx context.Context) {
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

// uidOf is the UID of the claim or volume key names as the cache has it
// now, empty when it has none: with the key it tells a recreated object
// from the one a log line was about.
func (c *controller) uidOf(q *queue, key string) string {
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
