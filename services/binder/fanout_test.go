package binder

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/paging"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

func claimsOf(keys ...string) []*binderv1.Claim {
	out := make([]*binderv1.Claim, len(keys))
	for i, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		out[i] = &binderv1.Claim{Namespace: ns, Name: name}
	}
	return out
}

func TestMergeClaimPages(t *testing.T) {
	part := func(next bool, keys ...string) *binderv1.ListClaimsResponse {
		r := &binderv1.ListClaimsResponse{Claims: claimsOf(keys...)}
		if next {
			r.NextPageToken = "more"
		}
		return r
	}
	for name, tc := range map[string]struct {
		size  int
		parts []*binderv1.ListClaimsResponse
		want  string
		more  bool
	}{
		"interleaved, fits":        {3, []*binderv1.ListClaimsResponse{part(false, "a/1", "b/1"), part(false, "a/2")}, "a/1 a/2 b/1", false},
		"interleaved, overflows":   {2, []*binderv1.ListClaimsResponse{part(false, "a/1", "b/1"), part(false, "a/2")}, "a/1 a/2", true},
		"a part has more":          {2, []*binderv1.ListClaimsResponse{part(true, "a/1", "a/3"), part(false, "a/2")}, "a/1 a/2", true},
		"exactly full, no more":    {3, []*binderv1.ListClaimsResponse{part(false, "a/1", "a/3"), part(false, "a/2")}, "a/1 a/2 a/3", false},
		"exactly full, a part has": {2, []*binderv1.ListClaimsResponse{part(true, "a/1", "a/2"), part(false)}, "a/1 a/2", true},
		"a claim twice is once":    {3, []*binderv1.ListClaimsResponse{part(false, "a/1", "a/2"), part(false, "a/2")}, "a/1 a/2", false},
		"namespace before name":    {9, []*binderv1.ListClaimsResponse{part(false, "a-b/x"), part(false, "a/z")}, "a-b/x a/z", false},
		"empty parts":              {5, []*binderv1.ListClaimsResponse{part(false), nil}, "", false},
		"nothing, yet 'more'":      {5, []*binderv1.ListClaimsResponse{part(true)}, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			claims, more := mergeClaimPages(tc.size, tc.parts)
			var keys []string
			for _, c := range claims {
				keys = append(keys, c.Namespace+"/"+c.Name)
			}
			if got := strings.Join(keys, " "); got != tc.want || more != tc.more {
				t.Fatalf("merged %q more=%v, want %q more=%v", got, more, tc.want, tc.more)
			}
		})
	}
}

// fixedShard is a claim shard listed for one ring, which never changes.
type fixedShard struct {
	members []string
	self    string
}

func (s fixedShard) Listed() ([]string, string) { return s.members, s.self }
func (s fixedShard) Holds(key string) bool {
	return coord.NewRing(s.members).Owner("pvc/"+key) == s.self
}

// shardedReplica is one binder API holding its shard of the claims,
// served over plaintext gRPC.
type shardedReplica struct {
	id   string
	addr string
	api  *api
	srv  *grpc.Server
}

// shardedReplicas starts one replica per id, each caching the claims the
// ring over ids gives it (and the classes), all knowing each other.
func shardedReplicas(t *testing.T, claims []*corev1.PersistentVolumeClaim, ids ...string) []*shardedReplica {
	t.Helper()
	ring := coord.NewRing(ids)
	var out []*shardedReplica
	var members []coord.Member
	for _, id := range ids {
		c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
		c.store.putClass(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "f"}, Provisioner: "csi.fast"})
		for _, cl := range claims {
			if ring.Owner("pvc/"+claimKey(cl)) == id {
				c.store.putClaim(cl.DeepCopy())
			}
		}
		c.synced.Store(true)
		a := &api{c: c, memberID: id, members: func() []string { return ids }, workers: 1, shard: fixedShard{ids, id},
			peers: newPeers(id, func() *coord.Ring { return ring }, grpcutil.TLSFiles{InsecurePlaintext: true})}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		binderv1.RegisterBinderServiceServer(srv, a)
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		t.Cleanup(a.peers.close)
		r := &shardedReplica{id: id, addr: lis.Addr().String(), api: a, srv: srv}
		out = append(out, r)
		members = append(members, coord.Member{ID: id, Address: r.addr})
	}
	for _, r := range out {
		r.api.peers.update(members)
	}
	return out
}

