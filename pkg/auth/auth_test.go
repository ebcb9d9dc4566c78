package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeTokenReviews answers TokenReviews from a map of valid tokens and
// counts the reviews; fail makes every review an API error.
func fakeTokenReviews(valid map[string]authnv1.UserInfo, count *atomic.Int32, fail *atomic.Bool) *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		count.Add(1)
		if fail.Load() {
			return true, nil, errors.New("apiserver unreachable")
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if u, ok := valid[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: []string{"https://kubernetes.default.svc"}}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	return cs
}

func TestTokenReviewAndCache(t *testing.T) {
	var count atomic.Int32
	var fail atomic.Bool
	cs := fakeTokenReviews(map[string]authnv1.UserInfo{
		"good": {Username: "system:serviceaccount:ns:viewer", UID: "u1", Groups: []string{"system:serviceaccounts", "system:authenticated"},
			Extra: map[string]authnv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"p"}}},
	}, &count, &fail)
	clk := &clock{t: time.Unix(1000, 0)}
	a, err := NewTokenAuthenticator(TokenOptions{Reviews: cs.AuthenticationV1().TokenReviews(), TTL: 10 * time.Second, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	u, err := a.AuthenticateToken(ctx, "good")
	if err != nil || u.Name != "system:serviceaccount:ns:viewer" || u.UID != "u1" || len(u.Groups) != 2 || u.Extra["authentication.kubernetes.io/pod-name"][0] != "p" {
		t.Fatalf("good token: %+v %v", u, err)
	}
	if _, err := a.AuthenticateToken(ctx, "good"); err != nil || count.Load() != 1 {
		t.Fatalf("second use within the TTL must hit the cache: %v, %d reviews", err, count.Load())
	}
	for k := range a.cache.m {
		if strings.Contains(k, "good") {
			t.Fatal("the cache is keyed by the token itself")
		}
	}
	clk.step(11 * time.Second)
	if _, err := a.AuthenticateToken(ctx, "good"); err != nil || count.Load() != 2 {
		t.Fatalf("after the TTL the token is reviewed again: %v, %d reviews", err, count.Load())
	}

	_, err = a.AuthenticateToken(ctx, "bad-secret-token")
	if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "bad-secret-token") {
		t.Fatalf("bad token: %v, want ErrInvalid without the token", err)
	}
	n := count.Load()
	if _, err := a.AuthenticateToken(ctx, "bad-secret-token"); !errors.Is(err, ErrInvalid) || count.Load() != n {
		t.Fatalf("a rejection is cached briefly: %v, %d reviews", err, count.Load()-n)
	}
	clk.step(DefaultTokenFailureTTL)
	if _, err := a.AuthenticateToken(ctx, "bad-secret-token"); !errors.Is(err, ErrInvalid) || count.Load() != n+1 {
		t.Fatalf("a rejection is cached no longer than the failure TTL: %d reviews", count.Load()-n)
	}

	fail.Store(true)
	clk.step(time.Minute)
	for range 2 {
		if _, err := a.AuthenticateToken(ctx, "good"); err == nil || errors.Is(err, ErrInvalid) {
			t.Fatalf("API server down: %v, want an error that is not ErrInvalid", err)
		}
	}
	fail.Store(false)
	if _, err := a.AuthenticateToken(ctx, "good"); err != nil {
		t.Fatalf("errors are not cached: %v", err)
	}
	if _, err := a.AuthenticateToken(ctx, ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty token: %v", err)
	}
}

