package binder

import (
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/match"
)

// freeList is the free volumes of one class with one set of access modes,
// sorted by capacity, then name (Best's order of preference).
type freeList struct {
	modes   []corev1.PersistentVolumeAccessMode
	entries []freeEntry
}

type freeEntry struct {
	size int64
	v    *corev1.PersistentVolume
}

func (l *freeList) search(size int64, name string) int {
	return sort.Search(len(l.entries), func(i int) bool {
		e := l.entries[i]
		return e.size > size || (e.size == size && e.v.Name >= name)
	})
}

// from returns the entries with at least size bytes.
func (l *freeList) from(size int64) []freeEntry {
	i := sort.Search(len(l.entries), func(i int) bool { return l.entries[i].size >= size })
	return l.entries[i:]
}

func (s *store) addFree(v *corev1.PersistentVolume) {
	class, key := match.VolumeClass(v), match.ModesKey(v.Spec.AccessModes)
	byModes := s.free[class]
	if byModes == nil {
		byModes = map[string]*freeList{}
		s.free[class] = byModes
	}
	l := byModes[key]
	if l == nil {
		l = &freeList{modes: v.Spec.AccessModes}
		byModes[key] = l
	}
	size := match.Capacity(v)
	i := l.search(size, v.Name)
	l.entries = slices.Insert(l.entries, i, freeEntry{size: size, v: v})
}

func (s *store) removeFree(v *corev1.PersistentVolume) {
	class, key := match.VolumeClass(v), match.ModesKey(v.Spec.AccessModes)
	l := s.free[class][key]
	if l == nil {
		return
	}
	i := l.search(match.Capacity(v), v.Name)
	if i >= len(l.entries) || l.entries[i].v.Name != v.Name {
		// Not where its size says; look everywhere (never expected).
		i = slices.IndexFunc(l.entries, func(e freeEntry) bool { return e.v.Name == v.Name })
		if i < 0 {
			return
		}
	}
	l.entries = slices.Delete(l.entries, i, i+1)
	if len(l.entries) == 0 {
		delete(s.free[class], key)
		if len(s.free[class]) == 0 {
			delete(s.free, class)
		}
	}
}
