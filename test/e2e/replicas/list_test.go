package replicas

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// listAll pages through ListClaims of req's filters at r, and returns the
// claims' keys in the order listed; an error ends it.
func listAll(r *replica, req *binderv1.ListClaimsRequest) ([]string, error) {
	req.PageToken = ""
	var keys []string
	for range 10000 {
		resp, err := r.client.ListClaims(context.Background(), req)
		if err != nil {
			return keys, err
		}
		if req.PageSize > 0 && len(resp.Claims) > int(req.PageSize) {
			return keys, fmt.Errorf("a page of %d claims, asked for %d", len(resp.Claims), req.PageSize)
		}
		for _, c := range resp.Claims {
			keys = append(keys, c.Namespace+"/"+c.Name)
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			return keys, nil
		}
	}
	return keys, fmt.Errorf("ListClaims never ended")
}

// apiClaims are the keys of the claims in ns (every namespace for ""),
// sorted, as the API server has them.
func apiClaims(t *testing.T, ns string) []string {
	t.Helper()
	list, err := client.CoreV1().PersistentVolumeClaims(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range list.Items {
		keys = append(keys, c.Namespace+"/"+c.Name)
	}
	slices.Sort(keys)
	return keys
}

// sameList says how got (in the order listed) differs from want (sorted):
// "" when every claim appears exactly once, in order.
func sameList(got, want []string) string {
	if slices.Equal(got, want) {
		return ""
	}
	seen := map[string]int{}
	for _, k := range got {
		seen[k]++
	}
	var twice, missing, extra []string
	for k, n := range seen {
		if n > 1 {
			twice = append(twice, k)
		}
		if !slices.Contains(want, k) {
			extra = append(extra, k)
		}
	}
	for _, k := range want {
		if seen[k] == 0 {
			missing = append(missing, k)
		}
	}
	return fmt.Sprintf("listed %d claims, want %d: twice %v, missing %v, extra %v, sorted %v",
		len(got), len(want), twice, missing, extra, slices.IsSorted(got))
}

// Three replicas with --claims-by-shard each cache a third of the claims;
// ListClaims through any of them lists every claim exactly once, whatever
// the page size, asking the others for their shards. GetClaim,
// ExplainClaim and GetClaimTimeline give the owner's answer through each.
// A forged token is InvalidArgument; a member of the ring that does not
// answer makes the list Unavailable naming it, never partial; only
// binders may ask a replica for its shard alone.
func TestListClaimsAcrossShardedReplicas(t *testing.T) {
	a := startBinder(t, "list-a")
	b := startBinder(t, "list-b")
	c := startBinder(t, "list-c")
	rs := []*replica{a, b, c}
	members := []string{a.id, b.id, c.id}
	eventually(t, 30*time.Second, func() string {
		for _, r := range rs {
			if st := r.status(t); len(st.Members) != 3 {
				return fmt.Sprintf("%s sees members %v", r.id, st.Members)
			}
		}
		return ""
	})

	ns := newNamespace(t, "list")
	other := newNamespace(t, "list-other")
	const count = 90
	createClaims(t, ns, "list", count)
	createClaims(t, other, "other", 10)
	want := apiClaims(t, ns)
	if len(want) != count {
		t.Fatalf("API lists %d claims in %s, want %d", len(want), ns, count)
	}
	// Every replica caches only its shard, and each shard has claims.
	ring := coord.NewRing(members)
	by := map[string]int{}
	for _, k := range want {
		by[ring.Owner("pvc/"+k)]++
	}
	for _, r := range rs {
		if by[r.id] == 0 || by[r.id] == count {
			t.Fatalf("the ring gives %s %d of the %d claims: the test needs each to hold a part", r.id, by[r.id], count)
		}
	}

	for _, size := range []int32{0, 1, 7, 30, 5000} {
		for _, r := range rs {
			eventually(t, time.Minute, func() string {
				got, err := listAll(r, &binderv1.ListClaimsRequest{Namespace: ns, PageSize: size})
				if err != nil {
					return fmt.Sprintf("via %s, pages of %d: %v", r.id, size, err)
				}
				if why := sameList(got, want); why != "" {
					return fmt.Sprintf("via %s, pages of %d: %s", r.id, size, why)
				}
				return ""
			})
		}
	}
	t.Logf("each of %v lists the %d claims of %s exactly once (shards %v)", members, count, ns, by)
	// Every namespace: the other namespace's claims too, and the claims
	// earlier tests left.
	eventually(t, time.Minute, func() string {
		wantAll := apiClaims(t, "")
		got, err := listAll(b, &binderv1.ListClaimsRequest{PageSize: 13})
		if err != nil {
			return err.Error()
		}
		return sameList(got, wantAll)
	})

	// Reads about one claim answer the same through every replica: its
	// owner's.
	asked := map[string]bool{}
	for _, k := range want {
		owner := ring.Owner("pvc/" + k)
		if asked[owner] {
			continue
		}
		asked[owner] = true
		kns, name, _ := strings.Cut(k, "/")
		for _, r := range rs {
			got, err := r.client.GetClaim(context.Background(), &binderv1.GetClaimRequest{Namespace: kns, Name: name})
			if err != nil || got.GetClaim().GetName() != name {
				t.Fatalf("GetClaim %s via %s: %v, %v", k, r.id, got, err)
			}
			ex, err := r.client.ExplainClaim(context.Background(), &binderv1.ExplainClaimRequest{Namespace: kns, Name: name})
			if err != nil || ex.GetMemberId() != owner || ex.GetClaim().GetUid() != got.GetClaim().GetUid() {
				t.Fatalf("ExplainClaim %s via %s: answered by %q (owner %s): %v", k, r.id, ex.GetMemberId(), owner, err)
			}
			tl, err := r.client.GetClaimTimeline(context.Background(), &binderv1.GetClaimTimelineRequest{Namespace: kns, Name: name})
			if err != nil || tl.GetMemberId() != owner || len(tl.GetSpans()) == 0 {
				t.Fatalf("GetClaimTimeline %s via %s: answered by %q (owner %s) with %d spans: %v", k, r.id, tl.GetMemberId(), owner, len(tl.GetSpans()), err)
			}
		}
	}

	// A token issued through one replica continues through another.
	var keys []string
	req := &binderv1.ListClaimsRequest{Namespace: ns, PageSize: 11}
	for i := 0; ; i++ {
		resp, err := rs[i%3].client.ListClaims(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range resp.Claims {
			keys = append(keys, x.Namespace+"/"+x.Name)
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			break
		}
	}
	if why := sameList(keys, want); why != "" {
		t.Fatalf("pages through alternating replicas: %s", why)
	}

	t.Run("forged tokens", func(t *testing.T) {
		first, err := a.client.ListClaims(context.Background(), &binderv1.ListClaimsRequest{Namespace: ns, PageSize: 5})
		if err != nil || first.NextPageToken == "" {
			t.Fatalf("first page: %v, %v", first, err)
		}
		raw, _ := base64.RawURLEncoding.DecodeString(first.NextPageToken)
		for name, req := range map[string]*binderv1.ListClaimsRequest{
			"garbage":        {PageToken: "%%%"},
			"json of no key": {PageToken: base64.RawURLEncoding.EncodeToString([]byte(`{"v":1,"l":"binder.claims"}`))},
			"other filters":  {PageToken: first.NextPageToken, Namespace: other},
			"edited":         {PageToken: base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(raw), `"v":1`, `"v":9`, 1))), Namespace: ns},
			"huge page":      {PageSize: 5001},
		} {
			for _, r := range rs {
				if _, err := r.client.ListClaims(context.Background(), req); status.Code(err) != codes.InvalidArgument {
					t.Errorf("%s via %s: %v, want InvalidArgument", name, r.id, err)
				}
			}
		}
	})

	t.Run("only binders ask for one shard", func(t *testing.T) {
		ask := func(identity string) ([]string, error) {
			cc, err := grpcutil.Dial(a.addr, cl.TLS(identity))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			kv := []string{}
			for _, m := range members {
				kv = append(kv, "volplane-claim-shard", m)
			}
			ctx := metadata.AppendToOutgoingContext(context.Background(), kv...)
			resp, err := binderv1.NewBinderServiceClient(cc).ListClaims(ctx, &binderv1.ListClaimsRequest{Namespace: ns})
			var keys []string
			for _, x := range resp.GetClaims() {
				keys = append(keys, x.Namespace+"/"+x.Name)
			}
			return keys, err
		}
		for _, id := range []string{"gateway", "provisioner", "reclaimer"} {
			if _, err := ask(id); status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s asking for a shard: %v, want PermissionDenied", id, err)
			}
		}
		got, err := ask("binder")
		if err != nil {
			t.Fatal(err)
		}
		var mine []string
		for _, k := range want {
			if ring.Owner("pvc/"+k) == a.id {
				mine = append(mine, k)
			}
		}
		if why := sameList(got, mine); why != "" {
			t.Fatalf("a binder asking %s for its shard: %s", a.id, why)
		}
	})

	// A member whose lease lives but that does not answer: the ring (and
	// every shard) includes it, so a list without its claims would be
	// partial. It is Unavailable, naming the member, through every replica.
	t.Run("unreachable member", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := lis.Addr().String()
		lis.Close() // nothing answers there
		ghost, err := coord.New(context.Background(), coord.Options{Endpoints: env.EtcdEndpoints, Security: env.EtcdSecurity})
		if err != nil {
			t.Fatal(err)
		}
		if err := ghost.Register(context.Background(), "binder", "list-ghost", dead); err != nil {
			ghost.Close()
			t.Fatal(err)
		}
		for _, r := range rs {
			eventually(t, time.Minute, func() string {
				_, err := listAll(r, &binderv1.ListClaimsRequest{Namespace: ns})
				if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "binder replica list-ghost at "+dead) {
					return ""
				}
				return fmt.Sprintf("via %s with list-ghost in the ring: %v, want Unavailable naming list-ghost at %s", r.id, err, dead)
			})
		}
		t.Logf("with an unreachable member: %v", func() error { _, err := listAll(a, &binderv1.ListClaimsRequest{Namespace: ns}); return err }())
		// A claim the ring now gives the ghost: reads of it say so too.
		ghostRing := coord.NewRing(append(slices.Clone(members), "list-ghost"))
		for _, k := range want {
			if ghostRing.Owner("pvc/"+k) != "list-ghost" {
				continue
			}
			kns, name, _ := strings.Cut(k, "/")
			for _, r := range rs {
				_, err := r.client.GetClaim(context.Background(), &binderv1.GetClaimRequest{Namespace: kns, Name: name})
				if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "list-ghost") {
					t.Errorf("GetClaim %s (list-ghost's) via %s: %v, want Unavailable naming list-ghost", k, r.id, err)
				}
			}
			break
		}
		ghost.Close() // its lease is revoked: the ring is the three again
		for _, r := range rs {
			eventually(t, time.Minute, func() string {
				got, err := listAll(r, &binderv1.ListClaimsRequest{Namespace: ns, PageSize: 17})
				if err != nil {
					return fmt.Sprintf("via %s after list-ghost left: %v", r.id, err)
				}
				return sameList(got, want)
			})
		}
	})

	// A replica leaves: the two others hold its shard now, and list it.
	c.stop()
	for _, r := range []*replica{a, b} {
		eventually(t, time.Minute, func() string {
			got, err := listAll(r, &binderv1.ListClaimsRequest{Namespace: ns, PageSize: 8})
			if err != nil {
				return fmt.Sprintf("via %s after %s left: %v", r.id, c.id, err)
			}
			return sameList(got, want)
		})
	}
}
