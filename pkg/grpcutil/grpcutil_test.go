package grpcutil_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/test/harness/pki"
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

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestServerHealthOverUnixSocket(t *testing.T) {
	addr := "unix://" + filepath.Join(t.TempDir(), "s.sock")
	lis, err := grpcutil.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcutil.NewCSIServer(discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()

	cc, err := grpcutil.DialCSI(addr)
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

func TestTLSFilesRequiredOrPlaintextExplicit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files grpcutil.TLSFiles
		want  string
	}{
		{"none", grpcutil.TLSFiles{}, "--tls-ca-file"},
		{"no key", grpcutil.TLSFiles{CAFile: "ca", CertFile: "c"}, "--tls-key-file"},
		{"both", grpcutil.TLSFiles{CAFile: "ca", CertFile: "c", KeyFile: "k", InsecurePlaintext: true}, "exclusive"},
		{"missing file", grpcutil.TLSFiles{CAFile: "/nonexistent/ca", CertFile: "c", KeyFile: "k"}, "/nonexistent/ca"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := grpcutil.NewServer(discard(), grpcutil.ServerOptions{TLS: tc.files})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewServer: %v, want an error naming %q", err, tc.want)
			}
			if _, err := grpcutil.Dial("127.0.0.1:1", tc.files); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Dial: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestValidateListenAndTLS(t *testing.T) {
	files := grpcutil.TLSFiles{CAFile: "ca", CertFile: "c", KeyFile: "k"}
	for _, tc := range []struct {
		name   string
		listen string
		files  grpcutil.TLSFiles
		want   []string // flags the errors name, in order; none: valid
	}{
		{"both set", "127.0.0.1:0", files, nil},
		{"plaintext", "unix:///tmp/s", grpcutil.TLSFiles{InsecurePlaintext: true}, nil},
		{"no listen", "", files, []string{"--listen"}},
		{"neither", "", grpcutil.TLSFiles{}, []string{"--listen", "--tls-ca-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := grpcutil.ValidateListenAndTLS(tc.listen, tc.files)
			if len(errs) != len(tc.want) {
				t.Fatalf("errors %v, want %d naming %v", errs, len(tc.want), tc.want)
			}
			for i, flag := range tc.want {
				if !strings.Contains(errs[i].Error(), flag) {
					t.Errorf("error %d %q does not name %s", i, errs[i], flag)
				}
			}
		})
	}
}

type syncBuffer struct {
	mu sync.Mutex
	bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Buffer.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Buffer.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.Buffer.Reset()
}

// startServer runs a NewServer on loopback serving a test service whose
// unary method Delete and stream method WatchThings run the given
// functions, open to every certificate of the CA unless o.Callers says
// otherwise; it returns its address and its log.
func startServer(t *testing.T, o grpcutil.ServerOptions, unary func(ctx context.Context) error, stream func(ctx context.Context) error) (string, *syncBuffer) {
	t.Helper()
	if o.Callers == nil {
		o.Callers = callers.Default()
		o.Callers["/test.Things/Delete"] = []string{callers.Any}
		o.Callers["/test.Things/WatchThings"] = []string{callers.Any}
	}
	logs := &syncBuffer{}
	srv, err := grpcutil.NewServer(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})), o)
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.Things",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Delete", Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := &emptypb.Empty{}
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) { return &emptypb.Empty{}, unary(ctx) }
			return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/test.Things/Delete"}, h)
		}}},
		Streams: []grpc.StreamDesc{{StreamName: "WatchThings", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			if err := ss.RecvMsg(&emptypb.Empty{}); err != nil {
				return err
			}
			if err := stream(ss.Context()); err != nil {
				return err
			}
			return ss.SendMsg(&emptypb.Empty{})
		}}},
	}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	return lis.Addr().String(), logs
}

func callDelete(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
	return cc.Invoke(ctx, "/test.Things/Delete", &emptypb.Empty{}, &emptypb.Empty{}, opts...)
}

