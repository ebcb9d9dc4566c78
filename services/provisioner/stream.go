package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// DefaultStaleAfter is how long the claim and class cache fed by the
// watcher may go without a live, caught-up stream before it counts as
// stale: then no hint is taken from it and DeleteVolume's guard lists the
// claims from the API server.
const DefaultStaleAfter = watchclient.DefaultStaleAfter

// streamCache holds the claims and StorageClasses the watcher streams
// (--watcher-address), in place of the provisioner's own informers on them:
// the same indexers (claims by namespace/name with guard.ByVolumeName,
// classes by name), so the listers over them work unchanged. It is fed by
// a watchclient.Feed (a full list is applied as a replace) and is trusted
// only while current.
type streamCache struct {
	claims  cache.Indexer
	classes cache.Indexer

	feed       *watchclient.Feed
	staleAfter time.Duration
	// stale reports whether the stream is behind; tests replace it.
	stale func() bool

	// onClaim and onClass are told of every change the stream brings (a
	// claim or tombstone, the class's name); set before the stream runs.
	onClaim func(obj any)
	onClass func()

	// waiting: per claim key, a channel closed when that claim is next
	// stored (or dropped), for readClaim's wait.
	waitMu  sync.Mutex
	waiting map[string]chan struct{}
}

var (
	_ watchclient.Handler    = (*streamCache)(nil)
	_ watchclient.Subscriber = (*streamCache)(nil)
)

func newStreamCache(staleAfter time.Duration) *streamCache {
	c := &streamCache{
		claims:     cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{guard.ByVolumeName: guard.IndexByVolumeName}),
		classes:    cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		staleAfter: staleAfter,
		onClaim:    func(any) {},
		onClass:    func() {},
		waiting:    map[string]chan struct{}{},
	}
	c.feed = watchclient.NewFeed(c, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS)
	c.stale = func() bool { return c.feed.Stale(c.staleAfter) }
	return c
}

// claimStored returns a channel closed when the claim namespace/name is
// next stored or dropped.
func (c *streamCache) claimStored(namespace, name string) <-chan struct{} {
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
func (c *streamCache) stored(key string) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	if ch, ok := c.waiting[key]; ok {
		close(ch)
		delete(c.waiting, key)
	}
}

// hasSynced reports whether the first full list is in.
func (c *streamCache) hasSynced() bool { return c.feed.HasSynced() }

// current reports whether the cache may be trusted now: it is complete (a
// full list is in, no relist is under way: the delete guard's index must
// hold every claim) and within staleAfter the stream was caught up with a
// SERVING watcher.
func (c *streamCache) current() bool {
	return c.feed.Complete() && !c.stale()
}

// Reset, Event and Synced make the cache a watchclient.Handler: its feed
// interprets the stream and calls Apply and Keys.
func (c *streamCache) Reset()                                  { c.feed.Reset() }
func (c *streamCache) Event(ev *watcherv1.WatchResponse) error { return c.feed.Event(ev) }
func (c *streamCache) Synced()                                 { c.feed.Synced() }

// Keys implements watchclient.Subscriber.
func (c *streamCache) Keys(kind watcherv1.Kind) []string {
	switch kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		return c.claims.ListKeys()
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		return c.classes.ListKeys()
	}
	return nil
}

// Apply implements watchclient.Subscriber.
func (c *streamCache) Apply(ev watchclient.Event) error {
	deleted := ev.Type == watchclient.Deleted
	switch ev.Kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		if deleted {
			c.drop(c.claims, ev.Key, string(ev.UID()), c.onClaim)
			c.stored(ev.Key) // a waiter reads the API server now
			return nil
		}
		if err := c.claims.Update(ev.Object); err != nil {
			return fmt.Errorf("cache claim %s: %w", ev.Key, err)
		}
		c.stored(ev.Key)
		c.onClaim(ev.Object)
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		if deleted {
			c.drop(c.classes, ev.Key, string(ev.UID()), func(any) { c.onClass() })
			return nil
		}
		if err := c.classes.Update(ev.Object); err != nil {
			return fmt.Errorf("cache StorageClass %s: %w", ev.Key, err)
		}
		c.onClass()
	}
	return nil
}

// drop removes the object under key, unless uid is set and the cached
// object has another (the object was recreated under its name); changed
// gets the tombstone.
func (c *streamCache) drop(idx cache.Indexer, key, uid string, changed func(any)) {
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

// run feeds the cache from one of the watchers at a time, failing over
// between them (see pkg/watchclient), until ctx ends.
func (c *streamCache) run(ctx context.Context, addrs []string, tls grpcutil.TLSFiles, log *slog.Logger) error {
	return c.feed.Dial(ctx, addrs, tls, watchclient.Options{Logger: log.With("peer", "watcher"), StallTimeout: c.staleAfter})
}

// report logs every change of current until ctx ends.
func (c *streamCache) report(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	was := false
	for {
		if now := c.current(); now != was {
			was = now
			if now {
				log.Info("claim and class cache current: hints and the delete guard's index come from the watcher stream", "watcher", c.feed.Status().Watcher())
			} else {
				log.Warn("claim and class cache not current: claims and classes are read from the API server", "watcher", c.feed.Status().Watcher(),
					"synced", c.feed.HasSynced(), "relisting", c.feed.Relisting(), "fresh_at", c.feed.Status().FreshAt())
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// errNotCurrent is a hint refused because the stream-fed cache may be
// behind: the caller reads the API server instead.
var errNotCurrent = errors.New("the claim and class cache is not current")

// currentHints are hints only while current says the cache is current.
type currentHints struct {
	next    hints
	current func() bool
}

var _ hints = currentHints{}

func (h currentHints) Claim(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	if !h.current() {
		return nil, errNotCurrent
	}
	return h.next.Claim(namespace, name)
}

func (h currentHints) StorageClass(name string) (*storagev1.StorageClass, error) {
	if !h.current() {
		return nil, errNotCurrent
	}
	return h.next.StorageClass(name)
}

// currentIndex is guard.APIClaims whose index is asked only while current
// says the cache is current; otherwise every claim is listed from the API
// server. Every claim either way is read from the API server.
type currentIndex struct {
	client  kubernetes.Interface
	index   cache.Indexer
	current func() bool
}

var _ guard.Claims = currentIndex{}

func (c currentIndex) GetClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return guard.APIClaims{Client: c.client}.GetClaim(ctx, namespace, name)
}

func (c currentIndex) ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	a := guard.APIClaims{Client: c.client}
	if c.current() {
		a.Index = c.index
	}
	return a.ClaimsNaming(ctx, volume)
}
