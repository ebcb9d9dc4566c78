package grpcutil_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/volplane/volplane/pkg/grpcutil"
)

func TestSanitizeRedactsSecrets(t *testing.T) {
	req := &csi.CreateVolumeRequest{Name: "pvc-1", Secrets: map[string]string{"password": "hunter2"}}
	out := grpcutil.Sanitize(req)
	if strings.Contains(out, "hunter2") || !strings.Contains(out, "pvc-1") {
		t.Fatalf("sanitized: %s", out)
	}
	if req.Secrets["password"] != "hunter2" {
		t.Fatal("Sanitize changed the request itself")
	}
}

func TestServerHealthOverUnixSocket(t *testing.T) {
	addr := "unix://" + filepath.Join(t.TempDir(), "s.sock")
	lis, err := grpcutil.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcutil.NewServer(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()

	cc, err := grpcutil.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || resp.Status != want {
			t.Fatalf("health: %v %v, want %v", resp, err, want)
		}
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	srv.SetServing(true)
	check(healthpb.HealthCheckResponse_SERVING)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
