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
