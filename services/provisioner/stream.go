package provisioner

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// DefaultStaleAfter is how long the claim and class cache fed by the
// watcher may go without a live, caught-up stream before it counts as
// stale: then no hint is taken from it and DeleteVolume's guard lists the
// claims from the API server.
const DefaultStaleAfter = 5 * time.Second

// streamFeed fills the provisioner's objectCache from the watcher's
// stream (--watcher-address), in place of the provisioner's own informers
// on claims and classes: from one watcher replica at a time with failover
// (pkg/watchclient); a full list (Reset, ADDED..., Synced) is applied as a
// replace; objects are kept without managedFields. The cache is not
// current while the stream is stale.
type streamFeed struct {
	cache *objectCache
	addrs []string
	tls   grpcutil.TLSFiles
	log   *slog.Logger

	status     watchclient.Status
	staleAfter time.Duration

	// listed holds the keys ADDED since the last RESET, per kind; only the
	// handler (whose calls never overlap) touches it.
	listed map[watcherv1.Kind]map[string]bool
}

var (
	_ watchclient.Handler = (*streamFeed)(nil)
	_ feeder              = (*streamFeed)(nil)
)

// newStreamFeed is the feed of c from the watchers at addrs; c is stale
// when the stream has not been caught up with a SERVING watcher within
// staleAfter.
func newStreamFeed(c *objectCache, addrs []string, tls grpcutil.TLSFiles, log *slog.Logger, staleAfter time.Duration) *streamFeed {
	f := &streamFeed{cache: c, addrs: addrs, tls: tls, log: log, staleAfter: staleAfter}
	c.stale = func() bool { return f.status.Stale(f.staleAfter) }
	return f
}

// Reset implements watchclient.Handler: a full list follows.
func (f *streamFeed) Reset() {
	f.cache.relisting()
	f.listed = map[watcherv1.Kind]map[string]bool{
		watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM: {},
		watcherv1.Kind_KIND_STORAGE_CLASS:           {},
	}
}

// Synced implements watchclient.Handler: objects the full list did not
// mention were deleted while the stream was down.
func (f *streamFeed) Synced() {
	if f.listed != nil {
		for _, k := range f.cache.claims.ListKeys() {
			if !f.listed[watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM][k] {
				f.cache.dropClaim(k, "")
			}
		}
		for _, k := range f.cache.classes.ListKeys() {
			if !f.listed[watcherv1.Kind_KIND_STORAGE_CLASS][k] {
				f.cache.dropClass(k, "")
			}
		}
		f.listed = nil
	}
	f.cache.listed()
}

// Event implements watchclient.Handler.
func (f *streamFeed) Event(ev *watcherv1.WatchResponse) error {
	if m := f.listed[ev.Kind]; m != nil && ev.Type == watcherv1.EventType_EVENT_TYPE_ADDED {
		m[ev.Key] = true
	}
	deleted := ev.Type == watcherv1.EventType_EVENT_TYPE_DELETED
	switch ev.Kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		cl, err := kube.DecodeClaim(ev.Object)
		if err != nil {
			return err
		}
		if deleted {
			f.cache.dropClaim(ev.Key, string(cl.UID))
			return nil
		}
		cl.ManagedFields = nil
		if err := f.cache.putClaim(cl); err != nil {
			return fmt.Errorf("cache claim %s: %w", ev.Key, err)
		}
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		sc, err := kube.DecodeStorageClass(ev.Object)
		if err != nil {
			return err
		}
		if deleted {
			f.cache.dropClass(ev.Key, string(sc.UID))
			return nil
		}
		sc.ManagedFields = nil
		if err := f.cache.putClass(sc); err != nil {
			return fmt.Errorf("cache StorageClass %s: %w", ev.Key, err)
		}
	}
	return nil
}

// run feeds the cache from one of the watchers at a time, failing over
// between them (see pkg/watchclient), until ctx ends.
func (f *streamFeed) run(ctx context.Context) error {
	return watchclient.DialFailover(ctx, f.addrs, f.tls, watchclient.Options{
		Kinds:        []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS},
		Encoding:     watcherv1.Encoding_ENCODING_PROTOBUF,
		Logger:       f.log.With("peer", "watcher"),
		StallTimeout: f.staleAfter,
		Status:       &f.status,
	}, f)
}

func (f *streamFeed) about() []any {
	return []any{"source", "watcher stream", "watcher", f.status.Watcher(), "fresh_at", f.status.FreshAt()}
}
