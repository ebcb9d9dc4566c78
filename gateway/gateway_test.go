package gateway_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// /readyz reports each backend's gRPC health and stays 200 whatever it
// is: a backend that is not ready does not take the REST API down with it
// (backends_test.go: its routes answer 503 naming it, the others work).
func TestReadyzReportsBackendHealth(t *testing.T) {
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

	// The backends are checked in the background: poll.
	wait := func(binder string, unavailable int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get(web.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Ready       bool
				Backends    map[string]string
				Unavailable []string
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !body.Ready {
				t.Fatalf("readyz %d %+v: the gateway must stay ready", resp.StatusCode, body)
			}
			if body.Backends["binder"] == binder && len(body.Unavailable) == unavailable {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("readyz %+v, want the binder %s", body, binder)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	wait("NOT_SERVING", 1)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	wait("SERVING", 0)
	if resp, err := http.Get(web.URL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

func TestOptionsNeedABinder(t *testing.T) {
	if _, _, err := gateway.NewHandler(context.Background(), gateway.Options{Auth: gateway.AuthOptions{Client: fake.NewClientset()}}); err == nil {
		t.Fatal("no binder address: want an error naming --binder-address")
	}
}
