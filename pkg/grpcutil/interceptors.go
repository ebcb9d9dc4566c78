package grpcutil

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/callers"
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
	// Service is the common name of the peer's verified certificate, the
	// caller's identity ("volplane-gateway", "volplane-binder", ...: see
	// pkg/callers); empty over plaintext.
	Service string
	// User, UID and Groups are the end user's, from the call's metadata;
	// empty when the caller passed none (a service acting on its own).
	User, UID string
	Groups    []string
}

// CallerFrom returns the caller of the call whose server context ctx is.
func CallerFrom(ctx context.Context) Caller {
	c := Caller{Service: callers.Identity(ctx)}
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

// Keys of the fields serverLogging adds to go-grpc-middleware's.
const (
	callerField   = "volplane.caller"
	requestField  = "volplane.request"
	durationField = "volplane.duration"
)

// serverLogging logs every call through go-grpc-middleware's logging
// interceptors, once when it finishes, in volplane's words: writes logs
// successful writes at info level (a volplane service's audit trail),
// everything else that succeeds at debug, the caller's mistakes at info
// and the server's failures at warn, each with the method, code, duration
// and caller, and at debug level the request with its secrets redacted.
func serverLogging(log *slog.Logger, writes bool) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	opts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(codeLevel),
		logging.WithDurationField(func(d time.Duration) logging.Fields { return logging.Fields{durationField, d} }),
		logging.WithFieldsFromContextAndCallMeta(func(ctx context.Context, c interceptors.CallMeta) logging.Fields {
			f := logging.Fields{callerField, CallerFrom(ctx)}
			if c.ReqOrNil != nil {
				f = append(f, requestField, c.ReqOrNil)
			}
			return f
		}),
	}
	l := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, _ string, fields ...any) {
		logCall(ctx, log, writes, lvl, fields)
	})
	unary := logging.UnaryServerInterceptor(l, opts...)
	noted := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return unary(context.WithValue(ctx, callNoteKey{}, new(callNote)), req, info, handler)
	}
	return noted, logging.StreamServerInterceptor(l, opts...)
}

// callNote is what a handler tells the log line that ends its call.
type callNote struct{ repeat atomic.Bool }

type callNoteKey struct{}

// Repeated marks the unary call whose server context ctx is as a repeat
// of one already served: the handler answered from memory and started
// nothing (e.g. a Reclaim of a release the reclaimer already holds). A
// successful repeated write is logged at debug level, not info, so the
// audit trail has one line per write that did something.
func Repeated(ctx context.Context) {
	if n, ok := ctx.Value(callNoteKey{}).(*callNote); ok {
		n.repeat.Store(true)
	}
}

// repeated reports whether the call of ctx was marked Repeated.
func repeated(ctx context.Context) bool {
	n, ok := ctx.Value(callNoteKey{}).(*callNote)
	return ok && n.repeat.Load()
}

// codeLevel: the caller's doing (a closed stream, a bad request) is info,
// as is success; anything else is the server's trouble.
func codeLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK, codes.Canceled, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented,
		codes.PermissionDenied, codes.Unauthenticated:
		return logging.LevelInfo
	}
	return logging.LevelWarn
}

func logCall(ctx context.Context, log *slog.Logger, writes bool, lvl logging.Level, fields []any) {
	var (
		service, method, code, errText string
		took                           time.Duration
		caller                         Caller
		req                            any
	)
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		switch v := fields[i+1]; k {
		case logging.ServiceFieldKey:
			service, _ = v.(string)
		case logging.MethodFieldKey:
			method, _ = v.(string)
		case "grpc.code":
			code, _ = v.(string)
		case "grpc.error":
			errText, _ = v.(string)
		case durationField:
			took, _ = v.(time.Duration)
		case callerField:
			caller, _ = v.(Caller)
		case requestField:
			req = v
		}
	}
	full := "/" + service + "/" + method
	if full == "/grpc.health.v1.Health/Check" || full == "/grpc.health.v1.Health/Watch" {
		return
	}
	attrs := append([]any{"method", full, "code", code, "duration", took}, caller.attrs()...)
	if req != nil && log.Enabled(ctx, slog.LevelDebug) {
		attrs = append(attrs, "request", Sanitize(req))
	}
	switch {
	case lvl == logging.LevelWarn:
		log.WarnContext(ctx, "grpc call failed", append(attrs, "error", errText)...)
	case errText != "":
		// The caller got the message; it is not this service's trouble.
		log.InfoContext(ctx, "grpc call rejected", append(attrs, "error", errText)...)
	case writes && !IsRead(full) && repeated(ctx):
		log.DebugContext(ctx, "grpc write repeated, answered from memory", attrs...)
	case writes && !IsRead(full):
		log.InfoContext(ctx, "grpc write", attrs...)
	default:
		log.DebugContext(ctx, "grpc call", attrs...)
	}
}

// errPanic is what the caller of a handler that panicked gets: no detail,
// the log has it.
var errPanic = status.Error(codes.Internal, "internal error")

// serverRecovery turns a handler's panic into Internal (go-grpc-middleware's
// recovery interceptors), logged once with its stack.
func serverRecovery(log *slog.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	opt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		log.ErrorContext(ctx, "grpc handler panicked; the call failed with Internal and the server goes on",
			append([]any{"method", method, "panic", p, "stack", string(debug.Stack())}, CallerFrom(ctx).attrs()...)...)
		return errPanic
	})
	return recovery.UnaryServerInterceptor(opt), recovery.StreamServerInterceptor(opt)
}
