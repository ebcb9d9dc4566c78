package provisioner

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/guard"
)

// objectCache is the provisioner's one cache of claims and StorageClasses:
// the hints Provision checks the objects callers send against,
// DeleteVolume's index of claims by spec.volumeName, the claims of the
// cloning-protection sweep and the classes of capacity tracking. A feeder
// fills it: the watcher's stream (--watcher-address, stream.go) or, without
// a watcher, the provisioner's own informers (informers.go). Both store and
// drop objects through the same methods, and everything that reads the
// cache reads it the same way: it is trusted only while current.
type objectCache struct {
	// claims are indexed by namespace/name and guard.ByVolumeName,
	// classes by name: the listers over them work unchanged.
	claims  cache.Indexer
	classes cache.Indexer

	synced  atomic.Bool // a full list has been applied
	listing atomic.Bool // between the start and the end of a relist
	// stale reports whether the feeder may be behind (the stream: not
	// caught up with a SERVING watcher lately); the informers never are.
	// Set before the feeder runs; tests replace it.
	stale func() bool

	// onClaim and onClass are told of every change (a claim or its
	// tombstone; a class); set before the feeder runs.
	onClaim func(obj any)
	onClass func()

	// waiting: per claim key, a channel closed when that claim is next
	// stored (or dropped), for readClaim's wait.
	waitMu  sync.Mutex
	waiting map[string]chan struct{}
}

// errNotCurrent is a hint refused because the cache may be behind: the
// caller reads the API server instead.
var errNotCurrent = errors.New("the claim and class cache is not current")

var _ hints = (*objectCache)(nil)

func newObjectCache() *objectCache {
	return &objectCache{
		claims:  cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{guard.ByVolumeName: guard.IndexByVolumeName}),
		classes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		stale:   func() bool { return false },
		onClaim: func(any) {},
		onClass: func() {},
		waiting: map[string]chan struct{}{},
	}
}

// hasSynced reports whether the first full list is in.
func (c *objectCache) hasSynced() bool { return c.synced.Load() }

// current reports whether the cache may be trusted now: a full list is in,
// no relist is under way, and the feeder is not behind.
func (c *objectCache) current() bool {
	return c.synced.Load() && !c.listing.Load() && !c.stale()
}

// relisting says a full list follows; nothing is dropped until it ends,
// so readers never see an empty cache.
func (c *objectCache) relisting() { c.listing.Store(true) }

// listed says a full list is in.
func (c *objectCache) listed() {
	c.synced.Store(true)
	c.listing.Store(false)
}

// putClaim stores a claim (the feeder has stripped what the provisioner
// does not keep) and tells onClaim and whoever waits for it.
func (c *objectCache) putClaim(cl *corev1.PersistentVolumeClaim) error {
	if err := c.claims.Update(cl); err != nil {
		return err
	}
	c.stored(cl.Namespace + "/" + cl.Name)
	c.onClaim(cl)
	return nil
}

// putClass stores a StorageClass and tells onClass.
func (c *objectCache) putClass(sc *storagev1.StorageClass) error {
	if err := c.classes.Update(sc); err != nil {
		return err
	}
	c.onClass()
	return nil
}

// dropClaim removes the claim under key, unless uid is set and the cached
// claim has another (it was recreated under its name), and wakes whoever
// waits for it: the waiter reads the API server now.
func (c *objectCache) dropClaim(key, uid string) {
	drop(c.claims, key, uid, c.onClaim)
	c.stored(key)
}

// dropClass removes the StorageClass under key, as dropClaim.
func (c *objectCache) dropClass(key, uid string) {
	drop(c.classes, key, uid, func(any) { c.onClass() })
}

// drop removes the object under key, unless uid is set and the cached
// object has another; changed gets the tombstone.
func drop(idx cache.Indexer, key, uid string, changed func(any)) {
	obj, ok, err := idx.GetByKey(key)
	if err != nil || !ok {
		return
	}
	if m, err := meta.Accessor(obj); err == nil && uid != "" && string(m.GetUID()) != uid {
		return
	}
	if err := idx.Delete(obj); err != nil {
		return
	}
	changed(cache.DeletedFinalStateUnknown{Key: key, Obj: obj})
}

// claimStored returns a channel closed when the claim namespace/name is
// next stored or dropped.
func (c *objectCache) claimStored(namespace, name string) <-chan struct{} {
	key := namespace + "/" + name
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	ch, ok := c.waiting[key]
	if !ok {
		ch = make(chan struct{})
		c.waiting[key] = ch
	}
	return ch
}

// stored wakes whoever waits for claim key.
func (c *objectCache) stored(key string) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	if ch, ok := c.waiting[key]; ok {
		close(ch)
		delete(c.waiting, key)
	}
}

// Claim is the cached claim, while the cache is current.
func (c *objectCache) Claim(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	if !c.current() {
		return nil, errNotCurrent
	}
	return corelisters.NewPersistentVolumeClaimLister(c.claims).PersistentVolumeClaims(namespace).Get(name)
}

// StorageClass is the cached class, while the cache is current.
func (c *objectCache) StorageClass(name string) (*storagev1.StorageClass, error) {
	if !c.current() {
		return nil, errNotCurrent
	}
	return storagelisters.NewStorageClassLister(c.classes).Get(name)
}

// report logs every change of current until ctx ends, with what the
// feeder says of itself.
func (c *objectCache) report(ctx context.Context, log *slog.Logger, f feeder) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	was := false
	for {
		if now := c.current(); now != was {
			was = now
			if now {
				log.Info("claim and class cache current: hints and the delete guard's index come from it", f.about()...)
			} else {
				log.Warn("claim and class cache not current: claims and classes are read from the API server",
					append(f.about(), "synced", c.synced.Load(), "relisting", c.listing.Load())...)
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// A feeder fills an objectCache: the watcher's stream (stream.go) or the
// provisioner's own informers (informers.go).
type feeder interface {
	// run feeds the cache until ctx ends.
	run(ctx context.Context) error
	// about is what the log says of the feed (key/value pairs).
	about() []any
}

// cacheClaims is guard.Claims over the cache's index: asked only while
// the cache is current, otherwise every claim is listed from the API
// server. Every claim either way is read from the API server.
type cacheClaims struct {
	client kubernetes.Interface
	cache  *objectCache
}

var _ guard.Claims = cacheClaims{}

func (c cacheClaims) GetClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return guard.APIClaims{Client: c.client}.GetClaim(ctx, namespace, name)
}

func (c cacheClaims) ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	a := guard.APIClaims{Client: c.client}
	if c.cache.current() {
		a.Index = c.cache.claims
	}
	return a.ClaimsNaming(ctx, volume)
}
