package grpcutil_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
	"github.com/volplane/volplane/test/harness/pki"
)

// volplaneServices are the four gRPC APIs, each with a handler that answers
// Unimplemented: a call that gets that code went through every
// interceptor to the handler.
var volplaneServices = map[string]struct {
	desc *grpc.ServiceDesc
	impl any
}{
	"watcher":     {&watcherv1.WatcherService_ServiceDesc, watcherv1.UnimplementedWatcherServiceServer{}},
	"binder":      {&binderv1.BinderService_ServiceDesc, binderv1.UnimplementedBinderServiceServer{}},
	"provisioner": {&provisionerv1.ProvisionerService_ServiceDesc, provisionerv1.UnimplementedProvisionerServiceServer{}},
	"reclaimer":   {&reclaimerv1.ReclaimerService_ServiceDesc, reclaimerv1.UnimplementedReclaimerServiceServer{}},
}

// invoke calls method (unary or server stream) with an empty request and
// returns the call's error.
func invoke(ctx context.Context, cc *grpc.ClientConn, method string, stream bool) error {
	if !stream {
		return cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&emptypb.Empty{}); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	return s.RecvMsg(&emptypb.Empty{})
}

// TestServersAuthorizeCallersByIdentity serves each volplane API over
// mutual TLS, as every service does, and calls every RPC with every
// identity the CA signs: the services, the test harness, and a user's
// certificate of the same CA (what `make up` used to print as a viewer).
// A caller the table does not list gets PermissionDenied naming its
// identity and the RPC, and never reaches the handler; the callers it
// lists do.
func TestServersAuthorizeCallersByIdentity(t *testing.T) {
	const viewer = "volplane-dev" // a user's name, as a client certificate carries it
	names := append(append([]string{}, pki.Services...), viewer, callers.Conformance)
	certs, err := pki.Generate(t.TempDir(), names...)
	if err != nil {
		t.Fatal(err)
	}
	identity := func(name string) string {
		if slices.Contains(pki.Services, name) {
			return callers.ServiceIdentity(name)
		}
		return name
	}
	table := callers.Default()
	for svc, api := range volplaneServices {
		t.Run(svc, func(t *testing.T) {
			logs := &syncBuffer{}
			srv, err := grpcutil.NewServer(slogTo(logs), grpcutil.ServerOptions{TLS: certs[svc]})
			if err != nil {
				t.Fatal(err)
			}
			srv.RegisterService(api.desc, api.impl)
			addr := serve(t, srv)
			type call struct {
				method string
				stream bool
			}
			calls := []call{{healthpb.Health_Check_FullMethodName, false}}
			for _, m := range api.desc.Methods {
				calls = append(calls, call{"/" + api.desc.ServiceName + "/" + m.MethodName, false})
			}
			for _, s := range api.desc.Streams {
				calls = append(calls, call{"/" + api.desc.ServiceName + "/" + s.StreamName, true})
			}
			for _, name := range names {
				cc := dial(t, addr, certs[name])
				id := identity(name)
				for _, c := range calls {
					err := invoke(ctxTimeout(t), cc, c.method, c.stream)
					allowed := table.Allowed(c.method, id)
					switch {
					case allowed && status.Code(err) == codes.PermissionDenied:
						t.Errorf("%s calling %s: %v, want it let through", id, c.method, err)
					case allowed && c.method != healthpb.Health_Check_FullMethodName && status.Code(err) != codes.Unimplemented:
						t.Errorf("%s calling %s: %v, want the handler's Unimplemented", id, c.method, err)
					case !allowed && status.Code(err) != codes.PermissionDenied:
						t.Errorf("%s calling %s: %v, want PermissionDenied", id, c.method, err)
					case !allowed && !strings.Contains(status.Convert(err).Message(), fmt.Sprintf("%q may not call %s", id, c.method)):
						t.Errorf("%s calling %s: %q does not name the caller and the RPC", id, c.method, status.Convert(err).Message())
					}
				}
			}
			if l := logs.String(); !strings.Contains(l, "code=PermissionDenied") || !strings.Contains(l, "caller="+viewer) {
				t.Errorf("refusals not logged with the caller:\n%s", l)
			}
		})
	}

	// What the issue found: the viewer's certificate straight at the
	// provisioner's port, and the services that do call these RPCs.
	for _, tc := range []struct {
		caller, method string
		allowed        bool
	}{
		{viewer, provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName, false},
		{viewer, provisionerv1.ProvisionerService_Provision_FullMethodName, false},
		{viewer, provisionerv1.ProvisionerService_DeleteVolume_FullMethodName, false},
		{viewer, reclaimerv1.ReclaimerService_Reclaim_FullMethodName, false},
		{viewer, binderv1.BinderService_SyncClaim_FullMethodName, false},
		{viewer, watcherv1.WatcherService_Watch_FullMethodName, false},
		{viewer, healthpb.Health_Check_FullMethodName, true},
		{callers.Reclaimer, provisionerv1.ProvisionerService_Provision_FullMethodName, false},
		{callers.Binder, provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName, false},
		{callers.Watcher, binderv1.BinderService_GetClaim_FullMethodName, false},
		{callers.Provisioner, reclaimerv1.ReclaimerService_Reclaim_FullMethodName, false},
		{callers.Binder, provisionerv1.ProvisionerService_Provision_FullMethodName, true},
		{callers.Reclaimer, provisionerv1.ProvisionerService_DeleteVolume_FullMethodName, true},
		{callers.Gateway, provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName, true},
		{callers.Binder, reclaimerv1.ReclaimerService_Reclaim_FullMethodName, true},
		{callers.Provisioner, watcherv1.WatcherService_Watch_FullMethodName, true},
		{callers.Conformance, provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName, true},
	} {
		if got := table.Allowed(tc.method, tc.caller); got != tc.allowed {
			t.Errorf("table: %s calling %s allowed=%v, want %v", tc.caller, tc.method, got, tc.allowed)
		}
	}
}