// manyClaims: n claims over three namespaces, of class fast or slow,
// every third Bound.
func manyClaims(n int) (claims []*corev1.PersistentVolumeClaim, keys []string) {
	for i := range n {
		c := testClaim(fmt.Sprintf("c%03d", i))
		c.Namespace = []string{"a", "b", "c"}[i%3]
		c.UID = types.UID(fmt.Sprintf("uid-%d", i))
		cls := []string{"fast", "slow"}[i%2]
		c.Spec.StorageClassName = &cls
		if i%3 == 0 {
			c.Status.Phase = corev1.ClaimBound
		}
		claims = append(claims, c)
		keys = append(keys, claimKey(c))
	}
	slices.Sort(keys)
	return claims, keys
}

// Each replica holds a third of the claims; through any of them, every
// page size and filter lists every claim exactly once, in key order, and
// the token of one replica continues the list on another.
func TestListClaimsFansOutToEveryShard(t *testing.T) {
	claims, all := manyClaims(100)
	rs := shardedReplicas(t, claims, "r1", "r2", "r3")
	for _, r := range rs {
		st, _ := r.api.GetStatus(t.Context(), nil)
		if st.Claims == 0 || st.Claims == 100 {
			t.Fatalf("replica %s caches %d claims: the test needs each to hold a part", r.id, st.Claims)
		}
	}
	filtered := func(keep func(c *corev1.PersistentVolumeClaim) bool) string {
		var keys []string
		for _, c := range claims {
			if keep(c) {
				keys = append(keys, claimKey(c))
			}
		}
		slices.Sort(keys)
		return strings.Join(keys, " ")
	}
	for name, tc := range map[string]struct {
		req  *binderv1.ListClaimsRequest
		want string
	}{
		"one page":     {&binderv1.ListClaimsRequest{}, strings.Join(all, " ")},
		"pages of 1":   {&binderv1.ListClaimsRequest{PageSize: 1}, strings.Join(all, " ")},
		"pages of 7":   {&binderv1.ListClaimsRequest{PageSize: 7}, strings.Join(all, " ")},
		"pages of 50":  {&binderv1.ListClaimsRequest{PageSize: 50}, strings.Join(all, " ")},
		"pages of 100": {&binderv1.ListClaimsRequest{PageSize: 100}, strings.Join(all, " ")},
		"namespace": {&binderv1.ListClaimsRequest{Namespace: "b", PageSize: 4},
			filtered(func(c *corev1.PersistentVolumeClaim) bool { return c.Namespace == "b" })},
		"phase and driver": {&binderv1.ListClaimsRequest{Phase: "Bound", Driver: "csi.fast", PageSize: 3},
			filtered(func(c *corev1.PersistentVolumeClaim) bool {
				return c.Status.Phase == corev1.ClaimBound && *c.Spec.StorageClassName == "fast"
			})},
	} {
		for _, r := range rs {
			t.Run(name+" via "+r.id, func(t *testing.T) {
				keys, sizes := allClaims(t, r.api, tc.req)
				if got := strings.Join(keys, " "); got != tc.want {
					t.Fatalf("claims %q\nwant   %q", got, tc.want)
				}
				size := int(tc.req.PageSize)
				if size == 0 {
					size = paging.DefaultSize
				}
				for i, n := range sizes[:len(sizes)-1] {
					if n != size {
						t.Fatalf("page %d has %d claims, want %d (sizes %v)", i, n, size, sizes)
					}
				}
			})
		}
	}
	t.Run("a token continues on another replica", func(t *testing.T) {
		var keys []string
		req := &binderv1.ListClaimsRequest{PageSize: 9}
		for i := 0; ; i++ {
			resp, err := rs[i%len(rs)].api.ListClaims(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range resp.Claims {
				keys = append(keys, c.Namespace+"/"+c.Name)
			}
			if req.PageToken = resp.NextPageToken; req.PageToken == "" {
				break
			}
		}
		if !slices.Equal(keys, all) {
			t.Fatalf("claims %v\nwant   %v", keys, all)
		}
	})
}

// What a caller sends is checked before any replica is asked: a forged,
// foreign or tampered token and a page too large are InvalidArgument.
func TestListClaimsFanOutRefusesBadPages(t *testing.T) {
	claims, _ := manyClaims(20)
	rs := shardedReplicas(t, claims, "r1", "r2")
	first, err := rs[0].api.ListClaims(t.Context(), &binderv1.ListClaimsRequest{PageSize: 2, Namespace: "a"})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v %v", first, err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(first.NextPageToken)
	for name, req := range map[string]*binderv1.ListClaimsRequest{
		"garbage":                 {PageToken: "not-a-token!"},
		"base64 of nothing":       {PageToken: base64.RawURLEncoding.EncodeToString([]byte("{}"))},
		"other filters":           {PageToken: first.NextPageToken, Namespace: "b"},
		"another list's":          {PageToken: paging.NewCursor("binder.volumes").Token("a/c001")},
		"edited key, old filters": {PageToken: base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(raw), `"f"`, `"x"`, 1)))},
		"huge page":               {PageSize: paging.MaxSize + 1},
		"negative page":           {PageSize: -1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := rs[1].api.ListClaims(t.Context(), req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%v: want InvalidArgument", err)
			}
		})
	}
}

