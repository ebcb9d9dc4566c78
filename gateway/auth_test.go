package gateway

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/emptypb"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/metrics"
)

// backendCall is what the fake backend saw of one call.
type backendCall struct {
	method string
	md     metadata.MD
}

// fakeBackend serves every gRPC method of every service: it records the
// call and answers with answer(method), NotFound by default. Health
// checks (the gateway's monitor) are answered NotFound and not recorded.
type fakeBackend struct {
	addr   string
	mu     sync.Mutex
	calls  []backendCall
	answer func(method string) error
}

func startFakeBackend(t testing.TB) *fakeBackend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBackend{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		md, _ := metadata.FromIncomingContext(stream.Context())
		if strings.HasPrefix(method, "/grpc.health.v1.") {
			// The gateway's own background health checks, not a caller's.
			return status.Error(codes.NotFound, "fake backend: no health service")
		}
		// Decode the request as the real service would, so that what its
		// gRPC layer refuses is refused here too.
		if err := stream.RecvMsg(requestOf(method)); err != nil {
			return err
		}
		b.mu.Lock()
		b.calls = append(b.calls, backendCall{method: method, md: md})
		answer := b.answer
		b.mu.Unlock()
		if answer != nil {
			return answer(method)
		}
		return status.Error(codes.NotFound, "fake backend: not found")
	}))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return b
}

// requestOf is an empty request message of the full gRPC method name
// ("/volplane.binder.v1.BinderService/MatchClaim"), from the generated
// descriptors; an unknown method decodes into an Empty.
func requestOf(method string) proto.Message {
	name := protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(method, "/"), "/", "."))
	if d, err := protoregistry.GlobalFiles.FindDescriptorByName(name); err == nil {
		if md, ok := d.(protoreflect.MethodDescriptor); ok {
			return dynamicpb.NewMessage(md.Input())
		}
	}
	return &emptypb.Empty{}
}

func (b *fakeBackend) take() []backendCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.calls
	b.calls = nil
	return out
}

// fakeCluster is a fake API server for TokenReviews and
// SubjectAccessReviews: viewer-token is a viewer (get, list, watch), and
// operator-token may do anything.
type fakeCluster struct {
	cs           *fake.Clientset
	tokenReviews atomic.Int32
	mu           sync.Mutex
	sars         []authzv1.SubjectAccessReviewSpec
}

var fakeUsers = map[string]authnv1.UserInfo{
	"viewer-token":   {Username: "system:serviceaccount:team:viewer", UID: "uid-viewer", Groups: []string{"system:serviceaccounts", "system:authenticated"}},
	"operator-token": {Username: "system:serviceaccount:team:operator", UID: "uid-operator", Groups: []string{"system:serviceaccounts", "system:authenticated"}},
}

func newFakeCluster() *fakeCluster {
	f := &fakeCluster{cs: fake.NewClientset()}
	f.cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.tokenReviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if u, ok := fakeUsers[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: u}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	f.cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		f.mu.Lock()
		f.sars = append(f.sars, sar.Spec)
		f.mu.Unlock()
		v := sar.Spec.ResourceAttributes.Verb
		switch {
		case sar.Spec.User == fakeUsers["operator-token"].Username:
			sar.Status.Allowed = true
		case sar.Spec.User == fakeUsers["viewer-token"].Username && (v == "get" || v == "list" || v == "watch"):
			sar.Status.Allowed = true
		}
		return true, sar, nil
	})
	return f
}

func (f *fakeCluster) takeSARs() []authzv1.SubjectAccessReviewSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.sars
	f.sars = nil
	return out
}

type testGateway struct {
	url     string
	backend *fakeBackend
	cluster *fakeCluster
	handler http.Handler
}

