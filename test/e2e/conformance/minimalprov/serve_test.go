package minimalprov

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/grpcutil"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serveUntilCleanup serves srv on lis until the test ends.
func serveUntilCleanup(t *testing.T, srv *grpcutil.Server, lis net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
}

// serveProvisioner serves p as ProvisionerService with mutual TLS, as
// every volplane service serves, on a loopback port it returns.
func serveProvisioner(t *testing.T, p provisionerv1.ProvisionerServiceServer, tls grpcutil.TLSFiles) string {
	t.Helper()
	srv, err := grpcutil.NewServer(discard(), grpcutil.ServerOptions{TLS: tls})
	if err != nil {
		t.Fatal(err)
	}
	provisionerv1.RegisterProvisionerServiceServer(srv.Server, p)
	srv.SetServing(true, provisionerv1.ProvisionerService_ServiceDesc.ServiceName)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveUntilCleanup(t, srv, lis)
	return lis.Addr().String()
}
