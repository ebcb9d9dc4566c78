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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// Server is a gRPC server with the health service registered.
type Server struct {
	*grpc.Server
	Health *health.Server
	log    *slog.Logger
}

// NewServer returns a server that logs every call through log (at debug
// level when it succeeds, warn when it fails) and serves grpc.health.v1.
// Services start NOT_SERVING; call SetServing once ready.
func NewServer(log *slog.Logger, opts ...grpc.ServerOption) *Server {
	opts = append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unaryLogger(log)),
		grpc.ChainStreamInterceptor(streamLogger(log)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, opts...)
	s := &Server{Server: grpc.NewServer(opts...), Health: health.NewServer(), log: log}
	healthpb.RegisterHealthServer(s.Server, s.Health)
	reflection.Register(s.Server)
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
// or "unix://..."), without TLS (services talk on a trusted network or
// through a mesh).
func Dial(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
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

func unaryLogger(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		logCall(ctx, log, info.FullMethod, start, err, req)
		return resp, err
	}
}

func streamLogger(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		logCall(ss.Context(), log, info.FullMethod, start, err, nil)
		return err
	}
}

func logCall(ctx context.Context, log *slog.Logger, method string, start time.Time, err error, req any) {
	if method == "/grpc.health.v1.Health/Check" || method == "/grpc.health.v1.Health/Watch" {
		return
	}
	code := status.Code(err)
	attrs := []any{"method", method, "code", code.String(), "duration", time.Since(start)}
	if req != nil && log.Enabled(ctx, slog.LevelDebug) {
		attrs = append(attrs, "request", Sanitize(req))
	}
	switch code {
	case codes.OK:
	case codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented:
		// The caller's doing (a closed stream, a bad request): the caller
		// got the message; it is not this service's trouble.
		log.InfoContext(ctx, "grpc call rejected", append(attrs, "error", err)...)
		return
	default:
		log.WarnContext(ctx, "grpc call failed", append(attrs, "error", err)...)
		return
	}
	log.DebugContext(ctx, "grpc call", attrs...)
}