// TestPlaintextServersCheckNoIdentity: --insecure-plaintext has no
// identity to check; it lets everyone through, as documented.
func TestPlaintextServersCheckNoIdentity(t *testing.T) {
	srv, err := grpcutil.NewServer(discard(), grpcutil.ServerOptions{TLS: grpcutil.TLSFiles{InsecurePlaintext: true}})
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterService(&provisionerv1.ProvisionerService_ServiceDesc, provisionerv1.UnimplementedProvisionerServiceServer{})
	addr := "unix://" + filepath.Join(t.TempDir(), "p.sock")
	lis, err := grpcutil.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, lis)
	cc := dial(t, addr, grpcutil.TLSFiles{InsecurePlaintext: true})
	if err := invoke(ctxTimeout(t), cc, provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName, false); status.Code(err) != codes.Unimplemented {
		t.Fatalf("plaintext call: %v, want the handler's Unimplemented", err)
	}
}

// TestServerTableReplacesTheDefault: a server given its own table enforces
// it instead of Default.
func TestServerTableReplacesTheDefault(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startServer(t, grpcutil.ServerOptions{TLS: certs["a"], Callers: callers.Table{"/test.Things/Delete": {"a"}}},
		func(context.Context) error { return nil }, func(context.Context) error { return nil })
	if err := callDelete(ctxTimeout(t), dial(t, addr, certs["a"])); err != nil {
		t.Errorf("a: %v", err)
	}
	if err := callDelete(ctxTimeout(t), dial(t, addr, certs["b"])); status.Code(err) != codes.PermissionDenied {
		t.Errorf("b: %v, want PermissionDenied", err)
	}
	if err := callWatch(ctxTimeout(t), dial(t, addr, certs["a"])); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a watching, which the table does not list: %v, want PermissionDenied", err)
	}
}

func serve(t *testing.T, srv *grpcutil.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, lis)
	return lis.Addr().String()
}

func serveOn(t *testing.T, srv *grpcutil.Server, lis net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	srv.SetServing(true)
}

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
