package binder

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// tombstoneTTL is how long the store remembers an object an API response
// said is gone, when the watch never confirms it: far longer than a watch
// event takes to arrive, so only a lost stream (which relists) outlives it.
const tombstoneTTL = 5 * time.Minute

// maxTombstones bounds the tombstones of one kind; the oldest go first.
const maxTombstones = 10000

// tombstone marks one object (name and UID) the API answered NotFound for
// while the watch had not yet delivered its deletion.
type tombstone struct {
	uid  types.UID
	last any // the last version cached, for the deletion's side effects
	at   time.Time
}

// tombstones are the store's tombstones of one kind, by key. The caller
// holds the store's lock.
type tombstones map[string]tombstone

// add remembers that key's object uid is gone.
func (t tombstones) add(key string, uid types.UID, last any) {
	now := time.Now()
	if len(t) >= maxTombstones {
		t.expire(now)
	}
	for len(t) >= maxTombstones {
		oldest, at := "", now
		for k, ts := range t {
			if !ts.at.After(at) {
				oldest, at = k, ts.at
			}
		}
		delete(t, oldest)
	}
	t[key] = tombstone{uid: uid, last: last, at: now}
}

// admit reports whether a watch event of key's object uid may enter the
// cache: not when that object is known to be gone. A different object
// under the same name (another UID) ends the tombstone: the watch has
// moved past the deletion.
func (t tombstones) admit(key string, uid types.UID) bool {
	ts, ok := t[key]
	if !ok {
		return true
	}
	if ts.uid == uid && time.Since(ts.at) < tombstoneTTL {
		return false
	}
	delete(t, key)
	return true
}

// clear ends key's tombstone (the watch delivered the deletion) and
// returns the last version it kept, if any.
func (t tombstones) clear(key string) any {
	ts, ok := t[key]
	if !ok {
		return nil
	}
	delete(t, key)
	return ts.last
}

// expire drops the tombstones older than tombstoneTTL.
func (t tombstones) expire(now time.Time) {
	for k, ts := range t {
		if now.Sub(ts.at) >= tombstoneTTL {
			delete(t, k)
		}
	}
}

// goneTTL is how long the store remembers the UID of an object whose
// deletion it saw: far longer than any watcher replica lags behind another.
const goneTTL = 10 * time.Minute

// maxGone bounds the remembered UIDs; the oldest go first.
const maxGone = 100000

// goneUIDs are the UIDs of objects whose deletion the store saw, from a
// watch DELETED event or an API NotFound. A UID is never used again, so an
// event that carries one is a stale view: a watcher replica that lags
// behind the one the binder failed over from relists the object, or a late
// event of a stream that was cut. Such an event never enters the cache.
// Only a confirmed deletion adds a UID: an object missing from a relist may
// just be newer than the lagging replica's view, and must be let in when
// that replica catches up. The caller holds the store's lock.
type goneUIDs struct {
	at    map[types.UID]time.Time
	order []types.UID // order[head:] oldest first, for expiry
	head  int
}

// add remembers that uid is deleted.
func (g *goneUIDs) add(uid types.UID) {
	if uid == "" {
		return
	}
	if g.at == nil {
		g.at = map[types.UID]time.Time{}
	}
	if _, ok := g.at[uid]; ok {
		return
	}
	now := time.Now()
	g.expire(now)
	if len(g.at) >= maxGone {
		g.pop()
	}
	g.at[uid] = now
	g.order = append(g.order, uid)
}

// has reports whether uid is known to be deleted.
func (g *goneUIDs) has(uid types.UID) bool {
	at, ok := g.at[uid]
	return ok && time.Since(at) < goneTTL
}

// expire forgets the UIDs older than goneTTL.
func (g *goneUIDs) expire(now time.Time) {
	for g.head < len(g.order) && now.Sub(g.at[g.order[g.head]]) >= goneTTL {
		g.pop()
	}
}

// pop forgets the oldest UID; the slice is compacted once half of it is
// spent, so each UID is copied O(1) times.
func (g *goneUIDs) pop() {
	delete(g.at, g.order[g.head])
	g.head++
	if g.head > len(g.order)/2 {
		g.order = append([]types.UID(nil), g.order[g.head:]...)
		g.head = 0
	}
}