// A replica of the ring that cannot answer makes the list Unavailable,
// naming it; so does one whose cache holds another ring's shard. Never a
// list without its claims.
func TestListClaimsFanOutFailsWhole(t *testing.T) {
	claims, _ := manyClaims(30)
	t.Run("replica down", func(t *testing.T) {
		rs := shardedReplicas(t, claims, "r1", "r2", "r3")
		rs[2].srv.Stop()
		_, err := rs[0].api.ListClaims(t.Context(), &binderv1.ListClaimsRequest{})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "binder replica r3 at "+rs[2].addr) {
			t.Fatalf("%v: want Unavailable naming r3 and its address", err)
		}
	})
	t.Run("replica without an address", func(t *testing.T) {
		rs := shardedReplicas(t, claims, "r1", "r2")
		rs[0].api.peers.update([]coord.Member{{ID: "r1", Address: rs[0].addr}})
		_, err := rs[0].api.ListClaims(t.Context(), &binderv1.ListClaimsRequest{})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "binder replica r2") {
			t.Fatalf("%v: want Unavailable naming r2", err)
		}
	})
	t.Run("replica on another ring", func(t *testing.T) {
		rs := shardedReplicas(t, claims, "r1", "r2")
		rs[1].api.shard = fixedShard{[]string{"r2"}, "r2"}
		_, err := rs[0].api.ListClaims(t.Context(), &binderv1.ListClaimsRequest{})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "binder replica r2 holds the claims of the ring [r2]") {
			t.Fatalf("%v: want Unavailable from r2 saying its ring", err)
		}
	})
	t.Run("too many replicas", func(t *testing.T) {
		rs := shardedReplicas(t, claims, "r1")
		var many []string
		for i := range maxListReplicas + 1 {
			many = append(many, fmt.Sprintf("r%d", i+1))
		}
		rs[0].api.shard = fixedShard{many, "r1"}
		_, err := rs[0].api.ListClaims(t.Context(), &binderv1.ListClaimsRequest{})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("%v: want FailedPrecondition", err)
		}
	})
	t.Run("no shard listed yet", func(t *testing.T) {
		rs := shardedReplicas(t, claims, "r1")
		rs[0].api.shard = fixedShard{}
		_, err := rs[0].api.ListClaims(t.Context(), &binderv1.ListClaimsRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("%v: want Unavailable", err)
		}
	})
}

// tlsCaller is a server context of a call whose client certificate names
// cn, as the TLS handshake would leave it.
func tlsCaller(ctx context.Context, cn string, md metadata.MD) context.Context {
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: cn}}
	ctx = peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}})
	return metadata.NewIncomingContext(ctx, md)
}

