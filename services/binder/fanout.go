package binder

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/paging"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// With --claims-by-shard each replica's cache holds only the claims of its
// shard, so ListClaims asks every replica of the ring for its part of the
// page and merges the parts (fanOutClaims). The page token is the one
// pkg/paging issues for a single cache (the key the page ends at): a part
// is the first page_size claims of one shard after that key, so the first
// page_size claims of the parts merged are the first page_size claims of
// the whole list after it, and another page exists when the merged parts
// hold more, or a part said its shard has more.
//
// Exactly once: the replica that answers (the coordinator) names the ring
// its own cache was listed for (watchclient.Shard.Listed); each replica
// answers only when its cache was listed for that very ring, and only with
// the claims that ring gives it. Every claim key has exactly one owner in
// a ring, so no claim is listed twice, and none is missed by a replica
// that has not listed its shard yet: during a membership change the list
// is Unavailable (retry), never silently partial. So is it when a replica
// of the ring cannot be reached, naming it.

// claimShardHeader carries, on a ListClaims call from one binder replica
// to another, the members of the ring whose shard the caller asks for
// (one value per member). Only binder replicas may send it.
const claimShardHeader = "volplane-claim-shard"

// maxListReplicas bounds the replicas one ListClaims asks: a ring of more
// members is refused rather than fanned out to.
const maxListReplicas = 16

// peerListTimeout bounds each replica's answer to a fanned-out ListClaims
// (a part is at most paging.MaxSize claims from memory).
const peerListTimeout = 15 * time.Second

// claimShard is what the API needs of the claim shard the cache holds
// (watchclient.Shard).
type claimShard interface {
	// Listed is the ring members, and this member, of the last full list
	// of claims the cache holds.
	Listed() (members []string, member string)
	// Holds reports whether the cache holds claim key ("ns/name") by that
	// list.
	Holds(claimKey string) bool
}

// claimFilters are ListClaims' filters as pkg/paging fingerprints them.
func claimFilters(req *binderv1.ListClaimsRequest) []string {
	return []string{"namespace", req.GetNamespace(), "phase", req.GetPhase(), "class", req.GetStorageClassName(), "driver", req.GetDriver()}
}

// askedShard returns the ring members a ListClaims call from another
// replica asks for the shard of, and whether it asks for one.
func askedShard(ctx context.Context) ([]string, bool) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return nil, false
	}
	ms := md.Get(claimShardHeader)
	return ms, len(ms) > 0
}

// peerAllowed reports whether the caller of ctx may ask for this
// replica's shard alone: another binder replica (its certificate), or
// anyone over plaintext, where no caller is checked at all.
func (a *api) peerAllowed(ctx context.Context) bool {
	if a.peers != nil && a.peers.tls.InsecurePlaintext {
		return true
	}
	return callers.Identity(ctx) == callers.Binder
}

// sameRing reports whether the members (any order) are the ring the cache
// was listed for, with this replica in it.
func (a *api) sameRing(members []string) (listed []string, ok bool) {
	listed, self := a.shard.Listed()
	want := slices.Clone(members)
	slices.Sort(want)
	have := slices.Clone(listed)
	slices.Sort(have)
	return listed, self == a.memberID && slices.Equal(want, have)
}

// shardClaims answers another replica's ListClaims for this replica's
// shard of the ring members.
func (a *api) shardClaims(ctx context.Context, req *binderv1.ListClaimsRequest, members []string) (*binderv1.ListClaimsResponse, error) {
	if !a.peerAllowed(ctx) {
		return nil, status.Errorf(codes.PermissionDenied, "only %s replicas may ask for one replica's shard of the claims (the %s header); %q may not: call ListClaims without it",
			callers.Binder, claimShardHeader, callers.Identity(ctx))
	}
	if len(members) > maxListReplicas {
		return nil, status.Errorf(codes.InvalidArgument, "%s names %d members: at most %d", claimShardHeader, len(members), maxListReplicas)
	}
	return a.ownShardClaims(req, members)
}

// ownShardClaims is this replica's part of a page over the ring members:
// Unavailable when its cache holds another ring's shard. A replica that
// caches every claim (--claims-by-shard=false, while the flag is being
// changed replica by replica) holds every ring's shard.
func (a *api) ownShardClaims(req *binderv1.ListClaimsRequest, members []string) (*binderv1.ListClaimsResponse, error) {
	if a.shard == nil {
		ring := coord.NewRing(members)
		return a.localClaims(req, func(key string) bool { return ring.Owner("pvc/"+key) == a.memberID })
	}
	listed, ok := a.sameRing(members)
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "binder replica %s holds the claims of the ring %v and was asked for those of %v: membership is changing, retry shortly",
			a.memberID, listed, members)
	}
	ring := coord.NewRing(members)
	resp, err := a.localClaims(req, func(key string) bool { return ring.Owner("pvc/"+key) == a.memberID })
	if err != nil {
		return nil, err
	}
	// The shard may have moved while the cache was read.
	if listed, ok := a.sameRing(members); !ok {
		return nil, status.Errorf(codes.Unavailable, "binder replica %s moved to the claims of the ring %v while listing those of %v: membership is changing, retry shortly",
			a.memberID, listed, members)
	}
	return resp, nil
}

