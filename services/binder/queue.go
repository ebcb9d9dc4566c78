package binder

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/metrics"
)

// queue is a work queue of keys whose per-key backoff holds: a key whose
// sync failed is synced again only when its backoff ends, whatever queues
// it meanwhile (a watch event, a resync, a membership change, a finished
// provisioning call, a SyncClaim request). client-go's rate-limited queue
// applies the backoff only to AddRateLimited; a plain Add of a failing key
// runs it at once, so a key touched many times a second was retried as
// often, each retry an API request.
type queue struct {
	workqueue.TypedDelayingInterface[string]
	limiter workqueue.TypedRateLimiter[string]
	// name is the queue's name in the workqueue_* metrics.
	name string

	mu sync.Mutex
	// until: keys in backoff, not synced before this time.
	until map[string]time.Time
	// last: the backoff each failing key waited last; a retry in progress
	// holds the key's events for as long again.
	last map[string]time.Duration
	// held: keys in backoff that events queued meanwhile; a successful
	// retry syncs them once more at once.
	held map[string]bool
	// queued: when each key waiting for its sync was first queued
	// (for the claim's timeline).
	queued map[string]time.Time
}

func newQueue(name string, limiter workqueue.TypedRateLimiter[string]) *queue {
	return &queue{
		TypedDelayingInterface: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: name}),
		limiter:                limiter,
		name:                   name,
		until:                  map[string]time.Time{},
		last:                   map[string]time.Duration{},
		held:                   map[string]bool{},
		queued:                 map[string]time.Time{},
	}
}

// add queues key: at once, or when its backoff ends.
func (q *queue) add(key string) {
	q.mu.Lock()
	until, failing := q.until[key]
	wait := time.Until(until)
	if failing && wait > 0 {
		q.held[key] = true
	}
	if _, ok := q.queued[key]; !ok {
		q.queued[key] = time.Now()
	}
	q.mu.Unlock()
	if failing && wait > 0 {
		q.AddAfter(key, wait)
		return
	}
	q.Add(key)
}

// get returns the next key due for a sync; a key queued before its
// backoff ended goes back to wait. While a failing key's retry runs, its
// events wait as long as its last backoff.
func (q *queue) get() (string, bool) {
	for {
		key, quit := q.Get()
		if quit {
			return "", true
		}
		q.mu.Lock()
		until, failing := q.until[key]
		wait := time.Until(until)
		if failing && wait <= 0 {
			q.until[key] = time.Now().Add(q.last[key])
		}
		q.mu.Unlock()
		if failing && wait > 0 {
			q.AddAfter(key, wait)
			q.Done(key)
			continue
		}
		return key, false
	}
}

// forget ends key's backoff after a sync that succeeded (or found nothing
// to do); events held during the retry sync it once more now.
func (q *queue) forget(key string) {
	q.limiter.Forget(key)
	q.mu.Lock()
	held := q.held[key]
	delete(q.until, key)
	delete(q.last, key)
	delete(q.held, key)
	q.mu.Unlock()
	if held {
		q.Add(key)
	}
}

// retry puts key in backoff after a failed sync and queues it for when
// the backoff ends, which it returns.
func (q *queue) retry(key string) time.Duration {
	metrics.WorkqueueRetry(q.name) // AddRateLimited would count it; AddAfter does not
	d := q.limiter.When(key)
	q.mu.Lock()
	q.until[key] = time.Now().Add(d)
	q.last[key] = d
	q.mu.Unlock()
	q.AddAfter(key, d)
	return d
}

// queuedSince returns when key was first queued since its last sync
// began (zero if it was not queued by add), and starts counting anew.
func (q *queue) queuedSince(key string) time.Time {
	q.mu.Lock()
	t := q.queued[key]
	delete(q.queued, key)
	q.mu.Unlock()
	return t
}

// retries is how many times key failed in a row.
func (q *queue) retries(key string) int { return q.limiter.NumRequeues(key) }
