package binder

import (
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
)

// store is the binder's cache of volumes, claims and classes, with the
// indexes the state machine needs. Objects in it are never modified: a
// change replaces the pointer.
type store struct {
	mu      sync.RWMutex
	volumes map[string]*corev1.PersistentVolume
	claims  map[string]*corev1.PersistentVolumeClaim
	classes map[string]*storagev1.StorageClass

	// free: volumes without a claimRef, by class and set of access modes,
	// in (capacity, name) order.
	free map[string]map[string]*freeList
	// byClaimRef: volumes by the "namespace/name" their claimRef names.
	byClaimRef map[string]map[string]*corev1.PersistentVolume
	// unboundByClass: claims without bind-completed and without a
	// volumeName, by class.
	unboundByClass map[string]map[string]*corev1.PersistentVolumeClaim
	// waitingFor: claims without bind-completed whose volumeName is set, by
	// that volume name.
	waitingFor map[string]map[string]struct{}
	// reserved: volumes this replica is binding now, with the claim's UID.
	reserved map[string]types.UID
	// foreign: volumes another replica holds in etcd, skipped until the
	// deadline (or until the volume changes) so that this replica's claims
	// try other volumes instead of queueing on one.
	foreign map[string]time.Time
	// volumeTombs, claimTombs: objects an API response said are gone
	// before the watch did, by UID, so that watch events still on their
	// way (sent before the deletion) do not bring them back.
	volumeTombs, claimTombs tombstones
	// gone: the UIDs of volumes and claims whose deletion was seen; their
	// events never enter the cache again (see goneUIDs).
	gone goneUIDs
	// responded: the versions API responses gave this replica
	// (refreshVolume, refreshClaim), for the foreign-binder check.
	responded versions
	// shared: what the cached objects have in common, held once.
	shared *interner
}

func newStore() *store {
	return &store{
		volumes:        map[string]*corev1.PersistentVolume{},
		claims:         map[string]*corev1.PersistentVolumeClaim{},
		classes:        map[string]*storagev1.StorageClass{},
		free:           map[string]map[string]*freeList{},
		byClaimRef:     map[string]map[string]*corev1.PersistentVolume{},
		unboundByClass: map[string]map[string]*corev1.PersistentVolumeClaim{},
		waitingFor:     map[string]map[string]struct{}{},
		reserved:       map[string]types.UID{},
		foreign:        map[string]time.Time{},
		volumeTombs:    tombstones{},
		claimTombs:     tombstones{},
		shared:         newInterner(),
	}
}

func claimKey(c *corev1.PersistentVolumeClaim) string { return c.Namespace + "/" + c.Name }

func refKey(r *corev1.ObjectReference) string { return r.Namespace + "/" + r.Name }

// notOlder reports whether resourceVersion a is at least b. Unparsable
// versions count as newer: the API server's word wins.
func notOlder(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return true
	}
	return x >= y
}

func addTo[T any](m map[string]map[string]T, outer, inner string, v T) {
	s := m[outer]
	if s == nil {
		s = map[string]T{}
		m[outer] = s
	}
	s[inner] = v
}

func removeFrom[T any](m map[string]map[string]T, outer, inner string) {
	if s := m[outer]; s != nil {
		delete(s, inner)
		if len(s) == 0 {
			delete(m, outer)
		}
	}
}

