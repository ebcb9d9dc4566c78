package grpcutil_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/test/harness/pki"
)

// A volplane service serves mutual TLS; a client of the same CA dials it.
func ExampleNewServer() {
	dir, _ := os.MkdirTemp("", "grpcutil-example-")
	defer os.RemoveAll(dir)
	certs, err := pki.Generate(dir, "provisioner", "binder")
	if err != nil {
		panic(err)
	}

	srv, err := grpcutil.NewServer(slog.New(slog.DiscardHandler), grpcutil.ServerOptions{TLS: certs["provisioner"]})
	if err != nil {
		panic(err)
	}
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()
	srv.SetServing(true)

	cc, err := grpcutil.Dial(lis.Addr().String(), certs["binder"])
	if err != nil {
		panic(err)
	}
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Println(resp.GetStatus(), err)
	cc.Close()
	cancel()
	<-done
	// Output: SERVING <nil>
}
