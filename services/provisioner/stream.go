package provisioner

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// DefaultStaleAfter is how long the claim and class cache fed by the
// watcher may go without a live, caught-up stream before it counts as
// stale: then no hint is taken from it and DeleteVolume's guard lists the
// claims from the API server.
const DefaultStaleAfter = watchclient.DefaultStaleAfter

// streamFeed fills the provisioner's objectCache from the watcher's
// stream (--watcher-address), in place of the provisioner's own informers
// on claims and classes: from one watcher replica at a time with failover,
// through a watchclient.Feed, which decodes and slims the objects and
// applies a full list as a replace. The cache is not current while the
// Feed is stale.
type streamFeed struct {
	cache *objectCache
	addrs []string
	tls   grpcutil.TLSFiles
	log   *slog.Logger

	feed       *watchclient.Feed
	staleAfter time.Duration
}

var (
	_ watchclient.Handler    = (*streamFeed)(nil)
	_ watchclient.Subscriber = (*streamFeed)(nil)
	_ watchclient.Relister   = (*streamFeed)(nil)
	_ feeder                 = (*streamFeed)(nil)
)

// newStreamFeed is the feed of c from the watchers at addrs; c is stale
// when the stream has not been caught up with a SERVING watcher within
// staleAfter.
func newStreamFeed(c *objectCache, addrs []string, tls grpcutil.TLSFiles, log *slog.Logger, staleAfter time.Duration) *streamFeed {
	f := &streamFeed{cache: c, addrs: addrs, tls: tls, log: log, staleAfter: staleAfter}
	f.feed = watchclient.NewFeed(f, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS)
	c.stale = func() bool { return f.feed.Stale(f.staleAfter) }
	return f
}

// Reset implements watchclient.Handler: a full list follows, and the
// cache is not current until it ends.
func (f *streamFeed) Reset() {
	f.cache.relisting()
	f.feed.Reset()
}

// Event and Synced implement watchclient.Handler: the Feed interprets the
// stream and calls Apply, Keys and Relisted.
func (f *streamFeed) Event(ev *watcherv1.WatchResponse) error { return f.feed.Event(ev) }
func (f *streamFeed) Synced()                                 { f.feed.Synced() }

// Keys implements watchclient.Subscriber.
func (f *streamFeed) Keys(kind watcherv1.Kind) []string {
	switch kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		return f.cache.claims.ListKeys()
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		return f.cache.classes.ListKeys()
	}
	return nil
}

// Apply implements watchclient.Subscriber.
func (f *streamFeed) Apply(ev watchclient.Event) error {
	deleted := ev.Type == watchclient.Deleted
	switch o := ev.Object.(type) {
	case nil: // a Vanished deletion
		if ev.Kind == watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM {
			f.cache.dropClaim(ev.Key, "")
		} else {
			f.cache.dropClass(ev.Key, "")
		}
	case *corev1.PersistentVolumeClaim:
		if deleted {
			f.cache.dropClaim(ev.Key, string(o.UID))
		} else if err := f.cache.putClaim(o); err != nil {
			return fmt.Errorf("cache claim %s: %w", ev.Key, err)
		}
	case *storagev1.StorageClass:
		if deleted {
			f.cache.dropClass(ev.Key, string(o.UID))
		} else if err := f.cache.putClass(o); err != nil {
			return fmt.Errorf("cache StorageClass %s: %w", ev.Key, err)
		}
	}
	return nil
}

// Relisted implements watchclient.Relister: the full list is in.
func (f *streamFeed) Relisted(watchclient.Listed) { f.cache.listed() }

// run feeds the cache from one of the watchers at a time, failing over
// between them (see pkg/watchclient), until ctx ends.
func (f *streamFeed) run(ctx context.Context) error {
	return f.feed.Dial(ctx, f.addrs, f.tls, watchclient.Options{Logger: f.log.With("peer", "watcher"), StallTimeout: f.staleAfter})
}

func (f *streamFeed) about() []any {
	st := f.feed.Status()
	return []any{"source", "watcher stream", "watcher", st.Watcher(), "fresh_at", st.FreshAt()}
}
