package watcher

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/coord"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// Bounds of a WatchRequest.claim_shard: it comes from the network, and the
// watcher hashes every claim with every member.
const (
	MaxShardMembers  = 1024
	MaxShardMemberID = 253
)

// claimShard is a subscriber's claim filter; nil sends every claim.
type claimShard struct {
	ring   *coord.Ring
	member string
}

// parseShard validates a WatchRequest.claim_shard; nil gives nil.
func parseShard(s *watcherv1.ClaimShard) (*claimShard, error) {
	if s == nil {
		return nil, nil
	}
	ms := s.GetMembers()
	switch {
	case len(ms) == 0:
		return nil, status.Error(codes.InvalidArgument, "claim_shard.members: empty; list the IDs of the members the claims are divided among, or leave claim_shard unset for every claim")
	case len(ms) > MaxShardMembers:
		return nil, status.Errorf(codes.InvalidArgument, "claim_shard.members: %d members, at most %d are allowed", len(ms), MaxShardMembers)
	}
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		switch {
		case m == "":
			return nil, status.Errorf(codes.InvalidArgument, "claim_shard.members[%d]: empty; every member ID has 1 to %d bytes", i, MaxShardMemberID)
		case len(m) > MaxShardMemberID:
			return nil, status.Errorf(codes.InvalidArgument, "claim_shard.members[%d]: %d bytes, at most %d are allowed", i, len(m), MaxShardMemberID)
		case seen[m]:
			return nil, status.Errorf(codes.InvalidArgument, "claim_shard.members[%d]: %q is listed twice; list each member once", i, m)
		}
		seen[m] = true
	}
	if !seen[s.GetMember()] {
		return nil, status.Errorf(codes.InvalidArgument, "claim_shard.member: %q is not one of claim_shard.members; name the member whose claims to send", truncate(s.GetMember(), MaxShardMemberID))
	}
	return &claimShard{ring: coord.NewRing(ms), member: s.GetMember()}, nil
}

// sends reports whether an event of kind and key goes to the subscriber.
func (s *claimShard) sends(kind watcherv1.Kind, key string) bool {
	return s == nil || kind != watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM || s.ring.Owner("pvc/"+key) == s.member
}

// String describes the shard for the logs.
func (s *claimShard) String() string {
	if s == nil {
		return "all"
	}
	return s.member + " of " + strings.Join(s.ring.Members(), ",")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
