package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"
)

// defaultMaxEntries bounds each cache when the options leave it zero.
const defaultMaxEntries = 10000

// ttlCache is a map whose entries expire, bounded in size: when full, the
// expired entries go first, then arbitrary ones (a cache miss only costs a
// review).
type ttlCache[V any] struct {
	mu  sync.Mutex
	max int
	now func() time.Time
	m   map[string]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v   V
	exp time.Time
}

func newTTLCache[V any](max int, now func() time.Time) *ttlCache[V] {
	if max <= 0 {
		max = defaultMaxEntries
	}
	return &ttlCache[V]{max: max, now: now, m: map[string]cacheEntry[V]{}}
}

func (c *ttlCache[V]) get(k string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !c.now().Before(e.exp) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// set keeps v for ttl; a ttl of zero or less keeps nothing.
func (c *ttlCache[V]) set(k string, v V, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for k, e := range c.m {
			if !now.Before(e.exp) {
				delete(c.m, k)
			}
		}
		// Still full: drop a tenth, whichever the map yields first.
		for k := range c.m {
			if len(c.m) < c.max-c.max/10 {
				break
			}
			delete(c.m, k)
		}
	}
	c.m[k] = cacheEntry[V]{v: v, exp: now.Add(ttl)}
}

func (c *ttlCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// hashKey is the cache key of a secret or of a review's attributes: the
// cache never holds a token itself.
func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		// Length-prefixed, so no two part lists hash alike.
		var n [8]byte
		for i, l := 0, uint64(len(p)); i < 8; i++ {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ttlOrDefault applies the options' convention: zero means the default,
// negative means do not cache.
func ttlOrDefault(ttl, def time.Duration) time.Duration {
	switch {
	case ttl == 0:
		return def
	case ttl < 0:
		return 0
	}
	return ttl
}
