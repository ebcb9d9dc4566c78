package binder

import (
	"slices"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
)

// interner makes the cached volumes and claims share what most of them
// have in common. Decoded from protobuf, every object has its own copy of
// its class name, access modes, finalizers, annotations and, above all,
// its capacity: a one-entry ResourceList is a Go map of about 600 bytes,
// and a Bound claim holds two. With these shared, an object costs the
// binder less than half (BenchmarkStoreMemory100k).
//
// Sharing is safe because the store's objects are never modified (a
// change is a DeepCopy, then a new object from the API): strings are
// immutable, and shared slices are clipped (an append to one makes a new
// array). The transition table (TestTransitions) checks that every
// transition leaves the shared maps and slices as they were interned.
//
// Strings go through package unique (weakly held). Maps and slices go into
// tables keyed by their contents, each bounded by maxInterned entries: a
// full table starts over, so objects whose annotations are all different
// cost a table of bounded size, not one entry per object.
type interner struct {
	mu    sync.Mutex
	lists map[string]corev1.ResourceList
	maps  map[string]map[string]string
	modes map[string][]corev1.PersistentVolumeAccessMode
	strs  map[string][]string
}

const (
	// maxInterned bounds each table.
	maxInterned = 4096
	// maxInternedKey bounds the contents (in bytes) of a map or slice worth
	// sharing; larger ones are rare and left alone.
	maxInternedKey = 1024
)

func newInterner() *interner {
	return &interner{
		lists: map[string]corev1.ResourceList{},
		maps:  map[string]map[string]string{},
		modes: map[string][]corev1.PersistentVolumeAccessMode{},
		strs:  map[string][]string{},
	}
}

// volume makes v share its common parts. The caller owns v (fresh from
// the stream or an API response) and has not published it yet.
func (in *interner) volume(v *corev1.PersistentVolume) {
	in.meta(&v.Annotations, &v.Labels, &v.Finalizers)
	s := &v.Spec
	s.StorageClassName = str(s.StorageClassName)
	s.PersistentVolumeReclaimPolicy = str(s.PersistentVolumeReclaimPolicy)
	s.Capacity = in.list(s.Capacity)
	s.AccessModes = in.accessModes(s.AccessModes)
	s.MountOptions = in.strings(s.MountOptions)
	if s.VolumeMode != nil {
		*s.VolumeMode = str(*s.VolumeMode)
	}
	if r := s.ClaimRef; r != nil {
		r.Kind, r.APIVersion, r.Namespace = str(r.Kind), str(r.APIVersion), str(r.Namespace)
	}
	if c := s.CSI; c != nil {
		c.Driver, c.FSType = str(c.Driver), str(c.FSType)
		c.VolumeAttributes = in.stringMap(c.VolumeAttributes)
	}
	v.Status.Phase = str(v.Status.Phase)
}

// claim makes c share its common parts; see volume.
func (in *interner) claim(c *corev1.PersistentVolumeClaim) {
	c.Namespace = str(c.Namespace)
	in.meta(&c.Annotations, &c.Labels, &c.Finalizers)
	s := &c.Spec
	if s.StorageClassName != nil {
		*s.StorageClassName = str(*s.StorageClassName)
	}
	if s.VolumeMode != nil {
		*s.VolumeMode = str(*s.VolumeMode)
	}
	s.AccessModes = in.accessModes(s.AccessModes)
	s.Resources.Requests = in.list(s.Resources.Requests)
	s.Resources.Limits = in.list(s.Resources.Limits)
	st := &c.Status
	st.Phase = str(st.Phase)
	st.AccessModes = in.accessModes(st.AccessModes)
	st.Capacity = in.list(st.Capacity)
}

func (in *interner) meta(annotations, labels *map[string]string, finalizers *[]string) {
	*annotations = in.stringMap(*annotations)
	*labels = in.stringMap(*labels)
	*finalizers = in.strings(*finalizers)
}

func str[S ~string](s S) S {
	if s == "" {
		return s
	}
	return S(unique.Make(string(s)).Value())
}

// key appends a length-prefixed encoding of parts to buf: distinct
// contents never share a key. ok is false when the key grows past
// maxInternedKey.
func key(buf []byte, parts ...string) ([]byte, bool) {
	for _, p := range parts {
		buf = append(buf, byte(len(p)>>8), byte(len(p)))
		buf = append(buf, p...)
	}
	return buf, len(buf) <= maxInternedKey
}

// lookup returns table's entry for k, or stores and returns v (made by
// mk) when there is none, starting the table over when it is full.
func lookup[V any](in *interner, table map[string]V, k []byte, mk func() V) V {
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := table[string(k)]; ok {
		return v
	}
	if len(table) >= maxInterned {
		clear(table)
	}
	v := mk()
	table[string(k)] = v
	return v
}

func (in *interner) list(l corev1.ResourceList) corev1.ResourceList {
	var buf [64]byte
	if k, ok := listKey(buf[:0], l); ok {
		return lookup(in, in.lists, k, func() corev1.ResourceList { return l })
	}
	return l
}

func (in *interner) stringMap(m map[string]string) map[string]string {
	var buf [256]byte
	if k, ok := mapKey(buf[:0], m); ok {
		return lookup(in, in.maps, k, func() map[string]string {
			for name, value := range m {
				m[name] = str(value)
			}
			return m
		})
	}
	return m
}

func (in *interner) strings(s []string) []string {
	var buf [128]byte
	if k, ok := key(buf[:0], s...); ok && len(s) > 0 {
		return lookup(in, in.strs, k, func() []string { return slices.Clip(s) })
	}
	return s
}

func (in *interner) accessModes(m []corev1.PersistentVolumeAccessMode) []corev1.PersistentVolumeAccessMode {
	var buf [64]byte
	if k, ok := modesKey(buf[:0], m); ok {
		return lookup(in, in.modes, k, func() []corev1.PersistentVolumeAccessMode { return slices.Clip(m) })
	}
	return m
}

// listKey is the key of a one-entry resource list; ok is false for any
// other list (nothing to share).
func listKey(buf []byte, l corev1.ResourceList) ([]byte, bool) {
	if len(l) != 1 {
		return buf, false
	}
	ok := false
	for name, q := range l {
		buf, ok = key(buf, string(name), q.String())
	}
	return buf, ok
}

// mapKey is the key of a map of 1 to 8 entries, in the order of its keys;
// ok is false for any other map.
func mapKey(buf []byte, m map[string]string) ([]byte, bool) {
	if len(m) == 0 || len(m) > 8 {
		return buf, false
	}
	var names [8]string
	sorted := names[:0]
	for name := range m {
		sorted = append(sorted, name)
	}
	slices.Sort(sorted)
	ok := false
	for _, name := range sorted {
		buf, ok = key(buf, name, m[name])
	}
	return buf, ok
}

// modesKey is the key of a non-empty list of access modes.
func modesKey(buf []byte, m []corev1.PersistentVolumeAccessMode) ([]byte, bool) {
	ok := false
	for _, mode := range m {
		buf, ok = key(buf, string(mode))
	}
	return buf, ok
}
