package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	"github.com/volplane/volplane/test/harness/pki"
)

// clusterRoles reads the ClusterRoles of a shipped manifest, so that the
// file itself is what the tests prove.
func clusterRoles(t testing.TB, file string) map[string]*rbacv1.ClusterRole {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "deploy", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]*rbacv1.ClusterRole{}
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var doc struct {
			metav1.TypeMeta `json:",inline"`
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Kind != "ClusterRole" {
			continue
		}
		cr := &rbacv1.ClusterRole{}
		if err := json.Unmarshal(raw, cr); err != nil {
			t.Fatal(err)
		}
		out[cr.Name] = cr
	}
	return out
}

// applyClusterRole creates or replaces a ClusterRole as the manifest has it.
func applyClusterRole(t testing.TB, cr *rbacv1.ClusterRole) {
	t.Helper()
	ctx := context.Background()
	c := cluster.client.RbacV1().ClusterRoles()
	cr = cr.DeepCopy()
	if _, err := c.Create(ctx, cr, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		old, err := c.Get(ctx, cr.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cr.ResourceVersion = old.ResourceVersion
		if _, err := c.Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// bind binds a ClusterRole to a subject until the test ends.
func bind(t testing.TB, name, role string, subject rbacv1.Subject) {
	t.Helper()
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{subject}}
	if _, err := cluster.client.RbacV1().ClusterRoleBindings().Create(context.Background(), crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// serviceAccountToken creates a ServiceAccount and mints a token for it
// with the TokenRequest API.
func serviceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cluster.client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cluster.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// standInProvisioner answers every call NotFound: the shared e2e cluster
// runs no provisioner, and these tests need its routes served only to see
// who gets past authorization.
func standInProvisioner(t testing.TB) string {
	t.Helper()
	srv, err := grpcutil.NewServer(slog.New(slog.DiscardHandler), grpcutil.ServerOptions{TLS: cluster.e2e.TLS("provisioner")},
		grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			return status.Error(codes.NotFound, "stand-in provisioner: no such volume")
		}))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Server.Serve(lis)
	t.Cleanup(srv.Server.Stop)
	return lis.Addr().String()
}

// authGateway is a gateway run for real (gateway.Run, HTTPS) whose
// TokenReviews and SubjectAccessReviews are made as the ServiceAccount
// gatewaySA, and whose client CA is clientCA.
type authGateway struct {
	url    string
	roots  *x509.CertPool
	client *http.Client
}

func startAuthGateway(t testing.TB, gatewaySA, clientCA string, mutate func(*gateway.Options)) *authGateway {
	t.Helper()
	dir := t.TempDir()
	serving, err := pki.NewCA(filepath.Join(dir, "serving"), "gateway-serving-ca")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := serving.Issue("gateway")
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's own client to the API server: the ServiceAccount, by
	// impersonation, with only what it is bound to.
	cfg := rest.CopyConfig(cluster.env.RESTConfig)
	ns, name, _ := strings.Cut(gatewaySA, "/")
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	addr := freeAddr()
	o := gateway.Options{
		Listen: addr, BinderAddress: cluster.binderAddr, WatcherAddress: cluster.watcherAddr,
		ReclaimerAddress: cluster.reclaimerAddr, ProvisionerAddress: standInProvisioner(t),
		TLS:    cluster.e2e.TLS("gateway"),
		Auth:   gateway.AuthOptions{RESTConfig: cfg, ClientCAFile: clientCA},
		HTTP:   gateway.HTTPOptions{TLSCertFile: cert.CertFile, TLSKeyFile: cert.KeyFile},
		Logger: cluster.e2e.Logger("gateway", slog.LevelDebug),
	}
	if mutate != nil {
		mutate(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("gateway.Run: %v", err)
		}
	})
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(serving.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(pem)
	g := &authGateway{url: "https://" + addr, roots: roots}
	g.client = g.clientWith(nil)
	eventually(t.(*testing.T), 30*time.Second, func() string {
		resp, err := g.client.Get(g.url + "/healthz")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return ""
	})
	return g
}

func (g *authGateway) clientWith(cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: g.roots}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 30 * time.Second}
}

