package watcher

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/coord"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// Two subscribers with the two shards of a group of two together receive
// every claim exactly once, in the list and live, and each the claims the
// binder's ring gives its member; volumes and classes go to both; a
// subscriber without a shard (an old binder) gets every claim.
func TestClaimShardSplitsTheClaims(t *testing.T) {
	h, s, _ := newTestServer(10_000, true)
	members := []string{"binder-a", "binder-b"}
	ring := coord.NewRing(members)
	const n = 200
	for i := range n {
		key := fmt.Sprintf("ns/c%d", i)
		h.append(typeAdded, kindPVC, key, claim("ns", fmt.Sprintf("c%d", i), "1"), "1")
	}
	addPVs(h, "pv", 3)
	h.append(typeAdded, kindClass, "gold", class("gold", "1"), "1")
	seq := uint64(n + 4)

	subs := map[string]*subscriber{}
	for _, m := range members {
		subs[m] = watch(t, s, &watcherv1.WatchRequest{ClaimShard: &watcherv1.ClaimShard{Members: members, Member: m}})
	}
	all := watch(t, s, &watcherv1.WatchRequest{})
	if got := len(expectList(t, h, all, seq)); got != n+4 {
		t.Fatalf("unfiltered list: %d objects, want %d", got, n+4)
	}
	seen := map[string]string{}
	for m, sub := range subs {
		others := 0
		for _, k := range expectList(t, h, sub, seq) {
			if !strings.HasPrefix(k, "ns/") {
				others++
				continue
			}
			if owner := ring.Owner("pvc/" + k); owner != m {
				t.Errorf("%s was sent claim %s of %s", m, k, owner)
			}
			if prev, dup := seen[k]; dup {
				t.Errorf("claim %s sent to %s and %s", k, prev, m)
			}
			seen[k] = m
		}
		if others != 4 {
			t.Errorf("%s: %d volumes and classes listed, want 4", m, others)
		}
	}
	if len(seen) != n {
		t.Fatalf("the shards listed %d claims together, want %d", len(seen), n)
	}

	// Live: each event reaches the owner's stream only; a volume reaches
	// both.
	for i := range 20 {
		key := fmt.Sprintf("ns/c%d", i)
		seq++
		h.append(typeUpdated, kindPVC, key, claim("ns", fmt.Sprintf("c%d", i), "2"), "2")
		owner := ring.Owner("pvc/" + key)
		expectEvent(t, h, subs[owner].recv(), typeUpdated, key, seq)
		expectEvent(t, h, all.recv(), typeUpdated, key, seq)
	}
	seq++
	h.append(typeAdded, kindPV, "late", volume("late", "1"), "1")
	for _, m := range members {
		// The claims of the other shard were skipped, not sent.
		expectEvent(t, h, subs[m].recv(), typeAdded, "late", seq)
	}
}

// A group of one member keeps every claim.
func TestClaimShardOfOneMemberSendsEveryClaim(t *testing.T) {
	h, s, _ := newTestServer(100, true)
	for i := range 10 {
		h.append(typeAdded, kindPVC, fmt.Sprintf("ns/c%d", i), claim("ns", fmt.Sprintf("c%d", i), "1"), "1")
	}
	sub := watch(t, s, &watcherv1.WatchRequest{ClaimShard: &watcherv1.ClaimShard{Members: []string{"only"}, Member: "only"}})
	if got := len(expectList(t, h, sub, 10)); got != 10 {
		t.Fatalf("listed %d claims, want 10", got)
	}
}

// A shard is input from the network: every way past its bounds is
// refused with InvalidArgument and a message naming the field and the fix,
// before the stream starts.
func TestClaimShardIsValidated(t *testing.T) {
	many := make([]string, MaxShardMembers+1)
	for i := range many {
		many[i] = fmt.Sprintf("m%d", i)
	}
	long := strings.Repeat("x", MaxShardMemberID+1)
	for _, tc := range []struct {
		name  string
		shard *watcherv1.ClaimShard
		want  string
	}{
		{"no members", &watcherv1.ClaimShard{Member: "a"}, "claim_shard.members: empty"},
		{"too many members", &watcherv1.ClaimShard{Members: many, Member: "m0"}, "at most 1024"},
		{"empty member ID", &watcherv1.ClaimShard{Members: []string{"a", ""}, Member: "a"}, "claim_shard.members[1]: empty"},
		{"member ID too long", &watcherv1.ClaimShard{Members: []string{"a", long}, Member: "a"}, "claim_shard.members[1]: 254 bytes, at most 253"},
		{"member twice", &watcherv1.ClaimShard{Members: []string{"a", "b", "a"}, Member: "a"}, `"a" is listed twice`},
		{"member not listed", &watcherv1.ClaimShard{Members: []string{"a", "b"}, Member: "c"}, "claim_shard.member: \"c\" is not one of"},
		{"no member", &watcherv1.ClaimShard{Members: []string{"a", "b"}}, "claim_shard.member"},
		{"long member not listed", &watcherv1.ClaimShard{Members: []string{"a"}, Member: long + long}, "is not one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, s, _ := newTestServer(10, true)
			h.append(typeAdded, kindPVC, "ns/c", claim("ns", "c", "1"), "1")
			err := watch(t, s, &watcherv1.WatchRequest{ClaimShard: tc.shard}).end()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.want)
			}
			if len(status.Convert(err).Message()) > 2*MaxShardMemberID+200 {
				t.Fatalf("message not bounded: %d bytes", len(status.Convert(err).Message()))
			}
			if h.subscribers != 0 {
				t.Fatalf("a refused subscriber is counted: %d", h.subscribers)
			}
		})
	}
}
