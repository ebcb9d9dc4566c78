package binder

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// respondedVersions bounds the versions remembered (about 1.5 MiB): far
// more than the writes of the changes waiting for the foreign-binder
// check (foreignBacklog) in the seconds they wait.
const respondedVersions = 16384

// versions is a bounded set of object versions (UID and resourceVersion),
// the oldest forgotten first: the versions API responses gave this
// replica, so that the foreign-binder check (foreign.go) does not read back
// a change this replica wrote itself, whose watch event may come before
// the write's answer.
type versions struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring []string
	next int
}

func versionKey(uid types.UID, rv string) string { return string(uid) + "/" + rv }

// add remembers a version.
func (v *versions) add(uid types.UID, rv string) {
	if uid == "" || rv == "" {
		return
	}
	k := versionKey(uid, rv)
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.set[k]; ok {
		return
	}
	if v.set == nil {
		v.set, v.ring = map[string]struct{}{}, make([]string, respondedVersions)
	}
	delete(v.set, v.ring[v.next])
	v.ring[v.next] = k
	v.next = (v.next + 1) % len(v.ring)
	v.set[k] = struct{}{}
}

// has reports whether a version is remembered.
func (v *versions) has(uid types.UID, rv string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.set[versionKey(uid, rv)]
	return ok
}