// call sends a request and returns the status and the JSON error's message
// (or the body).
func (g *authGateway) call(t testing.TB, c *http.Client, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if c == nil {
		c = g.client
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Message string }
	if json.Unmarshal(b, &e) == nil && e.Message != "" {
		return resp.StatusCode, e.Message
	}
	return resp.StatusCode, string(b)
}

// The gateway against the real API server: ServiceAccount tokens from the
// TokenRequest API and client certificates authenticate; the shipped
// ClusterRoles authorize; the gateway itself needs only the shipped
// volplane-gateway role.
func TestGatewayAuthenticatesAndAuthorizesWithTheCluster(t *testing.T) {
	n := ns(t)
	roles := clusterRoles(t, "roles.yaml")
	gwRoles := clusterRoles(t, "rbac.yaml")
	for _, name := range []string{"volplane-viewer", "volplane-operator"} {
		if roles[name] == nil {
			t.Fatalf("roles.yaml has no ClusterRole %s", name)
		}
		applyClusterRole(t, roles[name])
	}
	if gwRoles["volplane-gateway"] == nil {
		t.Fatal("rbac.yaml has no ClusterRole volplane-gateway")
	}
	applyClusterRole(t, gwRoles["volplane-gateway"])

	viewer := serviceAccountToken(t, n, "viewer")
	operator := serviceAccountToken(t, n, "operator")
	serviceAccountToken(t, n, "gateway")
	bind(t, n+"-viewer", "volplane-viewer", rbacv1.Subject{Kind: "ServiceAccount", Name: "viewer", Namespace: n})
	bind(t, n+"-operator", "volplane-operator", rbacv1.Subject{Kind: "ServiceAccount", Name: "operator", Namespace: n})
	bind(t, n+"-gateway", "volplane-gateway", rbacv1.Subject{Kind: "ServiceAccount", Name: "gateway", Namespace: n})

	// Client certificates: alice's CA is the gateway's client CA,
	// mallory's is not.
	dir := t.TempDir()
	clientCA, err := pki.NewCA(filepath.Join(dir, "clients"), "gateway-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := pki.NewCA(filepath.Join(dir, "other"), "other-ca")
	if err != nil {
		t.Fatal(err)
	}
	alice := "alice-" + n
	aliceFiles, err := clientCA.Issue(alice)
	if err != nil {
		t.Fatal(err)
	}
	malloryFiles, err := otherCA.Issue("mallory")
	if err != nil {
		t.Fatal(err)
	}
	bind(t, n+"-alice", "volplane-viewer", rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: alice})

	g := startAuthGateway(t, n+"/gateway", clientCA.CertFile, nil)

	createPV(t, n+"-auth-pv", "1Gi", "auth")
	createPVC(t, n, "auth-claim", "1Gi", "auth")
	pvcPhase(t, n, "auth-claim", corev1.ClaimBound)
	claimPath := "/v1/namespaces/" + n + "/claims/auth-claim"

	t.Run("no or bad credential", func(t *testing.T) {
		for _, token := range []string{"", "garbage", operator[:len(operator)-4] + "AAAA"} {
			code, msg := g.call(t, nil, "GET", claimPath, token, "")
			if code != http.StatusUnauthorized {
				t.Errorf("token %.10q: %d %s, want 401", token, code, msg)
			}
		}
		if code, _ := g.call(t, nil, "GET", "/healthz", "", ""); code != http.StatusOK {
			t.Errorf("healthz without a credential: %d", code)
		}
	})

	t.Run("viewer reads, may not write", func(t *testing.T) {
		code, body := g.call(t, nil, "GET", claimPath, viewer, "")
		if code != http.StatusOK || !strings.Contains(body, `"phase":"Bound"`) {
			t.Fatalf("viewer GET claim: %d %s", code, body)
		}
		if code, body := g.call(t, nil, "GET", "/v1/claims", viewer, ""); code != http.StatusOK {
			t.Errorf("viewer lists claims: %d %s", code, body)
		}
		for _, w := range []struct{ method, path, body, verb, resource string }{
			{"POST", claimPath + ":sync", "", "update", "claims/sync"},
			{"POST", "/v1/volumes/" + n + "-auth-pv:sync", "", "update", "volumes/sync"},
			{"POST", "/v1/volumes/" + n + "-auth-pv:deleteBacking", "{}", "delete", "volumes/backing"},
			{"POST", "/v1/reclaims", `{"volumeName":"` + n + `-auth-pv"}`, "create", "reclaims"},
			{"POST", "/v1/reclaims/" + n + "-auth-pv:retry", "", "update", "reclaims/retry"},
			{"POST", "/v1/provisions", `{"claimNamespace":"` + n + `","claimName":"auth-claim"}`, "create", "provisions"},
		} {
			code, msg := g.call(t, nil, w.method, w.path, viewer, w.body)
			if code != http.StatusForbidden {
				t.Errorf("viewer %s %s: %d %s, want 403", w.method, w.path, code, msg)
				continue
			}
			for _, s := range []string{"system:serviceaccount:" + n + ":viewer", "cannot " + w.verb, `resource "` + w.resource + `"`, "volplane.io"} {
				if !strings.Contains(msg, s) {
					t.Errorf("viewer %s %s: 403 message %q lacks %q", w.method, w.path, msg, s)
				}
			}
		}
	})

	t.Run("operator passes authorization", func(t *testing.T) {
		if code, body := g.call(t, nil, "POST", claimPath+":sync", operator, ""); code != http.StatusOK {
			t.Errorf("operator syncs the claim: %d %s", code, body)
		}
		if code, body := g.call(t, nil, "POST", "/v1/reclaims/"+n+"-nope:retry", operator, ""); (code != http.StatusNotFound && code != http.StatusConflict) || !strings.Contains(body, n+"-nope") {
			t.Errorf("operator retries an unknown reclaim: %d %s, want the reclaimer's 404 or 409", code, body)
		}
		if code, body := g.call(t, nil, "POST", "/v1/volumes/"+n+"-nope:deleteBacking", operator, "{}"); code != http.StatusNotFound {
			t.Errorf("operator deletes an unknown backing volume: %d %s, want the provisioner's 404", code, body)
		}
		// The bound volume: the reclaimer refuses, the data stays.
		if code, body := g.call(t, nil, "POST", "/v1/reclaims", operator, `{"volumeName":"`+n+`-auth-pv"}`); code < 400 || code == http.StatusForbidden || code >= 500 {
			t.Errorf("operator reclaims a Bound volume: %d %s, want the reclaimer's refusal", code, body)
		}
		pvcPhase(t, n, "auth-claim", corev1.ClaimBound)
	})

	t.Run("client certificate", func(t *testing.T) {
		kp, err := tls.LoadX509KeyPair(aliceFiles.CertFile, aliceFiles.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		c := g.clientWith(&kp)
		if code, body := g.call(t, c, "GET", claimPath, "", ""); code != http.StatusOK {
			t.Errorf("alice (certificate, viewer) GET claim: %d %s", code, body)
		}
		if code, msg := g.call(t, c, "POST", claimPath+":sync", "", ""); code != http.StatusForbidden || !strings.Contains(msg, `User "`+alice+`"`) {
			t.Errorf("alice syncs: %d %s, want 403 naming her", code, msg)
		}
		kp, err = tls.LoadX509KeyPair(malloryFiles.CertFile, malloryFiles.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		if code, msg := g.call(t, g.clientWith(&kp), "GET", claimPath, "", ""); code != http.StatusUnauthorized {
			t.Errorf("certificate of another CA: %d %s, want 401", code, msg)
		}
	})

	t.Run("the gateway needs its role", func(t *testing.T) {
		// A gateway whose ServiceAccount is bound to nothing cannot check
		// anyone: it answers 503, and serves nothing.
		serviceAccountToken(t, n, "unbound")
		bare := startAuthGateway(t, n+"/unbound", "", nil)
		if code, msg := bare.call(t, nil, "GET", claimPath, operator, ""); code != http.StatusServiceUnavailable {
			t.Errorf("gateway without rights: %d %s, want 503", code, msg)
		}
	})

	t.Run("anonymous", func(t *testing.T) {
		anon := startAuthGateway(t, n+"/gateway", "", func(o *gateway.Options) { o.Auth.AllowAnonymous = true })
		if code, msg := anon.call(t, nil, "GET", claimPath, "", ""); code != http.StatusForbidden || !strings.Contains(msg, auth.AnonymousUser) {
			t.Errorf("anonymous without a binding: %d %s, want 403 for %s", code, msg, auth.AnonymousUser)
		}
		if code, msg := anon.call(t, nil, "GET", claimPath, "garbage", ""); code != http.StatusUnauthorized {
			t.Errorf("a bad token is never anonymous: %d %s", code, msg)
		}
	})
}

// The cost of authentication and authorization on read throughput: GET of
// one claim through the bare grpc-gateway mux (no auth), the gateway with
// its caches (as shipped), and the gateway with the caches off (a
// TokenReview and a SubjectAccessReview against the real API server per
// request). It only measures; run it with
//
//	VOLPLANE_GATEWAY_BENCH=1 go test -count=1 -v -run TestGatewayAuthorizationCost ./test/e2e/
func TestGatewayAuthorizationCost(t *testing.T) {
	if os.Getenv("VOLPLANE_GATEWAY_BENCH") == "" {
		t.Skip("a measurement: set VOLPLANE_GATEWAY_BENCH=1")
	}
	n := ns(t)
	roles := clusterRoles(t, "roles.yaml")
	applyClusterRole(t, roles["volplane-viewer"])
	viewer := serviceAccountToken(t, n, "viewer")
	bind(t, n+"-viewer", "volplane-viewer", rbacv1.Subject{Kind: "ServiceAccount", Name: "viewer", Namespace: n})
	createPV(t, n+"-bench-pv", "1Gi", "bench")
	createPVC(t, n, "bench-claim", "1Gi", "bench")
	pvcPhase(t, n, "bench-claim", corev1.ClaimBound)
	path := "/v1/namespaces/" + n + "/claims/bench-claim"

	// No auth: grpc-gateway's mux over the same connection settings.
	cc, err := cluster.e2e.Dial(cluster.binderAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	bare := runtime.NewServeMux()
	if err := binderv1.RegisterBinderServiceHandler(context.Background(), bare, cc); err != nil {
		t.Fatal(err)
	}
	handler := func(o gateway.AuthOptions) http.Handler {
		h, closeAll, err := gateway.NewHandler(context.Background(), gateway.Options{BinderAddress: cluster.binderAddr,
			TLS: cluster.e2e.TLS("gateway"), Auth: o, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeAll)
		return h
	}
	admin := cluster.env.RESTConfig
	for _, m := range []struct {
		name string
		h    http.Handler
	}{
		{"no auth (bare grpc-gateway)", bare},
		{"auth, caches warm (default TTLs)", handler(gateway.AuthOptions{RESTConfig: admin})},
		{"auth, caches off (TokenReview + SAR per request)", handler(gateway.AuthOptions{RESTConfig: admin, TokenCacheTTL: -1, AllowedCacheTTL: -1, DeniedCacheTTL: -1})},
	} {
		srv := httptest.NewServer(m.h)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
		get := func() error {
			req, _ := http.NewRequest("GET", srv.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+viewer)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s", resp.Status)
			}
			return nil
		}
		if err := get(); err != nil { // warms the caches
			t.Fatalf("%s: %v", m.name, err)
		}
		const workers, d = 8, 3 * time.Second
		var count atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					if err := get(); err != nil {
						t.Errorf("%s: %v", m.name, err)
						return
					}
					count.Add(1)
				}
			}()
		}
		wg.Wait()
		srv.Close()
		t.Logf("%-50s %8.0f req/s (%d GETs, %d clients, %v)", m.name, float64(count.Load())/d.Seconds(), count.Load(), workers, d)
	}
}
