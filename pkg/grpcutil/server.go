package grpcutil

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/volplane/volplane/pkg/callers"
)

// Message size limits of NewServer and Dial. A request is small (names and
// a few objects); a response or a watch event carries Kubernetes objects,
// each at most etcd's 1.5 MiB, so sends and client receives get room.
const (
	DefaultMaxRecvMsgSize = 16 << 20
	DefaultMaxSendMsgSize = 64 << 20
)

// ConnectionTimeout bounds a new connection's TLS and HTTP/2 handshake, so
// a client that opens connections and sends nothing (slowloris) holds
// nothing for long.
const ConnectionTimeout = 10 * time.Second

// Server is a gRPC server with the health service registered.
type Server struct {
	*grpc.Server
	Health *health.Server
	log    *slog.Logger
}

// ServerOptions configures NewServer.
type ServerOptions struct {
	// TLS is the server's mutual TLS material (required: set the files, or
	// choose InsecurePlaintext explicitly).
	TLS TLSFiles
	// Reflection registers the gRPC reflection service (--grpc-reflection),
	// for grpcurl and the like; off by default, since it lists every method
	// to whoever connects.
	Reflection bool
	// MaxRecvMsgSize is the largest request accepted; default
	// DefaultMaxRecvMsgSize.
	MaxRecvMsgSize int
	// MaxSendMsgSize is the largest response or stream message sent;
	// default DefaultMaxSendMsgSize.
	MaxSendMsgSize int
	// Callers says which caller identities may call each method (see
	// pkg/callers); nil means callers.Default(), the table of volplane's
	// services.
	Callers callers.Table
}

// NewServer returns a volplane service's gRPC server: mutual TLS as
// o.TLS says, each caller authorized by its identity (the Common Name of
// its certificate) against o.Callers (pkg/callers; none over plaintext),
// panics in handlers turned into Internal errors, every call
// logged through log (writes at info level with the caller's identity,
// other successful calls at debug, failures at warn), explicit message
// size limits, a handshake timeout and keepalive enforcement, and the
// grpc.health.v1 service. Services start NOT_SERVING; call SetServing once
// ready. opts are appended (interceptors given in opts run inside these).
func NewServer(log *slog.Logger, o ServerOptions, opts ...grpc.ServerOption) (*Server, error) {
	if err := o.TLS.Validate(); err != nil {
		return nil, err
	}
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	var authz *callers.Table // none over plaintext: no identity to check
	if !o.TLS.InsecurePlaintext {
		var err error
		if creds, err = o.TLS.ServerCredentials(); err != nil {
			return nil, err
		}
		if o.Callers == nil {
			o.Callers = callers.Default()
		}
		authz = &o.Callers
	}
	if o.MaxRecvMsgSize == 0 {
		o.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if o.MaxSendMsgSize == 0 {
		o.MaxSendMsgSize = DefaultMaxSendMsgSize
	}
	return newServer(log, o.Reflection, true, authz, append([]grpc.ServerOption{
		grpc.Creds(creds),
		grpc.MaxRecvMsgSize(o.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(o.MaxSendMsgSize),
	}, opts...)...), nil
}

// NewCSIServer returns a plaintext gRPC server for a CSI driver, which
// serves its sidecars on a unix socket without TLS as every CSI driver
// does (the socket's file permissions are its access control). It has
// NewServer's interceptors (successful calls logged at debug level), limits
// and health service. Never use it for a volplane service.
func NewCSIServer(log *slog.Logger, opts ...grpc.ServerOption) *Server {
	return newServer(log, false, false, nil, append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(DefaultMaxRecvMsgSize),
		grpc.MaxSendMsgSize(DefaultMaxSendMsgSize),
	}, opts...)...)
}

// newServer builds a server; authz, when set, is the table its callers
// are checked against.
func newServer(log *slog.Logger, reflect, logWrites bool, authz *callers.Table, opts ...grpc.ServerOption) *Server {
	logUnary, logStream := serverLogging(log, logWrites)
	recoverUnary, recoverStream := serverRecovery(log)
	// The logger sees what the caller gets: a refusal, the recovery, and a
	// request that did not decode (codec.go) are all inside it.
	decodedUnary, decodedStream := checkDecoded()
	unary := []grpc.UnaryServerInterceptor{serverTrace(), serverMetrics.UnaryServerInterceptor(), logUnary}
	stream := []grpc.StreamServerInterceptor{serverMetrics.StreamServerInterceptor(), logStream}
	if authz != nil {
		unary = append(unary, authz.UnaryServerInterceptor())
		stream = append(stream, authz.StreamServerInterceptor())
	}
	opts = append([]grpc.ServerOption{
		grpc.ForceServerCodecV2(newServerCodec()),
		grpc.ChainUnaryInterceptor(append(unary, recoverUnary, decodedUnary)...),
		grpc.ChainStreamInterceptor(append(stream, recoverStream, decodedStream)...),
		grpc.ConnectionTimeout(ConnectionTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, opts...)
	s := &Server{Server: grpc.NewServer(opts...), Health: health.NewServer(), log: log}
	healthpb.RegisterHealthServer(s.Server, s.Health)
	if reflect {
		reflection.Register(s.Server)
	}
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return s
}

// SetServing marks the server (and the named services) SERVING or not.
func (s *Server) SetServing(serving bool, services ...string) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range append([]string{""}, services...) {
		s.Health.SetServingStatus(name, st)
	}
}

// Serve serves on lis until ctx ends, then sets NOT_SERVING, drains calls in
// flight for up to grace and stops. It returns nil after a clean stop.
func (s *Server) Serve(ctx context.Context, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.Server.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("grpc serve on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() { s.Server.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.Server.Stop()
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("grpc serve on %s: %w", lis.Addr(), err)
	}
	return nil
}

// Listen opens a TCP listener ("host:port") or, with a unix:// prefix, a unix
// socket listener.
func Listen(addr string) (net.Listener, error) {
	network, address := "tcp", addr
	if strings.HasPrefix(addr, "unix://") {
		network, address = "unix", strings.TrimPrefix(addr, "unix://")
	}
	lis, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return lis, nil
}

// Dial connects to a volplane service at target ("host:port", "dns:///..."
// or "unix://..."), with mutual TLS as tls says: the server's certificate
// must be signed by tls.CAFile and name the target's host, and the client
// presents tls.CertFile. Plaintext only with tls.InsecurePlaintext.
func Dial(target string, tls TLSFiles, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := tls.Validate(); err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if !tls.InsecurePlaintext {
		var err error
		if creds, err = tls.ClientCredentials(); err != nil {
			return nil, fmt.Errorf("dial %s: %w", target, err)
		}
	}
	return dial(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
}

// DialCSI connects to a CSI driver at target (usually "unix:///...csi.sock")
// without TLS, as every CSI sidecar does. Never use it for a volplane
// service.
func DialCSI(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
}

func dial(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	traceUnary, traceStream := clientTrace()
	opts = append([]grpc.DialOption{
		grpc.WithChainUnaryInterceptor(traceUnary, clientMetrics.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(traceStream, clientMetrics.StreamClientInterceptor()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(DefaultMaxSendMsgSize)),
		// Peers are other volplane services nearby: after a restart,
		// reconnect within seconds, not gRPC's default two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return cc, nil
}