// fanOutClaims is a page of the claims of every replica's shard, in key
// order: this replica's and each other's (asked at once), merged.
func (a *api) fanOutClaims(ctx context.Context, req *binderv1.ListClaimsRequest) (*binderv1.ListClaimsResponse, error) {
	size, err := paging.Size(req.GetPageSize())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	members, self := a.shard.Listed()
	switch {
	case self == "" || len(members) == 0:
		return nil, status.Errorf(codes.Unavailable, "binder replica %s has not listed its shard of the claims yet: retry shortly", a.memberID)
	case len(members) > maxListReplicas:
		return nil, status.Errorf(codes.FailedPrecondition, "listing the claims asks every binder replica, at most %d, and there are %d: run fewer replicas, or the binders with --claims-by-shard=false",
			maxListReplicas, len(members))
	}
	parts := make([]*binderv1.ListClaimsResponse, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	own := -1
	for i, m := range members {
		if m == a.memberID {
			own = i
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[i], errs[i] = a.peerClaims(ctx, m, req, members)
		}()
	}
	if own >= 0 {
		parts[own], errs[own] = a.ownShardClaims(req, members)
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	claims, more := mergeClaimPages(size, parts)
	resp := &binderv1.ListClaimsResponse{Claims: claims}
	if more {
		last := claims[len(claims)-1]
		resp.NextPageToken = paging.NewCursor(claimsList, claimFilters(req)...).Token(last.GetNamespace() + "/" + last.GetName())
	}
	return resp, nil
}

// peerClaims asks replica id for its part of the page over the ring
// members. Any failure is Unavailable and names the replica: a list
// missing a shard is never answered.
func (a *api) peerClaims(ctx context.Context, id string, req *binderv1.ListClaimsRequest, members []string) (*binderv1.ListClaimsResponse, error) {
	if a.peers == nil {
		return nil, status.Errorf(codes.Unavailable, "binder replica %s holds a shard of the claims, and this replica cannot reach the others", id)
	}
	client, addr, err := a.peers.client(id)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list the claims of binder replica %s: %v", id, err)
	}
	kv := make([]string, 0, 2*len(members))
	for _, m := range members {
		kv = append(kv, claimShardHeader, m)
	}
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(a.peers.forwardContext(ctx), kv...), peerListTimeout)
	defer cancel()
	resp, err := client.ListClaims(cctx, req)
	if err != nil {
		st := status.Convert(err)
		return nil, status.Errorf(codes.Unavailable, "list the claims of binder replica %s at %s: %s: %s", id, addr, st.Code(), st.Message())
	}
	return resp, nil
}

// mergeClaimPages merges parts of one page (each the first claims of one
// shard after the same key, in key order, with a next token when its shard
// has more) into the page of size: the smallest keys, sorted, each once,
// and whether another page exists.
func mergeClaimPages(size int, parts []*binderv1.ListClaimsResponse) (claims []*binderv1.Claim, more bool) {
	for _, p := range parts {
		claims = append(claims, p.GetClaims()...)
		more = more || p.GetNextPageToken() != ""
	}
	key := func(c *binderv1.Claim) string { return c.GetNamespace() + "/" + c.GetName() }
	slices.SortStableFunc(claims, func(x, y *binderv1.Claim) int { return strings.Compare(key(x), key(y)) })
	claims = slices.CompactFunc(claims, func(x, y *binderv1.Claim) bool { return key(x) == key(y) })
	if len(claims) > size {
		claims, more = claims[:size], true
	}
	if len(claims) == 0 {
		more = false
	}
	return claims, more
}

// errShardNotHeld: a claim of this replica's ring whose shard its cache
// does not hold yet (its list is not in, or membership is changing).
func (a *api) errShardNotHeld(key string) error {
	return status.Errorf(codes.Unavailable, "binder replica %s owns claim %s but has not listed its shard yet (membership is changing): retry shortly", a.memberID, key)
}

// missingClaim is the error for a claim key not in this replica's cache:
// NotFound when the cache holds its shard, else Unavailable (it may exist).
func (a *api) missingClaim(key string) error {
	if a.shard != nil && !a.shard.Holds(key) {
		return a.errShardNotHeld(key)
	}
	return status.Errorf(codes.NotFound, "claim %s not found", key)
}
