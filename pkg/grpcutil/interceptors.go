package grpcutil

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The metadata keys with which the gateway passes on the end user it
// authenticated (pkg/auth defines the same names for the gateway).
const (
	userKey   = "volplane-user"
	groupsKey = "volplane-groups"
	uidKey    = "volplane-uid"
)

// Caller is who made a call: the volplane service whose client
// certificate the TLS handshake verified, and the end user that service
// (the gateway) says it acts for.
type Caller struct {
	// Service is the common name of the peer's verified certificate
	// ("gateway", "binder", ...); empty over plaintext.
	Service string
	// User, UID and Groups are the end user's, from the call's metadata;
	// empty when the caller passed none (a service acting on its own).
	User, UID string
	Groups    []string
}

// CallerFrom returns the caller of the call whose server context ctx is.
func CallerFrom(ctx context.Context) Caller {
	var c Caller
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			c.Service = ti.State.VerifiedChains[0][0].Subject.CommonName
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(userKey); len(v) > 0 {
			c.User = v[0]
		}
		if v := md.Get(uidKey); len(v) > 0 {
			c.UID = v[0]
		}
		for _, g := range md.Get(groupsKey) {
			for _, g := range strings.Split(g, ",") {
				if g = strings.TrimSpace(g); g != "" {
					c.Groups = append(c.Groups, g)
				}
			}
		}
	}
	return c
}

// attrs are the log attributes of c: the calling service, and the end user
// when there is one.
func (c Caller) attrs() []any {
	var a []any
	if c.Service != "" {
		a = append(a, "caller", c.Service)
	}
	if c.User != "" {
		a = append(a, "user", c.User)
		if c.UID != "" {
			a = append(a, "uid", c.UID)
		}
		if len(c.Groups) > 0 {
			a = append(a, "groups", c.Groups)
		}
	}
	return a
}

// IsRead reports whether the full method name is a read: Get*, List*,
// Watch*, Explain*, Match* or Plan* of a volplane service (the last two are
// dry runs), or a health or reflection call. Every other call may change
// something and is logged at info level.
func IsRead(fullMethod string) bool {
	if strings.HasPrefix(fullMethod, "/grpc.health.v1.") || strings.HasPrefix(fullMethod, "/grpc.reflection.") {
		return true
	}
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	for _, p := range []string{"Get", "List", "Watch", "Explain", "Match", "Plan"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// unaryLogger and streamLogger log every call; writes logs successful
// writes at info level (a volplane service's audit trail), else at debug.
func unaryLogger(log *slog.Logger, writes bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		logCall(ctx, log, writes, info.FullMethod, start, err, req)
		return resp, err
	}
}

func streamLogger(log *slog.Logger, writes bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		logCall(ss.Context(), log, writes, info.FullMethod, start, err, nil)
		return err
	}
}

func logCall(ctx context.Context, log *slog.Logger, writes bool, method string, start time.Time, err error, req any) {
	if method == "/grpc.health.v1.Health/Check" || method == "/grpc.health.v1.Health/Watch" {
		return
	}
	code := status.Code(err)
	attrs := append([]any{"method", method, "code", code.String(), "duration", time.Since(start)}, CallerFrom(ctx).attrs()...)
	if req != nil && log.Enabled(ctx, slog.LevelDebug) {
		attrs = append(attrs, "request", Sanitize(req))
	}
	switch code {
	case codes.OK:
	case codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented,
		codes.PermissionDenied, codes.Unauthenticated:
		// The caller's doing (a closed stream, a bad request): the caller
		// got the message; it is not this service's trouble.
		log.InfoContext(ctx, "grpc call rejected", append(attrs, "error", err)...)
		return
	default:
		log.WarnContext(ctx, "grpc call failed", append(attrs, "error", err)...)
		return
	}
	if writes && !IsRead(method) {
		log.InfoContext(ctx, "grpc write", attrs...)
		return
	}
	log.DebugContext(ctx, "grpc call", attrs...)
}

// errPanic is what the caller of a handler that panicked gets: no detail,
// the log has it.
var errPanic = status.Error(codes.Internal, "internal error")

func unaryRecovery(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				logPanic(ctx, log, info.FullMethod, p)
				resp, err = nil, errPanic
			}
		}()
		return handler(ctx, req)
	}
}

func streamRecovery(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				logPanic(ss.Context(), log, info.FullMethod, p)
				err = errPanic
			}
		}()
		return handler(srv, ss)
	}
}

func logPanic(ctx context.Context, log *slog.Logger, method string, p any) {
	log.ErrorContext(ctx, "grpc handler panicked; the call failed with Internal and the server goes on",
		append([]any{"method", method, "panic", p, "stack", string(debug.Stack())}, CallerFrom(ctx).attrs()...)...)
}
