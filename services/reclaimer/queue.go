package reclaimer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/metrics"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// run runs the workers, the takeover of orphaned reclaims and the pruning
// of old records until ctx ends.
func (c *controller) run(ctx context.Context, workers int, takeover time.Duration) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	wg.Go(func() {
		t := time.NewTicker(takeover)
		defer t.Stop()
		for {
			c.takeOver(ctx)
			c.prune()
			select {
			case <-ctx.Done():
				return
			case <-c.lost:
				return
			case <-t.C:
			}
		}
	})
	select {
	case <-ctx.Done():
	case <-c.lost:
	}
	c.queue.ShutDown()
	wg.Wait()
}

func (c *controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	c.handle(ctx, key)
	return true
}

func (c *controller) stopping(ctx context.Context) bool {
	select {
	case <-c.lost:
		return true
	default:
		return ctx.Err() != nil
	}
}

// handle runs one sync of a held reclaim; a failed step is retried after
// the volume's exponential backoff.
func (c *controller) handle(ctx context.Context, key string) {
	r := c.heldRecord(key)
	if r == nil || c.stopping(ctx) {
		c.queue.Forget(key)
		return
	}
	if wait := c.backingOff(key, r); wait > 0 {
		// A change (e.g. of the recycler pod) arrived during the backoff:
		// the attempt comes when it is due. It is scheduled here too (the
		// queue keeps the earlier of two times for a key): a reclaim taken
		// over from the journal keeps its earlier holder's backoff, whose
		// timer died with that holder, and nothing else would queue it.
		c.queue.AddAfter(key, wait)
		return
	}
	sctx, sp := c.startAttempt(ctx, key, r)
	err := c.sync(sctx, r)
	endAttempt(sp, r, err)
	switch {
	case err == nil:
		c.queue.Forget(key)
	case c.stopping(ctx):
	case errors.Is(err, errSuperseded):
		c.queue.Forget(key)
		c.log.Info("reclaim step dropped", "volume", key, "why", err)
	default:
		reclaimRetries.WithLabelValues(retryReason(err)).Inc()
		metrics.WorkqueueRetry("reclaims") // AddAfter, which the queue does not count
		d := c.limiter.When(key)
		c.noteRetry(ctx, key, d, err)
		c.queue.AddAfter(key, d)
	}
}

// backingOff returns how long the reclaim still waits for its next
// attempt (its record's NextAttemptTime), or 0 when it is due.
func (c *controller) backingOff(key string, r *reclaimerv1.Reclaim) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil && e.wake {
		e.wake = false
		return 0
	}
	due := r.GetNextAttemptTime()
	if now := c.now(); due != nil && now.Add(retrySlack).Before(due.AsTime()) {
		return due.AsTime().Sub(now)
	}
	return 0
}

// retrySlack lets an attempt scheduled for a time start a little early.
const retrySlack = 10 * time.Millisecond

// noteRetry records when the next attempt is due (and why, unless the
// sync recorded it).
func (c *controller) noteRetry(ctx context.Context, key string, d time.Duration, err error) {
	r := c.heldRecord(key)
	if r == nil {
		return
	}
	if !errors.As(err, new(recorded)) {
		r.Message = err.Error()
	}
	r.NextAttemptTime = timestamppb.New(c.now().Add(d))
	if serr := c.save(ctx, r); serr != nil {
		c.log.Warn("cannot record the reclaim's retry", "volume", key, "error", serr)
	}
	// A step that turned the volume Failed was said once, with its Event
	// and an info line (markFailed); its retries, until something changes
	// (a deleter appears, the policy changes), are kube-controller-manager's
	// retry at every sync, logged as it logs them: at debug level.
	lvl := slog.LevelInfo
	if errors.As(err, new(failedStep)) {
		lvl = slog.LevelDebug
	}
	c.log.Log(ctx, lvl, "reclaim step failed; retrying", "volume", key, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "state", r.State, "after", d, "error", err)
}

// prune forgets finished records older than RecordTTL.
func (c *controller) prune() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for name, e := range c.entries {
		if !e.held && !now.Before(e.expires) {
			delete(c.entries, name)
		}
	}
}
