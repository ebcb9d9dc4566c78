package binder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// DefaultStaleAfter is how long the binder may go without a live, caught-up
// watcher stream before its cache counts as stale: readiness goes
// NOT_SERVING and no reclaim or provisioning is handed off.
const DefaultStaleAfter = watchclient.DefaultStaleAfter

// watchKinds are the kinds the binder subscribes to. A full list deletes
// the claims, volumes, classes and pods it no longer mentions in this
// order.
var watchKinds = []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_PERSISTENT_VOLUME, watcherv1.Kind_KIND_STORAGE_CLASS, watcherv1.Kind_KIND_POD}

// watchStream is the controller's subscription to the watcher, which
// feeds its caches (kube-controller-manager's informers).
type watchStream struct {
	// feed is how current the subscription is; nil in unit tests.
	feed *feed
	// stream turns the watcher stream into the events Apply takes.
	stream *watchclient.Feed
	// shard is the claim shard the stream asks for (ownership.shard); nil:
	// every claim.
	shard *watchclient.Shard
	// streams says whether the stream under way carries a claim ("ns/name"):
	// the shard's Streams; nil: every claim.
	streams func(claimKey string) bool
}

// feed is how stale the binder lets its cache get; nil (unit tests) never
// calls the cache stale.
type feed struct {
	staleAfter time.Duration
}

// errStaleCache refuses a step with side effects taken on what the cache
// says while the cache may be stale; the sync is retried.
var errStaleCache = errors.New("the binder's cache may be stale: no live watcher stream")

// streamHealthy reports whether the cache is current: the watcher's full
// list has been received and, within the feed's staleAfter, the stream was
// caught up with a SERVING watcher (one whose own view of the API server is
// current): the stream is not Stale. A relist under way leaves it healthy:
// what the cache holds is as new as FreshAt, and every destructive step
// reads the API first. While it is false the binder takes no destructive
// step on its cache. A controller without a feed (unit tests) is always
// healthy.
func (w *watchStream) streamHealthy() bool {
	if w.feed == nil {
		return true
	}
	return !w.stream.Stale(w.feed.staleAfter)
}

// subscribe feeds c from one of the watchers at a time, failing over
// between them (see pkg/watchclient), until ctx ends.
func (c *controller) subscribe(ctx context.Context, addrs []string, tls grpcutil.TLSFiles, log *slog.Logger) error {
	return c.stream.Dial(ctx, addrs, tls, watchclient.Options{Logger: log.With("peer", "watcher"), StallTimeout: c.feed.staleAfter, Shard: c.shard})
}

// Reset, Event and Synced make the controller a watchclient.Handler: its
// feed interprets the stream and calls Apply, Keys and Relisted.
func (w *watchStream) Reset()                                  { w.stream.Reset() }
func (w *watchStream) Event(ev *watcherv1.WatchResponse) error { return w.stream.Event(ev) }
func (w *watchStream) Synced()                                 { w.stream.Synced() }

var (
	_ watchclient.Handler    = (*controller)(nil)
	_ watchclient.Subscriber = (*controller)(nil)
	_ watchclient.Relister   = (*controller)(nil)
)

// Keys implements watchclient.Subscriber: the keys of kind in the cache.
func (c *caches) Keys(kind watcherv1.Kind) []string {
	switch kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		claims, _ := c.store.snapshot()
		return claims
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME:
		_, volumes := c.store.snapshot()
		return volumes
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		return c.store.classNames()
	case watcherv1.Kind_KIND_POD:
		return c.pods.keys()
	}
	return nil
}

// Relisted implements watchclient.Relister: a full list is applied. The
// tombstones of objects it did not mention end (the watch now agrees they
// are gone), and the first one lets the workers start.
func (c *caches) Relisted(listed watchclient.Listed) {
	if listed != nil {
		c.store.endTombstones(listed[watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM], listed[watcherv1.Kind_KIND_PERSISTENT_VOLUME])
	}
	c.syncedOnce.Do(func() {
		c.synced.Store(true)
		close(c.syncedCh)
	})
}

// gatedReclaimer hands a volume to the reclaimer only while the cache is
// current: a Released volume seen on a stale cache may be bound again by
// now.
type gatedReclaimer struct {
	next reclaimer
	c    *controller
}

var _ reclaimer = gatedReclaimer{}

func (g gatedReclaimer) Reclaim(ctx context.Context, v *corev1.PersistentVolume) error {
	if !g.c.streamHealthy() {
		return fmt.Errorf("hand volume %s to the reclaimer: %w", v.Name, errStaleCache)
	}
	return g.next.Reclaim(ctx, v)
}

// gatedProvisioner asks for a new volume only while the cache is current:
// a claim seen on a stale cache may be bound or gone by now.
type gatedProvisioner struct {
	provisioner
	c *controller
}

var _ provisioner = gatedProvisioner{}

func (g gatedProvisioner) Provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (provisionResult, error) {
	if !g.c.streamHealthy() {
		return provisionResult{}, fmt.Errorf("provision claim %s: %w", claimKey(claim), errStaleCache)
	}
	return g.provisioner.Provision(ctx, claim, class)
}

// streamCheck is the readiness check "watcher-stream": the cache is
// current (streamHealthy), and why not.
func (w *watchStream) streamCheck() error {
	if w.streamHealthy() {
		return nil
	}
	return w.stream.StaleReason(w.feed.staleAfter)
}
