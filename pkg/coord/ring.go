package coord

import (
	"hash/fnv"
	"slices"
)

// Ring assigns every key to one member by rendezvous (highest random
// weight) hashing: each key goes to the member whose hash with the key is
// highest, so when a member joins or leaves only the keys it gains or
// loses move. The zero Ring owns nothing.
type Ring struct {
	members []string
	seeds   []uint64
}

// NewRing returns a ring over the member IDs (order does not matter).
func NewRing(ids []string) *Ring {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	r := &Ring{members: ids, seeds: make([]uint64, len(ids))}
	for i, id := range ids {
		h := fnv.New64a()
		h.Write([]byte(id))
		r.seeds[i] = h.Sum64()
	}
	return r
}

// Members returns the member IDs, sorted.
func (r *Ring) Members() []string { return slices.Clone(r.members) }

// Owner returns the member that owns key, or "" for an empty ring.
func (r *Ring) Owner(key string) string {
	if len(r.members) == 0 {
		return ""
	}
	if len(r.members) == 1 {
		return r.members[0]
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	k := h.Sum64()
	best, bestW := 0, uint64(0)
	for i, s := range r.seeds {
		if w := mix(k ^ s); i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return r.members[best]
}

// mix is the splitmix64 finalizer: it spreads the combined hash so that
// weights are independent per member.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