// putVolume stores v as the watch delivered it, unless the cache already
// holds a newer version of the same volume, or v is a volume an API
// response said is gone (its tombstone). It returns the version now cached,
// nil when v was ignored as gone.
func (s *store) putVolume(v *corev1.PersistentVolume) *corev1.PersistentVolume {
	v = kube.Slim(v) // see putClaim
	s.shared.volume(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.has(v.UID) || !s.volumeTombs.admit(v.Name, v.UID) {
		return nil
	}
	old := s.volumes[v.Name]
	if old != nil {
		if old.UID == v.UID && !notOlder(v.ResourceVersion, old.ResourceVersion) {
			return old
		}
		s.unindexVolume(old)
	}
	s.insertVolume(v)
	return v
}

func (s *store) insertVolume(v *corev1.PersistentVolume) {
	delete(s.foreign, v.Name)
	s.volumes[v.Name] = v
	if v.Spec.ClaimRef == nil {
		s.addFree(v)
	} else {
		addTo(s.byClaimRef, refKey(v.Spec.ClaimRef), v.Name, v)
	}
}

// refreshVolume takes a volume from an API response (an update's answer or
// a fresh read). It replaces the cached entry when that is the same volume
// (UID) at an older resourceVersion, and adds a volume the cache does not
// hold yet unless its deletion was seen (a response never brings one
// back). Adding matters for a volume the provisioner just created and this
// replica bound at once: had only its watch event added it, the cache
// would hold the version from before the bind until the next event, and a
// sync of the volume would write against it, conflict, and retry for as
// long as the stream lags (the PV status PUTs the dynamic bench counted 4
// to 9 times per claim). It returns the newest version known, cached or
// not.
func (s *store) refreshVolume(v *corev1.PersistentVolume) *corev1.PersistentVolume {
	s.responded.add(v.UID, v.ResourceVersion)
	v = kube.Slim(v)
	s.shared.volume(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.volumes[v.Name]
	if old == nil {
		if !s.gone.has(v.UID) && s.volumeTombs.admit(v.Name, v.UID) {
			s.insertVolume(v)
		}
		return v
	}
	if old.UID != v.UID {
		return v
	}
	if !notOlder(v.ResourceVersion, old.ResourceVersion) {
		return old
	}
	s.unindexVolume(old)
	s.insertVolume(v)
	return v
}

// dropVolume removes a volume the API says is gone (NotFound), before the
// watch says so, and remembers it so that late watch events of it are
// ignored. A cached volume with another UID is left alone.
func (s *store) dropVolume(name string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.volumes[name]
	if old != nil && old.UID != uid {
		return
	}
	if old != nil {
		s.unindexVolume(old)
		delete(s.volumes, name)
		delete(s.foreign, name)
	}
	s.volumeTombs.add(name, uid, old)
	s.gone.add(uid)
}

func (s *store) unindexVolume(v *corev1.PersistentVolume) {
	if v.Spec.ClaimRef == nil {
		s.removeFree(v)
	} else {
		removeFrom(s.byClaimRef, refKey(v.Spec.ClaimRef), v.Name)
	}
}

// deleteVolume removes a volume the watch says is deleted. uid is the
// deleted object's, from the watch event: that deletion is confirmed, and
// the UID never enters the cache again; a cached volume of another UID is
// newer than the deletion and stays. An empty uid (a relist did not
// mention the volume) removes whatever is cached and confirms nothing. It
// returns the last version known, from the cache or from the tombstone an
// API response left, nil when neither knew it.
func (s *store) deleteVolume(name string, uid types.UID) *corev1.PersistentVolume {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone.add(uid)
	old := s.volumes[name]
	if old != nil && uid != "" && old.UID != uid {
		return nil
	}
	if old != nil {
		s.unindexVolume(old)
		delete(s.volumes, name)
		delete(s.foreign, name)
	}
	if last := s.volumeTombs.clear(name); old == nil {
		if v, ok := last.(*corev1.PersistentVolume); ok {
			old = v
		}
	}
	return old
}

func (s *store) volume(name string) *corev1.PersistentVolume {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.volumes[name]
}

// putClaim stores c as the watch delivered it, unless the cache already
// holds a newer version of the same claim, or c is a claim an API response
// said is gone (its tombstone). It returns the version now cached, nil when
// c was ignored as gone.
func (s *store) putClaim(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	// Objects the API returns carry managedFields, often most of their
	// bytes; the binder never reads them, and an update without them leaves
	// the server's as they are (kube.Slim). The caller hands over
	// the object, and its common parts are shared from then on (interner).
	c = kube.Slim(c)
	s.shared.claim(c)
	key := claimKey(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.has(c.UID) || !s.claimTombs.admit(key, c.UID) {
		return nil
	}
	old := s.claims[key]
	if old != nil {
		if old.UID == c.UID && !notOlder(c.ResourceVersion, old.ResourceVersion) {
			return old
		}
		s.unindexClaim(old)
	}
	s.insertClaim(key, c)
	return c
}

func (s *store) insertClaim(key string, c *corev1.PersistentVolumeClaim) {
	s.claims[key] = c
	if _, done := c.Annotations[kube.AnnBindCompleted]; !done {
		if c.Spec.VolumeName == "" {
			addTo(s.unboundByClass, match.ClaimClass(c), key, c)
		} else {
			addTo(s.waitingFor, c.Spec.VolumeName, key, struct{}{})
		}
	}
}

// refreshClaim takes a claim from an API response; see refreshVolume: it
// only ever updates the cached entry of the same claim (UID).
func (s *store) refreshClaim(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	s.responded.add(c.UID, c.ResourceVersion)
	c = kube.Slim(c)
	s.shared.claim(c)
	key := claimKey(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.claims[key]
	if old == nil || old.UID != c.UID {
		return c
	}
	if !notOlder(c.ResourceVersion, old.ResourceVersion) {
		return old
	}
	s.unindexClaim(old)
	s.insertClaim(key, c)
	return c
}

// dropClaim removes a claim the API says is gone; see dropVolume.
func (s *store) dropClaim(key string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.claims[key]
	if old != nil && old.UID != uid {
		return
	}
	if old != nil {
		s.unindexClaim(old)
		delete(s.claims, key)
	}
	s.claimTombs.add(key, uid, old)
	s.gone.add(uid)
}

func (s *store) unindexClaim(c *corev1.PersistentVolumeClaim) {
	key := claimKey(c)
	removeFrom(s.unboundByClass, match.ClaimClass(c), key)
	if c.Spec.VolumeName != "" {
		removeFrom(s.waitingFor, c.Spec.VolumeName, key)
	}
}

// deleteClaim removes a claim the watch says is deleted; see deleteVolume.
func (s *store) deleteClaim(key string, uid types.UID) *corev1.PersistentVolumeClaim {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone.add(uid)
	old := s.claims[key]
	if old != nil && uid != "" && old.UID != uid {
		return nil
	}
	if old != nil {
		s.unindexClaim(old)
		delete(s.claims, key)
	}
	if last := s.claimTombs.clear(key); old == nil {
		if c, ok := last.(*corev1.PersistentVolumeClaim); ok {
			old = c
		}
	}
	return old
}

// forgetClaim removes a claim the cache stops holding although it lives
// (it left the replica's shard): no tombstone, nothing marked gone, so it
// enters again when the shard gives it back.
func (s *store) forgetClaim(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.claims[key]; old != nil {
		s.unindexClaim(old)
		delete(s.claims, key)
	}
}

func (s *store) claim(key string) *corev1.PersistentVolumeClaim {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.claims[key]
}

func (s *store) putClass(c *storagev1.StorageClass) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.classes[c.Name]; old != nil && old.UID == c.UID && !notOlder(c.ResourceVersion, old.ResourceVersion) {
		return
	}
	s.classes[c.Name] = c
}

// classNames lists the cached classes' names.
func (s *store) classNames() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Collect(maps.Keys(s.classes))
}

func (s *store) deleteClass(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.classes, name)
}

func (s *store) class(name string) *storagev1.StorageClass {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.classes[name]
}

// defaultClass is the newest class marked default (ties broken by name), as
// Kubernetes chooses it; nil when there is none.
func (s *store) defaultClass() *storagev1.StorageClass {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var best *storagev1.StorageClass
	for _, c := range s.classes {
		if c.Annotations[kube.AnnDefaultStorageClass] != "true" && c.Annotations[kube.AnnBetaDefaultStorageClass] != "true" {
			continue
		}
		if best == nil || c.CreationTimestamp.After(best.CreationTimestamp.Time) ||
			(c.CreationTimestamp.Equal(&best.CreationTimestamp) && c.Name < best.Name) {
			best = c
		}
	}
	return best
}

// unboundClaimsFor lists the keys of claims waiting for a volume that v
// could serve (same class, enough capacity, compatible modes), and of claims
// that asked for v by name.
func (s *store) unboundClaimsFor(v *corev1.PersistentVolume) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var keys []string
	for k := range s.waitingFor[v.Name] {
		keys = append(keys, k)
	}
	if v.Spec.ClaimRef != nil {
		return append(keys, refKey(v.Spec.ClaimRef))
	}
	size := match.Capacity(v)
	for k, c := range s.unboundByClass[match.VolumeClass(v)] {
		if match.ContainsAllModes(v.Spec.AccessModes, c.Spec.AccessModes) && !match.VolumeModeMismatch(c, v) {
			q := c.Spec.Resources.Requests[corev1.ResourceStorage]
			if q.Value() <= size {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// unboundClaimsOfClass lists the keys of claims of a class still waiting
// for a volume.
func (s *store) unboundClaimsOfClass(class string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	keys := make([]string, 0, len(s.unboundByClass[class]))
	for k := range s.unboundByClass[class] {
		keys = append(keys, k)
	}
	return keys
}

// volumesClaimedBy lists volumes whose claimRef names the claim key.
func (s *store) volumesClaimedBy(key string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.byClaimRef[key]))
	for n := range s.byClaimRef[key] {
		names = append(names, n)
	}
	return names
}

// snapshot lists every claim key and volume name, sorted.
func (s *store) snapshot() (claims, volumes []string) {
	s.mu.RLock()
	claims = make([]string, 0, len(s.claims))
	for k := range s.claims {
		claims = append(claims, k)
	}
	volumes = make([]string, 0, len(s.volumes))
	for k := range s.volumes {
		volumes = append(volumes, k)
	}
	s.mu.RUnlock()
	sort.Strings(claims)
	sort.Strings(volumes)
	return claims, volumes
}

// eachClaim calls fn with every cached claim, its key and its
// StorageClass (nil when none is cached), under the read lock: fn must not
// call the store.
func (s *store) eachClaim(fn func(key string, c *corev1.PersistentVolumeClaim, class *storagev1.StorageClass)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for k, c := range s.claims {
		fn(k, c, s.classes[match.ClaimClass(c)])
	}
}

// eachVolume calls fn with every cached volume under the read lock: fn
// must not call the store.
func (s *store) eachVolume(fn func(v *corev1.PersistentVolume)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, v := range s.volumes {
		fn(v)
	}
}

func (s *store) counts() (claims, volumes int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.claims), len(s.volumes)
}

// endTombstones ends the tombstones of objects a full list did not
// mention: the watch now agrees they are gone.
func (s *store) endTombstones(claimsListed, volumesListed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.claimTombs {
		if !claimsListed[k] {
			delete(s.claimTombs, k)
		}
	}
	for k := range s.volumeTombs {
		if !volumesListed[k] {
			delete(s.volumeTombs, k)
		}
	}
}
