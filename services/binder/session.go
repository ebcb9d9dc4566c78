package binder

import (
	"context"
	"log/slog"
	"time"

	"github.com/volplane/volplane/pkg/coord"
)

// followMembers keeps own (and peers) in line with the binder members that
// this replica's live etcd session lists, until ctx ends. While there is no
// session (etcd down for longer than the lease TTL, or not reached yet),
// or its member list cannot be read, the replica owns nothing, so it takes
// no step with side effects; a new session lists it again and, after the
// settle period, every object it owns is synced again. It never returns an
// error: an etcd outage is waited out, not a reason to exit.
func followMembers(ctx context.Context, k *coord.Keeper, own *ownership, peers *peers, resync func(), log *slog.Logger) {
	own.follow(k.Ready)
	for {
		changed := k.Changed()
		co := k.Current()
		if co == nil {
			own.lose()
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return
			}
		}
		sctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-co.Done():
			case <-changed:
			case <-sctx.Done():
			}
			cancel()
		}()
		err := co.WatchMembers(sctx, Service, func(ms []coord.Member) {
			ids := make([]string, len(ms))
			for i, m := range ms {
				ids[i] = m.ID
			}
			own.set(ids)
			peers.update(ms)
			log.Info("binder members changed; resyncing owned objects", "members", ids)
			resync()
			// Objects gained in this change are acted on only after the
			// settle period: sync them again then.
			time.AfterFunc(own.settle+100*time.Millisecond, resync)
		})
		stopped := sctx.Err() != nil // the session changed, or ctx ended
		cancel()
		own.lose()
		if ctx.Err() != nil {
			return
		}
		if stopped {
			continue
		}
		log.Warn("binder members unknown: owning nothing until etcd answers", "error", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
	}
}
