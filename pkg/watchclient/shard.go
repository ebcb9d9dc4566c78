package watchclient

import (
	"errors"
	"slices"
	"sync"

	"github.com/volplane/volplane/pkg/coord"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// Shard is the claim shard a subscription asks for
// (WatchRequest.claim_shard): the claims that rendezvous hashing over a
// group's members (coord.Ring, keys "pvc/<namespace>/<name>") gives one
// member. It may change while the subscription runs; the stream then
// starts over with a full list of the new shard, which the Feed applies as
// a replace. Listed says which shard the handler's view holds. Safe for
// concurrent use.
type Shard struct {
	mu      sync.Mutex
	want    *watcherv1.ClaimShard // nil until Set
	changed chan struct{}         // closed and replaced by a Set that changes want
	listed  *listedShard          // the shard of the last full list delivered
	stream  *listedShard          // the shard of the stream under way
	// onListed is called after each full list delivered; nil: nothing.
	onListed func()
}

// listedShard is a shard a full list was delivered for.
type listedShard struct {
	ring   *coord.Ring
	member string
}

// NewShard returns a shard not set yet: a subscription that uses it waits
// for the first Set before it opens a stream.
func NewShard() *Shard { return &Shard{changed: make(chan struct{})} }

// Set asks for the claims that members' ring gives member. An unchanged
// shard (the same members in any order) changes nothing; a new one ends
// the stream under way, which starts over without a cursor.
func (s *Shard) Set(members []string, member string) {
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.want != nil && s.want.GetMember() == member && slices.Equal(s.want.GetMembers(), ms) {
		return
	}
	s.want = &watcherv1.ClaimShard{Members: ms, Member: member}
	close(s.changed)
	s.changed = make(chan struct{})
}

// wanted returns the shard to ask for (nil before the first Set) and a
// channel closed when it changes.
func (s *Shard) wanted() (*watcherv1.ClaimShard, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.want, s.changed
}

// opened records that a stream of shard want is under way.
func (s *Shard) opened(want *watcherv1.ClaimShard) {
	l := &listedShard{ring: coord.NewRing(want.GetMembers()), member: want.GetMember()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream = l
}

// OnListed sets fn to be called after each full list delivered, once
// Holds answers from it: a subscriber that acts only on what Holds allows
// looks again at what it gained.
func (s *Shard) OnListed(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onListed = fn
}

// delivered records that the handler has applied a full list of shard
// want.
func (s *Shard) delivered(want *watcherv1.ClaimShard) {
	l := &listedShard{ring: coord.NewRing(want.GetMembers()), member: want.GetMember()}
	s.mu.Lock()
	s.listed = l
	fn := s.onListed
	s.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// Holds reports whether the handler's view holds the claim key
// ("namespace/name") by the last full list delivered: the list was of a
// shard that includes it. False before the first full list.
func (s *Shard) Holds(claimKey string) bool {
	s.mu.Lock()
	l := s.listed
	s.mu.Unlock()
	return l != nil && l.ring.Owner("pvc/"+claimKey) == l.member
}

// Streams reports whether the stream under way (or last opened) is of a
// shard that includes the claim key. At a full list's SYNCED, a claim the
// view holds that the list did not mention, and that the stream's shard
// does not include, left the shard: it is not known to be deleted.
func (s *Shard) Streams(claimKey string) bool {
	s.mu.Lock()
	l := s.stream
	s.mu.Unlock()
	return l != nil && l.ring.Owner("pvc/"+claimKey) == l.member
}

// Listed returns the members and member of the shard of the last full
// list delivered; empty before the first.
func (s *Shard) Listed() (members []string, member string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listed == nil {
		return nil, ""
	}
	return s.listed.ring.Members(), s.listed.member
}

// errReshard ends a stream whose shard changed.
var errReshard = errors.New("the claim shard changed")