func startGateway(t testing.TB, mutate func(*Options)) *testGateway {
	t.Helper()
	b := startFakeBackend(t)
	c := newFakeCluster()
	o := Options{
		WatcherAddress: b.addr, BinderAddress: b.addr, ProvisionerAddress: b.addr, ReclaimerAddress: b.addr,
		TLS: grpcutil.TLSFiles{InsecurePlaintext: true},
		// No caching, so each test sees every review.
		Auth:   AuthOptions{Client: c.cs, TokenCacheTTL: -1, AllowedCacheTTL: -1, DeniedCacheTTL: -1},
		Logger: discard(),
	}
	if mutate != nil {
		mutate(&o)
	}
	h, closeAll, err := NewHandler(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testGateway{url: srv.URL, backend: b, cluster: c, handler: h}
}

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (g *testGateway) do(t testing.TB, method, path, token string, body io.Reader, hdr ...string) (*http.Response, apiError) {
	t.Helper()
	req, err := http.NewRequest(method, g.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e apiError
	if resp.StatusCode >= 300 {
		if err := json.Unmarshal(b, &e); err != nil || e.Message == "" {
			t.Fatalf("%s %s: %s with a body that is not a JSON error: %q", method, path, resp.Status, b)
		}
	}
	return resp, e
}

func (g *testGateway) doStream(t testing.TB, method, path, token string) (*http.Response, apiError) {
	t.Helper()
	req, _ := http.NewRequest(method, g.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var chunk struct{ Error apiError }
	_ = json.NewDecoder(resp.Body).Decode(&chunk)
	return resp, chunk.Error
}

// httpRules reads proto/volplane/http.yaml: method, path, selector and
// body ("" for none) of every binding.
func httpRules(t *testing.T) [][4]string {
	t.Helper()
	f, err := os.Open("../proto/volplane/http.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type binding struct {
		Get, Post, Put, Delete, Patch, Body string
		AdditionalBindings                  []binding `json:"additional_bindings"`
	}
	var doc struct {
		HTTP struct {
			Rules []struct {
				Selector string
				Get      string
				Post     string
				Put      string
				Delete   string
				Patch    string
				Body     string
				More     []binding `json:"additional_bindings"`
			}
		}
	}
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	var out [][4]string
	add := func(sel string, b binding) {
		for _, mp := range [][2]string{{"GET", b.Get}, {"POST", b.Post}, {"PUT", b.Put}, {"DELETE", b.Delete}, {"PATCH", b.Patch}} {
			if mp[1] != "" {
				out = append(out, [4]string{mp[0], mp[1], sel, b.Body})
			}
		}
	}
	for _, r := range doc.HTTP.Rules {
		add(r.Selector, binding{Get: r.Get, Post: r.Post, Put: r.Put, Delete: r.Delete, Patch: r.Patch, Body: r.Body})
		for _, b := range r.More {
			add(r.Selector, b)
		}
	}
	if len(out) < 10 {
		t.Fatalf("http.yaml parsed to %d bindings only", len(out))
	}
	return out
}

// Every route of http.yaml has an authorization rule, and every rule is a
// route: a new route cannot ship unauthorized (it would be refused).
func TestRouteTableCoversHTTPYAML(t *testing.T) {
	rules := httpRules(t)
	seen := map[string]bool{}
	for _, r := range rules {
		key := r[0] + " " + r[1]
		seen[key] = true
		rt, ok := routeIndex[key]
		if !ok {
			t.Errorf("http.yaml serves %s (%s) but routes.go has no authorization rule for it", key, r[2])
			continue
		}
		if rt.RPC != r[2] {
			t.Errorf("%s: table says %s, http.yaml %s", key, rt.RPC, r[2])
		}
	}
	param := regexp.MustCompile(`\{([^}]+)\}`)
	for _, rt := range routes {
		if !seen[rt.Method+" "+rt.Path] {
			t.Errorf("routes.go has %s %s, which http.yaml does not serve", rt.Method, rt.Path)
		}
		for _, m := range param.FindAllStringSubmatch(rt.Path, -1) {
			if _, ok := pathParams[m[1]]; !ok {
				t.Errorf("%s: path parameter %q has no validation in pathParams", rt.Path, m[1])
			}
		}
		if rt.Verb == "" || rt.Resource == "" {
			t.Errorf("%s %s: no verb or resource", rt.Method, rt.Path)
		}
	}
}

// concrete fills a route's template with valid names.
func concrete(path string) string {
	r := strings.NewReplacer("{namespace}", "team", "{name}", "vol-1", "{volume_name}", "vol-1")
	return r.Replace(path)
}

// Each route, requested for real through grpc-gateway, reaches its RPC
// after exactly the SubjectAccessReview of its table entry; a viewer is
// refused every write with a message naming what is missing.
func TestEveryRouteIsAuthorized(t *testing.T) {
	g := startGateway(t, nil)
	for _, rt := range routes {
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) {
			g.backend.take()
			g.cluster.takeSARs()
			path := concrete(rt.Path)
			var (
				resp *http.Response
				e    apiError
			)
			if rt.Stream {
				// A stream's error comes as {"error": {...}}.
				resp, e = g.doStream(t, rt.Method, path, "operator-token")
			} else {
				resp, e = g.do(t, rt.Method, path, "operator-token", nil)
			}
			if resp.StatusCode != http.StatusNotFound || !strings.Contains(e.Message, "fake backend") {
				t.Fatalf("operator: %s %v, want the backend's 404", resp.Status, e)
			}
			calls := g.backend.take()
			wantRPC := "/" + rt.RPC[:strings.LastIndex(rt.RPC, ".")] + "/" + rt.RPC[strings.LastIndex(rt.RPC, ".")+1:]
			if len(calls) != 1 || calls[0].method != wantRPC {
				t.Fatalf("backend calls %+v, want one %s", calls, wantRPC)
			}
			if got := calls[0].md.Get(auth.MetadataUser); len(got) != 1 || got[0] != "system:serviceaccount:team:operator" {
				t.Errorf("identity metadata %v", calls[0].md)
			}
			sars := g.cluster.takeSARs()
			if len(sars) != 1 {
				t.Fatalf("%d reviews, want 1", len(sars))
			}
			want := authzv1.ResourceAttributes{Group: "volplane.io", Verb: rt.Verb, Resource: rt.Resource, Subresource: rt.Subresource, Name: rt.Name}
			if strings.Contains(rt.Path, "{namespace}") {
				want.Namespace = "team"
			}
			if strings.Contains(rt.Path, "{name}") || strings.Contains(rt.Path, "{volume_name}") {
				want.Name = "vol-1"
			}
			if *sars[0].ResourceAttributes != want {
				t.Errorf("review %+v, want %+v", *sars[0].ResourceAttributes, want)
			}

			if !rt.write() {
				if rt.Stream {
					resp, e = g.doStream(t, rt.Method, path, "viewer-token")
				} else {
					resp, e = g.do(t, rt.Method, path, "viewer-token", nil)
				}
				if resp.StatusCode == http.StatusForbidden {
					t.Fatalf("viewer may read: %v", e)
				}
				return
			}
			resp, e = g.do(t, rt.Method, path, "viewer-token", nil)
			if resp.StatusCode != http.StatusForbidden || e.Code != int(codes.PermissionDenied) {
				t.Fatalf("viewer writes: %s %v, want 403", resp.Status, e)
			}
			for _, s := range []string{"system:serviceaccount:team:viewer", "cannot " + rt.Verb, `"` + want.Resource} {
				if !strings.Contains(e.Message, s) {
					t.Errorf("403 message %q lacks %q", e.Message, s)
				}
			}
			if want.Subresource != "" && !strings.Contains(e.Message, want.Resource+"/"+want.Subresource) {
				t.Errorf("403 message %q lacks the subresource", e.Message)
			}
			if calls := g.backend.take(); len(calls) != 0 {
				t.Errorf("a refused call reached the backend: %+v", calls)
			}
		})
	}
}

func TestAuthentication(t *testing.T) {
	g := startGateway(t, nil)
	for _, tc := range []struct {
		name, token string
		hdr         []string
	}{
		{name: "no credential"},
		{name: "bad token", token: "not-a-token"},
		{name: "basic auth", hdr: []string{"Authorization", "Basic dXNlcjpwYXNz"}},
		{name: "empty bearer", hdr: []string{"Authorization", "Bearer "}},
	} {
		resp, e := g.do(t, "GET", "/v1/claims", tc.token, nil, tc.hdr...)
		if resp.StatusCode != http.StatusUnauthorized || e.Code != int(codes.Unauthenticated) || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %s %v %q, want 401 with WWW-Authenticate: Bearer", tc.name, resp.Status, e, resp.Header.Get("WWW-Authenticate"))
		}
		if strings.Contains(e.Message, "not-a-token") {
			t.Errorf("%s: the token is in the answer: %s", tc.name, e.Message)
		}
	}
	// Unknown routes are 401 too without a credential: nothing is told.
	if resp, _ := g.do(t, "GET", "/v1/nothing", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unknown route without a credential: %s", resp.Status)
	}
	if calls := g.backend.take(); len(calls) != 0 {
		t.Fatalf("unauthenticated calls reached the backend: %+v", calls)
	}
	for _, p := range []string{"/healthz", "/openapi.json"} {
		if resp, _ := g.do(t, "GET", p, "", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("%s without a credential: %s", p, resp.Status)
		}
	}
	if resp, e := g.do(t, "POST", "/healthz", "", nil); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		t.Errorf("POST /healthz: %s %v", resp.Status, e)
	}

	// Anonymous only when asked for, and still authorized.
	anon := startGateway(t, func(o *Options) { o.Auth.AllowAnonymous = true })
	resp, e := anon.do(t, "GET", "/v1/claims", "", nil)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(e.Message, `"system:anonymous"`) {
		t.Fatalf("anonymous: %s %v, want 403 for system:anonymous", resp.Status, e)
	}
	if s := anon.cluster.takeSARs(); len(s) != 1 || s[0].Groups[0] != auth.UnauthenticatedGroup {
		t.Fatalf("anonymous review: %+v", s)
	}
	if resp, _ := anon.do(t, "GET", "/v1/claims", "not-a-token", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a bad token is refused even with anonymous access: %s", resp.Status)
	}
}

