package gateway

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// statusBinder answers GetStatus; everything else is Unimplemented.
type statusBinder struct {
	binderv1.UnimplementedBinderServiceServer
}

func (statusBinder) GetStatus(context.Context, *binderv1.GetStatusRequest) (*binderv1.GetStatusResponse, error) {
	return &binderv1.GetStatusResponse{MemberId: "binder-0"}, nil
}

// driversProvisioner answers ListDrivers.
type driversProvisioner struct {
	provisionerv1.UnimplementedProvisionerServiceServer
}

func (driversProvisioner) ListDrivers(context.Context, *provisionerv1.ListDriversRequest) (*provisionerv1.ListDriversResponse, error) {
	return &provisionerv1.ListDriversResponse{}, nil
}

// startBackend serves register's service and a gRPC health service on a
// loopback port.
func startBackend(t *testing.T, register func(*grpc.Server)) (string, *grpc.Server, *health.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), srv, hs
}

type readyz struct {
	code        int
	Ready       bool              `json:"ready"`
	APIServer   string            `json:"apiServer"`
	Backends    map[string]string `json:"backends"`
	Unavailable []string          `json:"unavailable"`
}

func getReadyz(t *testing.T, url string) readyz {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := readyz{code: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	return r
}

func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// With one backend stopped the gateway stays ready and keeps serving the
// others' routes; /readyz says which backend is down, and its routes
// answer 503 naming it.
func TestOneBackendStopped(t *testing.T) {
	binderAddr, _, _ := startBackend(t, func(s *grpc.Server) { binderv1.RegisterBinderServiceServer(s, statusBinder{}) })
	provAddr, provSrv, _ := startBackend(t, func(s *grpc.Server) { provisionerv1.RegisterProvisionerServiceServer(s, driversProvisioner{}) })
	c := newFakeCluster()
	h, closeAll, err := NewHandler(t.Context(), Options{
		BinderAddress: binderAddr, ProvisionerAddress: provAddr,
		TLS:    grpcutil.TLSFiles{InsecurePlaintext: true},
		Auth:   AuthOptions{Client: c.cs, TokenCacheTTL: -1, AllowedCacheTTL: -1, DeniedCacheTTL: -1},
		Logger: discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	web := httptest.NewServer(h)
	t.Cleanup(web.Close)
	g := &testGateway{url: web.URL, cluster: c, handler: h}

	eventually(t, 10*time.Second, func() string {
		if r := getReadyz(t, web.URL); r.code != 200 || r.Backends["binder"] != "SERVING" || r.Backends["provisioner"] != "SERVING" || len(r.Unavailable) != 0 {
			return "both backends up: " + dump(r)
		}
		return ""
	})
	for _, path := range []string{"/v1/binder/status", "/v1/drivers"} {
		if resp, e := g.do(t, "GET", path, "viewer-token", nil); resp.StatusCode != 200 {
			t.Fatalf("GET %s with both up: %s %s", path, resp.Status, e.Message)
		}
	}

	provSrv.Stop()
	// At once and after the next check: 503 naming the provisioner.
	for i := range 2 {
		resp, e := g.do(t, "GET", "/v1/drivers", "viewer-token", nil)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(e.Message, "provisioner unavailable: ") {
			t.Fatalf("GET /v1/drivers (%d) with the provisioner stopped: %s %q, want 503 \"provisioner unavailable: ...\"", i, resp.Status, e.Message)
		}
		eventually(t, 10*time.Second, func() string {
			r := getReadyz(t, web.URL)
			if r.code != 200 || !r.Ready {
				return "the gateway must stay ready with one backend down: " + dump(r)
			}
			if !strings.HasPrefix(r.Backends["provisioner"], "unreachable at "+provAddr) || r.Backends["binder"] != "SERVING" ||
				len(r.Unavailable) != 1 || r.Unavailable[0] != "provisioner" {
				return "/readyz must say the provisioner is down: " + dump(r)
			}
			return ""
		})
	}
	// The binder's routes still work.
	if resp, e := g.do(t, "GET", "/v1/binder/status", "viewer-token", nil); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/binder/status with the provisioner down: %s %s", resp.Status, e.Message)
	}
	// Still authenticated and authorized first: no credential, no answer
	// about the backends beyond /readyz.
	if resp, _ := g.do(t, "GET", "/v1/drivers", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/drivers without a credential: %s, want 401", resp.Status)
	}
}

// A backend that is up but not ready (NOT_SERVING) is still asked: it
// answers what it can (reads from its cache); /readyz names its state.
func TestNotServingBackendIsStillAsked(t *testing.T) {
	binderAddr, _, hs := startBackend(t, func(s *grpc.Server) { binderv1.RegisterBinderServiceServer(s, statusBinder{}) })
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	c := newFakeCluster()
	h, closeAll, err := NewHandler(t.Context(), Options{
		BinderAddress: binderAddr, TLS: grpcutil.TLSFiles{InsecurePlaintext: true},
		Auth: AuthOptions{Client: c.cs}, Logger: discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	web := httptest.NewServer(h)
	t.Cleanup(web.Close)
	eventually(t, 10*time.Second, func() string {
		if r := getReadyz(t, web.URL); r.code != 200 || r.Backends["binder"] != "NOT_SERVING" || len(r.Unavailable) != 1 {
			return dump(r)
		}
		return ""
	})
	g := &testGateway{url: web.URL, cluster: c, handler: h}
	if resp, e := g.do(t, "GET", "/v1/binder/status", "viewer-token", nil); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/binder/status of a NOT_SERVING binder: %s %s", resp.Status, e.Message)
	}
}

// Without the API server no caller can be authenticated or authorized:
// the gateway is not ready, and says why.
func TestNotReadyWithoutTheAPIServer(t *testing.T) {
	binderAddr, _, _ := startBackend(t, func(s *grpc.Server) { binderv1.RegisterBinderServiceServer(s, statusBinder{}) })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead.Close()
	h, closeAll, err := NewHandler(t.Context(), Options{
		BinderAddress: binderAddr, TLS: grpcutil.TLSFiles{InsecurePlaintext: true},
		Auth: AuthOptions{RESTConfig: &rest.Config{Host: "http://" + dead.Addr().String()}}, Logger: discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	web := httptest.NewServer(h)
	t.Cleanup(web.Close)
	eventually(t, 20*time.Second, func() string {
		r := getReadyz(t, web.URL)
		if r.code != http.StatusServiceUnavailable || r.Ready || !strings.Contains(r.APIServer, "failing for over") {
			return "want 503 naming the API server: " + dump(r)
		}
		return ""
	})
}

func dump(r readyz) string {
	b, _ := json.Marshal(r)
	return string(b)
}