func TestTokenAudiences(t *testing.T) {
	var count atomic.Int32
	var fail atomic.Bool
	cs := fakeTokenReviews(map[string]authnv1.UserInfo{"good": {Username: "u"}}, &count, &fail)
	a, err := NewTokenAuthenticator(TokenOptions{Reviews: cs.AuthenticationV1().TokenReviews(), Audiences: []string{"volplane"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AuthenticateToken(t.Context(), "good"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "audiences") {
		t.Fatalf("token for another audience: %v", err)
	}
}

func TestAuthorizerCachesAllowedAndDeniedSeparately(t *testing.T) {
	var count atomic.Int32
	var fail atomic.Bool
	var last atomic.Pointer[authzv1.SubjectAccessReview]
	cs := fake.NewClientset()
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		count.Add(1)
		if fail.Load() {
			return true, nil, errors.New("apiserver unreachable")
		}
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		last.Store(sar)
		ra := sar.Spec.ResourceAttributes
		if ra.Verb == "get" || ra.Verb == "list" {
			sar.Status = authzv1.SubjectAccessReviewStatus{Allowed: true, Reason: "RBAC: allowed by ClusterRoleBinding viewer"}
		} else {
			sar.Status = authzv1.SubjectAccessReviewStatus{Reason: "no RBAC policy matched"}
		}
		return true, sar, nil
	})
	clk := &clock{t: time.Unix(1000, 0)}
	z, err := NewAuthorizer(AuthorizerOptions{Reviews: cs.AuthorizationV1().SubjectAccessReviews(), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	u := User{Name: "alice", UID: "1", Groups: []string{"dev"}, Extra: map[string][]string{"scopes": {"a"}}}
	get := Attributes{Verb: "get", Resource: "claims", Namespace: "ns", Name: "c"}
	sync := Attributes{Verb: "update", Resource: "claims", Subresource: "sync", Namespace: "ns", Name: "c"}
	check := func(a Attributes, allowed bool, reviews int32) {
		t.Helper()
		d, err := z.Authorize(ctx, u, a)
		if err != nil || d.Allowed != allowed || count.Load() != reviews {
			t.Fatalf("%+v: %+v %v after %d reviews; want allowed=%v after %d", a, d, err, count.Load(), allowed, reviews)
		}
	}
	check(get, true, 1)
	r := last.Load().Spec
	if r.User != "alice" || r.UID != "1" || r.Groups[0] != "dev" || r.Extra["scopes"][0] != "a" ||
		*r.ResourceAttributes != (authzv1.ResourceAttributes{Group: "volplane.io", Verb: "get", Resource: "claims", Namespace: "ns", Name: "c"}) {
		t.Fatalf("review sent: %+v %+v", r, r.ResourceAttributes)
	}
	check(sync, false, 2)
	if last.Load().Spec.ResourceAttributes.Subresource != "sync" {
		t.Fatal("subresource not sent")
	}
	check(get, true, 2)
	check(sync, false, 2)
	clk.step(DefaultDeniedTTL)
	check(get, true, 2)   // allowed: still cached
	check(sync, false, 3) // denied: reviewed again
	clk.step(DefaultAllowedTTL)
	check(get, true, 4)
	// Another user, or the same with other groups, is another review.
	if _, err := z.Authorize(ctx, User{Name: "alice", Groups: []string{"ops"}}, get); err != nil || count.Load() != 5 {
		t.Fatalf("other groups must not share a decision: %d reviews", count.Load())
	}
	fail.Store(true)
	clk.step(time.Hour)
	if _, err := z.Authorize(ctx, u, get); err == nil {
		t.Fatal("API server down: want an error")
	}
	fail.Store(false)
	check(get, true, 7)

	msg := sync.Forbidden(u, "")
	for _, want := range []string{`User "alice"`, "cannot update", `resource "claims/sync"`, `"volplane.io"`, `namespace "ns"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("forbidden message %q lacks %q", msg, want)
		}
	}
}

func TestAuthorizerTTLsOff(t *testing.T) {
	var count atomic.Int32
	cs := fake.NewClientset()
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		count.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		sar.Status.Allowed = true
		return true, sar, nil
	})
	z, err := NewAuthorizer(AuthorizerOptions{Reviews: cs.AuthorizationV1().SubjectAccessReviews(), AllowedTTL: -1, DeniedTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if d, err := z.Authorize(t.Context(), User{Name: "u"}, Attributes{Verb: "list", Resource: "claims"}); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	if count.Load() != 3 {
		t.Fatalf("negative TTLs: %d reviews for 3 calls, want 3", count.Load())
	}
}

func TestCacheIsBounded(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	c := newTTLCache[int](100, clk.now)
	for i := range 1000 {
		c.set(hashKey(string(rune(i))), i, time.Minute)
		if c.len() > 100 {
			t.Fatalf("%d entries, bound 100", c.len())
		}
	}
	if hashKey("ab", "c") == hashKey("a", "bc") {
		t.Fatal("hashKey must separate its parts")
	}
}

// testCA is a CA that issues client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) issue(t *testing.T, cn string, orgs []string, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert
}

func TestCertAuthenticatorAndCARotation(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	old, next := newTestCA(t, "old-ca"), newTestCA(t, "next-ca")
	if err := os.WriteFile(caFile, old.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Now()}
	a, err := NewCertAuthenticator(CertOptions{CAFile: caFile, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	alice := old.issue(t, "alice", []string{"ops", "dev"}, x509.ExtKeyUsageClientAuth)
	u, err := a.AuthenticateCert([]*x509.Certificate{alice})
	if err != nil || u.Name != "alice" || strings.Join(u.Groups, ",") != "dev,ops,system:authenticated" {
		t.Fatalf("alice: %+v %v", u, err)
	}
	bob := next.issue(t, "bob", nil, x509.ExtKeyUsageClientAuth)
	if _, err := a.AuthenticateCert([]*x509.Certificate{bob}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("certificate of another CA: %v, want ErrInvalid", err)
	}
	server := old.issue(t, "server", nil, x509.ExtKeyUsageServerAuth)
	if _, err := a.AuthenticateCert([]*x509.Certificate{server}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("certificate without client auth usage: %v, want ErrInvalid", err)
	}
	if _, err := a.AuthenticateCert(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no certificate: %v", err)
	}

	// Rotate: the file now holds the next CA only.
	if err := os.WriteFile(caFile, next.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AuthenticateCert([]*x509.Certificate{bob}); err == nil {
		t.Fatal("the file is read again only after the reload interval")
	}
	clk.step(DefaultReloadInterval)
	if u, err := a.AuthenticateCert([]*x509.Certificate{bob}); err != nil || u.Name != "bob" {
		t.Fatalf("after rotation bob authenticates: %+v %v", u, err)
	}
	if _, err := a.AuthenticateCert([]*x509.Certificate{alice}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("after rotation the old CA's certificate is refused: %v", err)
	}
	// A broken file keeps the last good CA.
	if err := os.WriteFile(caFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	clk.step(DefaultReloadInterval)
	if _, err := a.AuthenticateCert([]*x509.Certificate{bob}); err != nil {
		t.Fatalf("a broken CA file must keep the last good CAs: %v", err)
	}
	if _, err := NewCertAuthenticator(CertOptions{CAFile: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Fatal("missing CA file: want an error")
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	u := User{Name: "system:serviceaccount:ns:op", UID: "42", Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	ctx := metadata.NewIncomingContext(context.Background(), u.Metadata())
	got, ok := FromIncomingContext(ctx)
	if !ok || got.Name != u.Name || got.UID != "42" || strings.Join(got.Groups, ",") != strings.Join(u.Groups, ",") {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	// Two values (a forged one and the gateway's) are refused.
	md := u.Metadata()
	md.Append(MetadataUser, "forged")
	if _, ok := FromIncomingContext(metadata.NewIncomingContext(context.Background(), md)); ok {
		t.Fatal("two user values must not be trusted")
	}
	if _, ok := FromIncomingContext(context.Background()); ok {
		t.Fatal("no metadata: no user")
	}
}

// A replica that passes a call on passes the end user on with it, and
// nothing when the call came without one.
func TestForwardIncomingPassesTheCallerOn(t *testing.T) {
	u := User{Name: "alice", Groups: []string{"ops", "dev"}, UID: "u1"}
	in := metadata.NewIncomingContext(context.Background(), u.Metadata())
	out := ForwardIncoming(metadata.AppendToOutgoingContext(in, "volplane-forwarded-by", "binder-a"))
	md, _ := metadata.FromOutgoingContext(out)
	got, ok := FromIncomingContext(metadata.NewIncomingContext(context.Background(), md))
	if !ok || got.Name != "alice" || strings.Join(got.Groups, ",") != "ops,dev" || got.UID != "u1" {
		t.Fatalf("forwarded user = %+v, %v; want alice", got, ok)
	}
	if v := md.Get("volplane-forwarded-by"); len(v) != 1 {
		t.Fatalf("forwarded-by lost: %v", md)
	}
	plain := ForwardIncoming(context.Background())
	if md, ok := metadata.FromOutgoingContext(plain); ok && len(md.Get(MetadataUser)) > 0 {
		t.Fatalf("a call without a user forwarded one: %v", md)
	}
}