// No caller-supplied header reaches the backends as metadata: not the
// identity keys, not the bearer token.
func TestForgedIdentityHeadersIgnored(t *testing.T) {
	g := startGateway(t, nil)
	resp, _ := g.do(t, "GET", "/v1/namespaces/team/claims/c", "viewer-token", nil,
		"Grpc-Metadata-Volplane-User", "system:admin",
		"Grpc-Metadata-Volplane-Groups", "system:masters",
		"Grpc-Metadata-Volplane-Uid", "0",
		"Volplane-User", "system:admin",
		"Grpc-Metadata-Authorization", "Bearer forged")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("%s", resp.Status)
	}
	calls := g.backend.take()
	if len(calls) != 1 {
		t.Fatalf("calls %+v", calls)
	}
	md := calls[0].md
	if u := md.Get(auth.MetadataUser); len(u) != 1 || u[0] != "system:serviceaccount:team:viewer" {
		t.Errorf("volplane-user %q", u)
	}
	if gr := md.Get(auth.MetadataGroups); len(gr) != 1 || gr[0] != "system:serviceaccounts,system:authenticated" {
		t.Errorf("volplane-groups %q", gr)
	}
	if u := md.Get(auth.MetadataUID); len(u) != 1 || u[0] != "uid-viewer" {
		t.Errorf("volplane-uid %q", u)
	}
	for k, v := range md {
		if strings.Contains(strings.Join(v, ","), "viewer-token") || strings.Contains(strings.Join(v, ","), "forged") || k == "authorization" {
			t.Errorf("metadata %s=%q carries a caller's header", k, v)
		}
	}
}