// Only another binder replica may ask for one replica's shard alone:
// anyone else naming a ring is refused, so no caller gets a partial list
// passed off as the whole.
func TestListClaimsShardOnlyForBinders(t *testing.T) {
	claims, _ := manyClaims(30)
	rs := shardedReplicas(t, claims, "r1", "r2")
	a := rs[0].api
	a.peers.tls = grpcutil.TLSFiles{CAFile: "ca", CertFile: "cert", KeyFile: "key"} // not plaintext: identities count
	ring := metadata.Pairs(claimShardHeader, "r1", claimShardHeader, "r2")
	for _, cn := range []string{callers.Gateway, callers.Conformance, callers.Provisioner, ""} {
		t.Run(cn, func(t *testing.T) {
			_, err := a.ListClaims(tlsCaller(t.Context(), cn, ring), &binderv1.ListClaimsRequest{})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("%v: want PermissionDenied", err)
			}
		})
	}
	resp, err := a.ListClaims(tlsCaller(t.Context(), callers.Binder, ring), &binderv1.ListClaimsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := a.GetStatus(t.Context(), nil)
	if len(resp.Claims) != int(st.Claims) || len(resp.Claims) == len(claims) {
		t.Fatalf("a binder asking for r1's shard got %d claims; r1 holds %d of %d", len(resp.Claims), st.Claims, len(claims))
	}
	tooMany := metadata.MD{}
	for i := range maxListReplicas + 1 {
		tooMany.Append(claimShardHeader, fmt.Sprintf("r%d", i))
	}
	if _, err := a.ListClaims(tlsCaller(t.Context(), callers.Binder, tooMany), &binderv1.ListClaimsRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a ring of %d: %v, want InvalidArgument", maxListReplicas+1, err)
	}
}

// A replica caching every claim (--claims-by-shard=false, the flag being
// changed replica by replica) answers a sharded one's ListClaims with its
// part of the ring, so the merged list still has each claim once.
func TestListClaimsWithAnUnshardedReplica(t *testing.T) {
	claims, all := manyClaims(40)
	rs := shardedReplicas(t, claims, "r1", "r2")
	for _, cl := range claims {
		rs[1].api.c.store.putClaim(cl.DeepCopy())
	}
	rs[1].api.shard = nil
	for _, r := range rs {
		keys, _ := allClaims(t, r.api, &binderv1.ListClaimsRequest{PageSize: 6})
		if !slices.Equal(keys, all) {
			t.Fatalf("via %s: %v\nwant %v", r.id, keys, all)
		}
	}
	resp, err := rs[1].api.ListClaims(tlsCaller(t.Context(), callers.Binder, metadata.Pairs(claimShardHeader, "r1", claimShardHeader, "r2")), &binderv1.ListClaimsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ring := coord.NewRing([]string{"r1", "r2"})
	for _, c := range resp.Claims {
		if k := c.Namespace + "/" + c.Name; ring.Owner("pvc/"+k) != "r2" {
			t.Fatalf("r2, asked for its shard, answered with %s, r1's", k)
		}
	}
}

// A claim of this replica's ring whose shard its cache does not hold yet
// may exist: reads of it are Unavailable, not NotFound.
func TestClaimReadsWhileTheShardIsNotHeld(t *testing.T) {
	claims, _ := manyClaims(10)
	rs := shardedReplicas(t, claims, "r1")
	a := rs[0].api
	a.peers = nil
	a.shard = fixedShard{[]string{"r0"}, "r1"} // listed for another ring: holds nothing
	req := &binderv1.GetClaimRequest{Namespace: "a", Name: "missing"}
	if _, err := a.GetClaim(t.Context(), req); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetClaim, shard not held: %v, want Unavailable", err)
	}
	if _, err := a.SyncClaim(t.Context(), &binderv1.SyncClaimRequest{Namespace: "a", Name: "missing"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("SyncClaim, shard not held: %v, want Unavailable", err)
	}
	if _, err := a.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: "a", Name: "missing"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ExplainClaim, shard not held: %v, want Unavailable", err)
	}
	if _, err := a.GetClaimTimeline(t.Context(), &binderv1.GetClaimTimelineRequest{Namespace: "a", Name: "missing"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetClaimTimeline, shard not held: %v, want Unavailable", err)
	}
	a.shard = fixedShard{[]string{"r1"}, "r1"}
	if _, err := a.GetClaim(t.Context(), req); status.Code(err) != codes.NotFound {
		t.Fatalf("GetClaim, shard held: %v, want NotFound", err)
	}
}
