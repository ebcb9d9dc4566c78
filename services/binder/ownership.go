package binder

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/watchclient"
)

// DefaultOwnershipSettle is how long a replica waits before acting on an
// object it did not own: long enough for the previous owner, whose view of
// the members may lag by a watch event, or whose lease the others saw
// expire a moment before it did, to have stopped.
const DefaultOwnershipSettle = 2 * time.Second

// ownership is this replica's share of the claims and volumes: the ring
// over the live binder members, as its own etcd session sees them. With no
// live session, or a member list that does not list this replica, it owns
// nothing. An object it gains (in a ring change, after a new session, at
// start) becomes its own only once every ring of the last settle period
// gave it to this replica, so that the replica that had it before has
// stopped; one it loses stops being its own at once.
type ownership struct {
	self   string
	settle time.Duration

	mu    sync.Mutex
	rings []ringSpan // oldest first; the last is current
	// listed is since when every ring has listed this replica; zero while
	// the current one does not.
	listed time.Time
	// live, when set (followMembers: the keeper's Ready), says whether the
	// etcd session is live now. Without one nothing is owned, from the
	// moment it is lost, not only once the member watch has noticed.
	live func() bool
	// shard, when set, is the claim shard the watcher stream carries: a
	// ring that lists this replica asks the stream for the claims it gives
	// this replica (a new stream, listing them).
	shard *watchclient.Shard
	// holds, when set (the shard's Holds), says whether the cache holds a
	// claim ("ns/name") by the last full list of the stream: a claim, and
	// the volumes it names, are owned only once it does. Nil: the cache
	// holds every claim.
	holds func(claimKey string) bool
}

// ringSpan is a ring in force from a time on; a nil ring owns nothing.
type ringSpan struct {
	ring    *coord.Ring
	members []string
	from    time.Time
}

func newOwnership(self string, settle time.Duration) *ownership {
	return &ownership{self: self, settle: settle, rings: []ringSpan{{from: time.Now()}}}
}

// set records the binder members the live session lists now.
func (o *ownership) set(ids []string) {
	s := ringSpan{members: slices.Clone(ids), from: time.Now()}
	if slices.Contains(ids, o.self) {
		s.ring = coord.NewRing(ids)
		if o.shard != nil {
			// Without the replica in the ring (no session) the stream keeps
			// the last shard: nothing is owned meanwhile anyway.
			o.shard.Set(ids, o.self)
		}
	}
	o.push(s)
}

// lose records that the session is lost: nothing is this replica's until
// a new session lists it again.
func (o *ownership) lose() { o.push(ringSpan{from: time.Now()}) }

func (o *ownership) push(s ringSpan) {
	o.mu.Lock()
	defer o.mu.Unlock()
	// Keep the spans that ended within the settle period.
	cut := s.from.Add(-o.settle)
	i := 0
	for i+1 < len(o.rings) && !o.rings[i+1].from.After(cut) {
		i++
	}
	o.rings = append(o.rings[i:], s)
	switch {
	case s.ring == nil:
		o.listed = time.Time{}
	case o.listed.IsZero():
		o.listed = s.from
	}
}

// owns reports whether key ("pvc/ns/name", "pv/name") is this replica's
// now. A claim key is owned only while the cache holds the claim's shard
// (a full list of it came in): a replica that gains claims in a ring
// change does nothing for them until it has them all.
func (o *ownership) owns(key string) bool {
	if o.holds != nil && strings.HasPrefix(key, "pvc/") && !o.holds(key[len("pvc/"):]) {
		return false
	}
	cut := time.Now().Add(-o.settle)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.live != nil && !o.live() {
		return false
	}
	for i := len(o.rings) - 1; i >= 0; i-- {
		s := o.rings[i]
		if s.ring == nil || s.ring.Owner(key) != o.self {
			return false
		}
		if !s.from.After(cut) {
			return true // in force for the whole settle period
		}
	}
	return false // the replica's first ring is younger than the settle period
}

// ready reports whether the replica has had, for the settle period, a
// live session whose member lists list it: it can act on what it owns.
// Changes of the other members do not make it unready.
func (o *ownership) ready() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.live != nil && !o.live() {
		return false
	}
	return !o.listed.IsZero() && time.Since(o.listed) >= o.settle
}

// check is the readiness check "membership": why ready is false, nil
// when it is true.
func (o *ownership) check() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.live != nil && !o.live():
		return errors.New("no etcd session lists this replica")
	case o.listed.IsZero():
		return errors.New("this replica is not in the binder members yet")
	case time.Since(o.listed) < o.settle:
		return fmt.Errorf("listed; waiting %s for the previous owners of its objects to stop", o.settle)
	}
	return nil
}

// volumeOwnerKey is the ownership key of a volume: its claim's
// ("pvc/ns/name") when its claimRef names one, so that the replica that
// decides about a bound or pre-bound volume (Released when its claim is
// gone) is the one whose cache holds that claim's shard; "pv/name" for a
// volume no claim names, which every replica's cache holds.
func volumeOwnerKey(v *corev1.PersistentVolume) string {
	if r := v.Spec.ClaimRef; r != nil && r.Name != "" {
		return "pvc/" + refKey(r)
	}
	return "pv/" + v.Name
}

// follow makes live decide, with the member list, what is owned.
func (o *ownership) follow(live func() bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.live = live
}

// current is the ring in force, or a ring of this replica alone while it
// has none (for the forwarding of API calls, which decides nothing).
func (o *ownership) current() *coord.Ring {
	o.mu.Lock()
	defer o.mu.Unlock()
	if r := o.rings[len(o.rings)-1].ring; r != nil {
		return r
	}
	return coord.NewRing([]string{o.self})
}

// members lists the members of the ring in force.
func (o *ownership) members() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.rings[len(o.rings)-1].members)
}