func TestHardening(t *testing.T) {
	g := startGateway(t, func(o *Options) { o.HTTP.MaxRequestBytes = 1000 })
	g.backend.answer = func(method string) error {
		if strings.HasSuffix(method, "/DeleteVolume") {
			return status.Error(codes.FailedPrecondition, "volume vol-1 is Bound")
		}
		return status.Error(codes.NotFound, "fake backend: not found")
	}
	for _, tc := range []struct {
		method, path string
		body         io.Reader
		want         int
		inMessage    string
	}{
		{"GET", "/v1/namespaces/Bad_NS/claims/c", nil, 400, "namespace"},
		{"GET", "/v1/namespaces/team/claims/-x-", nil, 400, "name"},
		{"GET", "/v1/reclaims/" + strings.Repeat("a", 300), nil, 400, "volume name"},
		{"GET", "/v1/namespaces/team/claims/%ff%fe", nil, 400, "UTF-8"},
		{"GET", "/v1/claims?phase=%00", nil, 400, "control character"},
		{"GET", "/v1/claims?phase=%ff", nil, 400, "UTF-8"},
		{"GET", "/v1/claims?pageSize=99999999999999", nil, 400, ""},
		{"DELETE", "/v1/claims", nil, 405, "GET"},
		{"PUT", "/v1/volumes/vol-1:deleteBacking", nil, 405, "POST"},
		{"GET", "/v1/nothing", nil, 404, "no route"},
		{"GET", "/v1/../v1/claims", nil, 404, ""},
		{"POST", "/v1/provisions", strings.NewReader(`{"claimName": 5}`), 400, ""},
		{"POST", "/v1/provisions", strings.NewReader(`{"claimNamespace": "a\xffb"}`), 400, ""},
		{"POST", "/v1/provisions", strings.NewReader(strings.Repeat(" ", 2000)), 413, "--max-request-bytes"},
		// Unknown length (chunked): the limit is hit while decoding.
		{"POST", "/v1/reclaims", io.MultiReader(strings.NewReader(`{"volumeName": "`), strings.NewReader(strings.Repeat("a", 5000)+`"}`)), 413, "--max-request-bytes"},
		{"POST", "/v1/volumes/vol-1:deleteBacking", nil, 409, "Bound"},
	} {
		resp, e := g.do(t, tc.method, tc.path, "operator-token", tc.body)
		if resp.StatusCode != tc.want || !strings.Contains(e.Message, tc.inMessage) {
			t.Errorf("%s %s: %s %+v, want %d with %q", tc.method, tc.path, resp.Status, e, tc.want, tc.inMessage)
		}
		if tc.want == 405 && !strings.Contains(resp.Header.Get("Allow"), tc.inMessage) {
			t.Errorf("%s %s: Allow %q", tc.method, tc.path, resp.Header.Get("Allow"))
		}
	}
}

