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
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// DefaultStaleAfter is how long the binder may go without a live, caught-up
// watcher stream before its cache counts as stale: readiness goes
// NOT_SERVING and no reclaim or provisioning is handed off.
const DefaultStaleAfter = 5 * time.Second

// feed is the binder's subscription to its watchers: which one streams now
// and how current the cache is.
type feed struct {
	status     watchclient.Status
	staleAfter time.Duration
}

// errStaleCache refuses a step with side effects taken on what the cache
// says while the cache may be stale; the sync is retried.
var errStaleCache = errors.New("the binder's cache may be stale: no live watcher stream")

// streamHealthy reports whether the cache is current: the watcher's full
// list has been received and, within the feed's staleAfter, the stream was
// caught up with a SERVING watcher (one whose own view of the API server is
// current). While it is false the binder takes no destructive step on its
// cache. A controller without a feed (unit tests) is always healthy.
func (c *controller) streamHealthy() bool {
	if c.feed == nil {
		return true
	}
	return c.synced.Load() && !c.feed.status.Stale(c.feed.staleAfter)
}

// subscribe feeds c from one of the watchers at a time, failing over
// between them (see pkg/watchclient), until ctx ends.
func (c *controller) subscribe(ctx context.Context, addrs []string, tls grpcutil.TLSFiles, log *slog.Logger) error {
	return watchclient.DialFailover(ctx, addrs, tls, watchclient.Options{
		Kinds:        []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS, watcherv1.Kind_KIND_POD},
		Logger:       log.With("peer", "watcher"),
		StallTimeout: c.feed.staleAfter,
		Status:       &c.feed.status,
	}, c)
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

// readiness keeps the binder's health SERVING while its cache is current
// (streamHealthy) and NOT_SERVING otherwise, until ctx ends.
func (c *controller) readiness(ctx context.Context, srv *grpcutil.Server) error {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	serving := false
	for {
		if ok := c.streamHealthy() && c.coordinated(); ok != serving {
			serving = ok
			srv.SetServing(ok, binderv1.BinderService_ServiceDesc.ServiceName)
			if ok {
				c.log.Info("binder ready", "watcher", c.feed.status.Watcher())
			} else {
				var etcdErr error
				if c.etcdHealth != nil {
					etcdErr = c.etcdHealth()
				}
				c.log.Warn("binder not ready: no live watcher stream, no etcd session listing it, an etcd alarm, or no API server", "stream", c.streamHealthy(), "coordinated", c.coordinated(), "etcd", etcdErr, "watcher", c.feed.status.Watcher(), "fresh_at", c.feed.status.FreshAt())
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}
