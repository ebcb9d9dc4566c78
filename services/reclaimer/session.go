package reclaimer

import (
	"context"

	"github.com/volplane/volplane/pkg/coord"
)

// followSessions calls opened for every etcd session of k after the first,
// each of which replaces a lost one, until ctx ends.
func followSessions(ctx context.Context, k *coord.Keeper, opened func(context.Context)) {
	first := true
	for {
		changed := k.Changed()
		if k.Ready() {
			if !first {
				opened(ctx)
			}
			first = false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// sessionOpened is called when a new etcd session replaces a lost one: the
// reclaims held under the old session lost their locks with its lease (a
// step of theirs would be refused now, and another replica may have taken
// them over), so they are dropped from memory and taken over from the
// journal afresh, at once rather than after their retry backoff. A sync
// still running on one of them finds its entry gone and writes nothing.
func (c *controller) sessionOpened(ctx context.Context) {
	c.mu.Lock()
	dropped := 0
	for name, e := range c.entries {
		if e.held {
			delete(c.entries, name)
			dropped++
		}
	}
	c.mu.Unlock()
	if dropped > 0 {
		c.log.Info("new etcd session: taking the reclaims of the old one over from the journal", "reclaims", dropped)
	}
	c.takeOver(ctx)
}