func TestReviewsAreCached(t *testing.T) {
	g := startGateway(t, func(o *Options) { o.Auth.TokenCacheTTL, o.Auth.AllowedCacheTTL, o.Auth.DeniedCacheTTL = 0, 0, 0 })
	for range 3 {
		g.do(t, "GET", "/v1/namespaces/team/claims/c", "viewer-token", nil)
		g.do(t, "POST", "/v1/namespaces/team/claims/c:sync", "viewer-token", nil)
	}
	if n, s := g.cluster.tokenReviews.Load(), len(g.cluster.takeSARs()); n != 1 || s != 2 {
		t.Fatalf("%d token reviews and %d access reviews for 6 requests, want 1 and 2 (cached)", n, s)
	}
}

// certs is a CA that issues server and client certificates into files.
type certs struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCerts(t testing.TB, name string) *certs {
	t.Helper()
	c := &certs{dir: t.TempDir()}
	c.cert, c.key = c.issue(t, name, nil, nil, nil)
	return c
}

// issue creates a certificate signed by c (self-signed CA when c.cert is
// nil) and writes it as <cn>.crt and <cn>.key.
func (c *certs) issue(t testing.TB, cn string, orgs []string, usage []x509.ExtKeyUsage, ips []net.IP) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, IPAddresses: ips}
	parent, signer := tmpl, key
	if c.cert == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	} else {
		parent, signer = c.cert, c.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := os.WriteFile(filepath.Join(c.dir, cn+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, cn+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func (c *certs) file(name string) string { return filepath.Join(c.dir, name) }

// Over HTTPS: a client certificate signed by the client CA authenticates
// as its CN and O; one signed by another CA is refused.
func TestClientCertificates(t *testing.T) {
	serving, clients, other := newCerts(t, "serving-ca"), newCerts(t, "client-ca"), newCerts(t, "other-ca")
	serving.issue(t, "gateway", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.ParseIP("127.0.0.1")})
	clients.issue(t, "alice", []string{"platform"}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil)
	other.issue(t, "mallory", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil)

	b := startFakeBackend(t)
	c := newFakeCluster()
	c.cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		sar.Status.Allowed = sar.Spec.User == "alice" && sar.Spec.Groups[0] == "platform"
		return true, sar, nil
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	o := Options{Listen: addr, BinderAddress: b.addr, TLS: grpcutil.TLSFiles{InsecurePlaintext: true}, Logger: discard(),
		Auth: AuthOptions{Client: c.cs, ClientCAFile: clients.file("client-ca.crt")},
		HTTP: HTTPOptions{TLSCertFile: serving.file("gateway.crt"), TLSKeyFile: serving.file("gateway.key")}}
	// The real Run, serving HTTPS.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Run: %v", err)
		}
	}()
	url := "https://" + addr

	roots := x509.NewCertPool()
	roots.AddCert(serving.cert)
	client := func(dir, cn string) *http.Client {
		cfg := &tls.Config{RootCAs: roots}
		if cn != "" {
			kp, err := tls.LoadX509KeyPair(filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key"))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{kp}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	}
	get := func(c *http.Client) (int, string) {
		resp, err := c.Get(url + "/v1/volumes/vol-1")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// Poll until Run serves.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("gateway not serving: %v", err)
		}
	}
	if code, body := get(client(clients.dir, "alice")); code != http.StatusNotFound || !strings.Contains(body, "fake backend") {
		t.Fatalf("alice: %d %s, want the backend's 404", code, body)
	}
	if calls := b.take(); len(calls) != 1 || calls[0].md.Get(auth.MetadataUser)[0] != "alice" || calls[0].md.Get(auth.MetadataGroups)[0] != "platform,system:authenticated" {
		t.Fatalf("alice's calls: %+v", calls)
	}
	if code, body := get(client(other.dir, "mallory")); code != http.StatusUnauthorized || !strings.Contains(body, "does not verify") {
		t.Fatalf("certificate of another CA: %d %s, want 401", code, body)
	}
	if code, _ := get(client("", "")); code != http.StatusUnauthorized {
		t.Fatalf("no certificate: %d, want 401", code)
	}
}

// The serving certificate is read again when its files change.
func TestServingCertificateReloads(t *testing.T) {
	ca := newCerts(t, "ca")
	first, _ := ca.issue(t, "gateway", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, nil)
	sc, err := newServingCert(ca.file("gateway.crt"), ca.file("gateway.key"), discard())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := sc.get(nil)
	if !bytes.Equal(got.Certificate[0], first.Raw) {
		t.Fatal("first certificate not served")
	}
	if e := servingExpiry(t); e != float64(first.NotAfter.Unix()) {
		t.Fatalf("volplane_certificate_expiry_timestamp_seconds{role=gateway-serving} = %v, want the first certificate's %v", e, first.NotAfter.Unix())
	}
	second, _ := ca.issue(t, "gateway", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, nil)
	sc.mu.Lock()
	sc.lastCheck = time.Time{}
	sc.mu.Unlock()
	if got, _ = sc.get(nil); !bytes.Equal(got.Certificate[0], second.Raw) {
		t.Fatal("the rotated certificate is not served")
	}
	if e := servingExpiry(t); e != float64(second.NotAfter.Unix()) {
		t.Fatalf("volplane_certificate_expiry_timestamp_seconds{role=gateway-serving} = %v, want the rotated certificate's %v", e, second.NotAfter.Unix())
	}
	if err := os.WriteFile(ca.file("gateway.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	sc.mu.Lock()
	sc.lastCheck = time.Time{}
	sc.mu.Unlock()
	if got, err = sc.get(nil); err != nil || !bytes.Equal(got.Certificate[0], second.Raw) {
		t.Fatal("a broken key file must keep the last good certificate")
	}
	if _, err := newServingCert(ca.file("nope.crt"), ca.file("gateway.key"), discard()); err == nil {
		t.Fatal("missing files: want an error")
	}
}

// servingExpiry is the one series of
// volplane_certificate_expiry_timestamp_seconds{role="gateway-serving"}.
func servingExpiry(t *testing.T) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var values []float64
	for _, mf := range mfs {
		if mf.GetName() != "volplane_certificate_expiry_timestamp_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "role" && l.GetValue() == metrics.RoleGatewayServing {
					values = append(values, m.GetGauge().GetValue())
				}
			}
		}
	}
	if len(values) != 1 {
		t.Fatalf("%d gateway-serving certificate series, want 1: %v", len(values), values)
	}
	return values[0]
}

func TestOptionsRefuseHalfTLS(t *testing.T) {
	o := Options{Listen: "x", BinderAddress: "x", TLS: grpcutil.TLSFiles{InsecurePlaintext: true}, HTTP: HTTPOptions{TLSCertFile: "a"}}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "--tls-serving-key-file") {
		t.Fatalf("cert without key: %v", err)
	}
	if _, _, err := NewHandler(context.Background(), Options{BinderAddress: "127.0.0.1:1", TLS: grpcutil.TLSFiles{InsecurePlaintext: true}, Auth: AuthOptions{Kubeconfig: filepath.Join(t.TempDir(), "none")}}); err == nil {
		t.Fatal("no reachable Kubernetes configuration: the gateway must refuse to start rather than serve unauthenticated")
	}
}
