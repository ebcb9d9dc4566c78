package gateway_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/grpcutil"
)

func TestReadyzFollowsBackendHealth(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis)
	defer srv.Stop()

	h, closeAll, err := gateway.NewHandler(context.Background(), gateway.Options{BinderAddress: lis.Addr().String(), TLS: grpcutil.TLSFiles{InsecurePlaintext: true},
		Auth: gateway.AuthOptions{Client: fake.NewClientset()}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	web := httptest.NewServer(h)
	defer web.Close()

	check := func(want int) map[string]any {
		t.Helper()
		resp, err := http.Get(web.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != want {
			t.Fatalf("readyz %d %v, want %d", resp.StatusCode, body, want)
		}
		return body
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	body := check(http.StatusServiceUnavailable)
	if b := body["backends"].(map[string]any); b["binder"] != "NOT_SERVING" {
		t.Fatalf("readyz must name the backend that is not ready: %v", body)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	check(http.StatusOK)
	if resp, err := http.Get(web.URL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

func TestOptionsNeedABinder(t *testing.T) {
	if _, _, err := gateway.NewHandler(context.Background(), gateway.Options{Auth: gateway.AuthOptions{Client: fake.NewClientset()}}); err == nil {
		t.Fatal("no binder address: want an error naming --binder-address")
	}
}