func callWatch(ctx context.Context, cc *grpc.ClientConn) error {
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/test.Things/WatchThings")
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

func dial(t *testing.T, addr string, files grpcutil.TLSFiles) *grpc.ClientConn {
	t.Helper()
	cc, err := grpcutil.Dial(addr, files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestMutualTLS serves with a service certificate and checks who gets in:
// a client with a certificate of the same CA, and nobody else.
func TestMutualTLS(t *testing.T) {
	certs, err := pki.Generate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var caller grpcutil.Caller
	addr, logs := startServer(t, grpcutil.ServerOptions{TLS: certs["reclaimer"]},
		func(ctx context.Context) error { caller = grpcutil.CallerFrom(ctx); return nil }, nil)

	t.Run("same CA", func(t *testing.T) {
		cc := dial(t, addr, certs["gateway"])
		ctx := metadata.AppendToOutgoingContext(ctxTimeout(t), "volplane-user", "alice", "volplane-groups", "ops", "volplane-groups", "dev")
		var p peer.Peer
		if err := callDelete(ctx, cc, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		if caller.Service != callers.Gateway || caller.User != "alice" || strings.Join(caller.Groups, ",") != "ops,dev" {
			t.Fatalf("caller %+v, want the gateway acting for alice in ops and dev", caller)
		}
		st := p.AuthInfo.(credentials.TLSInfo).State
		if cn := st.PeerCertificates[0].Subject.CommonName; cn != callers.Reclaimer {
			t.Fatalf("server presented %q", cn)
		}
		// Writes are logged at info with who asked.
		if l := logs.String(); !strings.Contains(l, `msg="grpc write" method=/test.Things/Delete code=OK`) || !strings.Contains(l, "caller="+callers.Gateway+" user=alice") {
			t.Fatalf("write not logged with the caller:\n%s", l)
		}
	})

	wrongCA, err := pki.Generate(t.TempDir(), "intruder")
	if err != nil {
		t.Fatal(err)
	}
	for name, dialIt := range map[string]func() (*grpc.ClientConn, error){
		"plaintext": func() (*grpc.ClientConn, error) {
			return grpcutil.Dial(addr, grpcutil.TLSFiles{InsecurePlaintext: true})
		},
		"other CA": func() (*grpc.ClientConn, error) { return grpcutil.Dial(addr, wrongCA["intruder"]) },
		// Trusts the server (our CA) but presents a certificate of another.
		"other CA client certificate": func() (*grpc.ClientConn, error) {
			f := wrongCA["intruder"]
			f.CAFile = certs["gateway"].CAFile
			return grpcutil.Dial(addr, f)
		},
	} {
		t.Run(name+" refused", func(t *testing.T) {
			caller = grpcutil.Caller{}
			cc, err := dialIt()
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			err = callDelete(ctxTimeout(t), cc)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("call: %v, want Unavailable (handshake refused)", err)
			}
			if caller.Service != "" {
				t.Fatalf("the handler ran for %+v", caller)
			}
		})
	}

	t.Run("server of another CA refused by the client", func(t *testing.T) {
		addr2, _ := startServer(t, grpcutil.ServerOptions{TLS: wrongCA["intruder"]}, func(context.Context) error { return nil }, nil)
		err := callDelete(ctxTimeout(t), dial(t, addr2, certs["gateway"]))
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("call: %v, want Unavailable for the certificate", err)
		}
	})
}

// TestCertificateRotation replaces the server's certificate files and
// polls until new connections get the new certificate, with no restart.
func TestCertificateRotation(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(dir, "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, err := ca.Issue("provisioner")
	if err != nil {
		t.Fatal(err)
	}
	cliFiles, err := ca.Issue("binder")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startServer(t, grpcutil.ServerOptions{TLS: srvFiles}, func(context.Context) error { return nil }, nil)
	serial := func() string {
		t.Helper()
		cc := dial(t, addr, cliFiles) // a new connection each time
		defer cc.Close()
		var p peer.Peer
		if err := callDelete(ctxTimeout(t), cc, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	if _, err := ca.Issue("provisioner"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for serial() == before {
		if time.Now().After(deadline) {
			t.Fatal("new connections still get the old certificate 10s after the rotation")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// volplane_certificate_expiry_timestamp_seconds has the certificate
	// now in use, once, and the CA.
	expiry := certificateExpiry(t)
	if want := notAfter(t, srvFiles.CertFile); expiry["service CN=provisioner,O=volplane"] != want {
		t.Errorf("service certificate expiry %v, want the rotated certificate's %v (series %v)", expiry["service CN=provisioner,O=volplane"], want, expiry)
	}
	if want := notAfter(t, srvFiles.CAFile); expiry["ca CN=test-ca,O=volplane"] != want {
		t.Errorf("CA expiry %v, want %v (series %v)", expiry["ca CN=test-ca,O=volplane"], want, expiry)
	}
}

// certificateExpiry is volplane_certificate_expiry_timestamp_seconds by
// "role subject".
func certificateExpiry(t *testing.T) map[string]float64 {
	t.Helper()
	out, err := metrics.CertificateExpiries(metrics.Registry)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// notAfter is the first certificate's notAfter in a PEM file, in Unix
// seconds.
func notAfter(t *testing.T, file string) float64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return float64(c.NotAfter.Unix())
}

// TestPanicBecomesInternal: a handler that panics fails its call with
// Internal and no detail, the panic is logged once with its stack, and the
// server goes on.
func TestPanicBecomesInternal(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "a")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	panicking := true
	boom := func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if panicking {
			panic("boom: secret detail")
		}
		return nil
	}
	addr, logs := startServer(t, grpcutil.ServerOptions{TLS: certs["a"]}, boom, boom)
	cc := dial(t, addr, certs["a"])
	for name, call := range map[string]func(context.Context, *grpc.ClientConn) error{
		"unary":  func(ctx context.Context, cc *grpc.ClientConn) error { return callDelete(ctx, cc) },
		"stream": callWatch,
	} {
		err := call(ctxTimeout(t), cc)
		if status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
			t.Fatalf("%s: %v, want Internal \"internal error\"", name, err)
		}
	}
	l := logs.String()
	if n := strings.Count(l, "grpc handler panicked"); n != 2 || !strings.Contains(l, "goroutine") || !strings.Contains(l, "boom: secret detail") {
		t.Fatalf("want each panic logged once with its stack, got %d:\n%s", n, l)
	}
	mu.Lock()
	panicking = false
	mu.Unlock()
	if err := callDelete(ctxTimeout(t), cc); err != nil {
		t.Fatalf("the call after the panic: %v", err)
	}
	if err := callWatch(ctxTimeout(t), cc); err != nil {
		t.Fatalf("the stream after the panic: %v", err)
	}
}

func TestReflectionOffByDefault(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		addr, _ := startServer(t, grpcutil.ServerOptions{TLS: certs["a"], Reflection: on}, nil, nil)
		s, err := reflectionpb.NewServerReflectionClient(dial(t, addr, certs["a"])).ServerReflectionInfo(ctxTimeout(t))
		if err == nil {
			// A Send to a stream the server already ended says io.EOF;
			// Recv has the status.
			_ = s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
			_, err = s.Recv()
		}
		if got := status.Code(err); (on && got != codes.OK) || (!on && got != codes.Unimplemented) {
			t.Fatalf("reflection %v: %v", on, err)
		}
	}
}

func TestIsRead(t *testing.T) {
	for m, want := range map[string]bool{
		"/volplane.watcher.v1.WatcherService/Watch":                true,
		"/volplane.binder.v1.BinderService/GetClaim":               true,
		"/volplane.binder.v1.BinderService/ListClaims":             true,
		"/grpc.health.v1.Health/Check":                             true,
		"/volplane.binder.v1.BinderService/ExplainClaim":           true,
		"/volplane.binder.v1.BinderService/MatchClaim":             true,
		"/volplane.provisioner.v1.ProvisionerService/PlanVolume":   true,
		"/volplane.provisioner.v1.ProvisionerService/Provision":    false,
		"/volplane.provisioner.v1.ProvisionerService/DeleteVolume": false,
		"/volplane.reclaimer.v1.ReclaimerService/RetryReclaim":     false,
	} {
		if got := grpcutil.IsRead(m); got != want {
			t.Errorf("IsRead(%s) = %v", m, got)
		}
	}
}

// TestCallLogLevels: at info level a write is logged as "grpc write", a
// read and a write its handler marked Repeated not at all, the caller's mistake as "grpc call rejected" and the
// server's failure as a warning, each with its code.
func TestCallLogLevels(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "a")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var next error
	var repeat bool
	handler := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if repeat {
			grpcutil.Repeated(ctx)
		}
		return next
	}
	addr, logs := startServer(t, grpcutil.ServerOptions{TLS: certs["a"]}, handler, handler)
	cc := dial(t, addr, certs["a"])
	for _, tc := range []struct {
		name   string
		err    error
		repeat bool // the handler marks the call grpcutil.Repeated
		call   func(context.Context, *grpc.ClientConn) error
		want   string
	}{
		{"write", nil, false, func(ctx context.Context, cc *grpc.ClientConn) error { return callDelete(ctx, cc) }, `level=INFO msg="grpc write" method=/test.Things/Delete code=OK`},
		{"repeated write", nil, true, func(ctx context.Context, cc *grpc.ClientConn) error { return callDelete(ctx, cc) }, ""},
		{"read", nil, false, callWatch, ""},
		{"caller's mistake", status.Error(codes.NotFound, "no such thing"), false, func(ctx context.Context, cc *grpc.ClientConn) error { return callDelete(ctx, cc) },
			`level=INFO msg="grpc call rejected" method=/test.Things/Delete code=NotFound`},
		{"repeated, but rejected", status.Error(codes.NotFound, "no such thing"), true, func(ctx context.Context, cc *grpc.ClientConn) error { return callDelete(ctx, cc) },
			`level=INFO msg="grpc call rejected" method=/test.Things/Delete code=NotFound`},
		{"server's failure", status.Error(codes.Unavailable, "etcd down"), false, callWatch, `level=WARN msg="grpc call failed" method=/test.Things/WatchThings code=Unavailable`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			next, repeat = tc.err, tc.repeat
			mu.Unlock()
			logs.Reset()
			if err := tc.call(ctxTimeout(t), cc); status.Code(err) != status.Code(tc.err) {
				t.Fatalf("call: %v, want %v", err, tc.err)
			}
			l := logs.String()
			if tc.want == "" {
				if l != "" {
					t.Fatalf("a read or a repeated write was logged at info:\n%s", l)
				}
				return
			}
			if !strings.Contains(l, tc.want) {
				t.Fatalf("log:\n%s\nwant a line with %s", l, tc.want)
			}
			if tc.err != nil && !strings.Contains(l, status.Convert(tc.err).Message()) {
				t.Fatalf("log:\n%s\nwant the error", l)
			}
		})
	}
}

// TestCallMetrics: every call is counted by code on the process's
// registry, on the server's side and the client's.
func TestCallMetrics(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "a")
	if err != nil {
		t.Fatal(err)
	}
	notFound := func(context.Context) error { return status.Error(codes.NotFound, "no") }
	addr, _ := startServer(t, grpcutil.ServerOptions{TLS: certs["a"]}, notFound, notFound)
	cc := dial(t, addr, certs["a"])
	count := func(name string) float64 {
		mfs, err := metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["grpc_service"] == "test.Things" && labels["grpc_method"] == "Delete" && labels["grpc_code"] == "NotFound" {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	server, client := count("grpc_server_handled_total"), count("grpc_client_handled_total")
	for range 3 {
		if err := callDelete(ctxTimeout(t), cc); status.Code(err) != codes.NotFound {
			t.Fatalf("call: %v", err)
		}
	}
	if d := count("grpc_server_handled_total") - server; d != 3 {
		t.Fatalf("grpc_server_handled_total grew by %v, want 3", d)
	}
	if d := count("grpc_client_handled_total") - client; d != 3 {
		t.Fatalf("grpc_client_handled_total grew by %v, want 3", d)
	}
}

// The expiry metric follows the files at each scrape, with no new
// connection: a process whose connections all outlive a renewal still
// reports the certificate a new connection would get.
func TestCertificateExpiryFollowsTheFilesAtScrape(t *testing.T) {
	ca, err := pki.NewCA(t.TempDir(), "scrape-ca")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.Issue("scraped")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := files.ServerCredentials(); err != nil {
		t.Fatal(err)
	}
	const key = "service CN=scraped,O=volplane"
	if got, want := certificateExpiry(t)[key], notAfter(t, files.CertFile); got != want {
		t.Fatalf("expiry %v, want %v", got, want)
	}
	// The renewed certificate names another subject, so the old series
	// must go and the new one come.
	other, err := ca.Issue("scraped-renewed")
	if err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{other.CertFile: files.CertFile, other.KeyFile: files.KeyFile} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(to+".tmp", to); err != nil {
			t.Fatal(err)
		}
	}
	const renewed = "service CN=scraped-renewed,O=volplane"
	want := notAfter(t, files.CertFile)
	deadline := time.Now().Add(10 * time.Second)
	for e := certificateExpiry(t); e[renewed] != want || e[key] != 0; e = certificateExpiry(t) {
		if time.Now().After(deadline) {
			t.Fatalf("10s after the renewal: %v, want %s at %v and no %s", e, renewed, want, key)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
