package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	// The services' errors may carry google.rpc.BadRequest details (the
	// fields a claim gets wrong); the JSON of an error needs their type.
	_ "google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/shape"
)

// reqState is what the layers of one request learn about it, for the
// error handler and the request log.
type reqState struct {
	user         string
	route        *route
	bodyTooLarge bool
}

type stateKey struct{}

func stateFrom(ctx context.Context) *reqState {
	if st, ok := ctx.Value(stateKey{}).(*reqState); ok {
		return st
	}
	return &reqState{}
}

// marshaler is the JSON of every response, errors included.
var marshaler = &runtime.JSONPb{
	MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
}

// jsonBodies decodes request bodies as JSON once their shape is checked
// (checkShape): the body is read whole (--max-request-bytes bounds it),
// scanned token by token, and only then decoded.
type jsonBodies struct {
	*runtime.JSONPb
	limits shape.Limits
}

func (j jsonBodies) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return io.EOF
		}
		return j.Unmarshal(b, v)
	})
}

func (j jsonBodies) Unmarshal(data []byte, v any) error {
	if err := checkShape(shape.CheckJSON(data, j.limits)); err != nil {
		return err
	}
	return j.JSONPb.NewDecoder(bytes.NewReader(data)).Decode(v)
}

// yamlBodies decodes request bodies sent as YAML (Content-Type
// application/yaml, as Kubernetes manifests are written): once its shape
// is checked (aliases expanded), the YAML becomes JSON, decoded as JSON
// bodies are. Answers are JSON whatever the request.
type yamlBodies struct{ jsonBodies }

// yamlTypes are the media types read as YAML.
var yamlTypes = []string{"application/yaml", "application/x-yaml", "text/yaml"}

func (y yamlBodies) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return io.EOF
		}
		return y.Unmarshal(b, v)
	})
}

func (y yamlBodies) Unmarshal(data []byte, v any) error {
	if err := checkShape(shape.CheckYAML(data, y.limits)); err != nil {
		return err
	}
	j, err := utilyaml.ToJSON(data)
	if err != nil {
		return fmt.Errorf("the body is not YAML: %w", err)
	}
	return y.jsonBodies.JSONPb.NewDecoder(bytes.NewReader(j)).Decode(v)
}

// shapeFlags are the flags of the shape limits, for the caller to know
// which to raise.
var shapeFlags = map[shape.Limit]string{
	shape.Depth:       "--max-request-depth",
	shape.Elements:    "--max-request-elements",
	shape.StringBytes: "--max-request-string-bytes",
	shape.KeyBytes:    "--max-request-key-bytes",
}

// checkShape words a shape check's error for the caller (grpc-gateway
// answers a decoding error with 400): the limit exceeded and its flag.
func checkShape(err error) error {
	var e *shape.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return fmt.Errorf("the request body is refused: %v; the gateway's limit is %s", e, shapeFlags[e.Limit])
	default:
		return fmt.Errorf("the body is %v", err)
	}
}

// muxOptions configures grpc-gateway: the JSON marshaler, the caller's
// identity as metadata (and no HTTP header as metadata at all, so no caller
// can forge it), authorization of each matched route, and errors mapped to
// the HTTP statuses of the README.
func muxOptions(g *guard, o *HTTPOptions) []runtime.ServeMuxOption {
	bodies := jsonBodies{JSONPb: marshaler, limits: o.shapeLimits()}
	opts := []runtime.ServeMuxOption{
		runtime.WithMarshalerOption(runtime.MIMEWildcard, bodies),
		runtime.WithIncomingHeaderMatcher(func(string) (string, bool) { return "", false }),
		runtime.WithMetadata(func(ctx context.Context, r *http.Request) metadata.MD {
			if u, ok := auth.UserFrom(r.Context()); ok {
				return u.Metadata()
			}
			return nil
		}),
		runtime.WithDisableHTTPMethodOverride(),
		runtime.WithDisablePathLengthFallback(),
		runtime.WithMiddlewares(g.middleware),
		runtime.WithErrorHandler(func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
			st := stateFrom(r.Context())
			if st.bodyTooLarge {
				err = tooLarge(o.MaxRequestBytes)
			}
			err = g.nameBackend(st.route, err)
			runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, withHTTPStatus(err))
		}),
		runtime.WithRoutingErrorHandler(func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, code int) {
			var err error
			switch code {
			case http.StatusMethodNotAllowed:
				allow := allowedMethods(r.URL.Path)
				w.Header().Set("Allow", strings.Join(allow, ", "))
				err = httpError(code, codes.Unimplemented, fmt.Sprintf("method %s is not allowed on %s; use %s", r.Method, truncate(r.URL.Path, 200), strings.Join(allow, " or ")))
			case http.StatusNotFound:
				err = httpError(code, codes.NotFound, fmt.Sprintf("no route %s %s (the routes are in /openapi.json)", r.Method, truncate(r.URL.Path, 200)))
			default:
				err = httpError(http.StatusBadRequest, codes.InvalidArgument, "malformed request path")
			}
			runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
		}),
	}
	for _, t := range yamlTypes {
		opts = append(opts, runtime.WithMarshalerOption(t, yamlBodies{bodies}))
	}
	return opts
}

// middleware runs inside grpc-gateway once it matched a route: it looks
// the route up in the authorization table, validates the path's names and
// authorizes the caller.
func (g *guard) middleware(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		ctx := r.Context()
		pat, _ := runtime.HTTPPattern(ctx)
		rt, ok := lookupRoute(r.Method, pat.String())
		if !ok {
			// A route served without an entry in the table: refuse rather
			// than serve it unauthorized (a test keeps this from shipping).
			g.log.Error("route has no authorization rule; refused", "method", r.Method, "pattern", pat.String())
			writeError(w, httpError(http.StatusForbidden, codes.PermissionDenied, "this route has no authorization rule; the gateway refuses it"))
			return
		}
		st := stateFrom(ctx)
		st.route = rt
		if err := validateParams(params); err != nil {
			writeError(w, httpError(http.StatusBadRequest, codes.InvalidArgument, err.Error()))
			return
		}
		u, _ := auth.UserFrom(ctx)
		if rt.Expensive {
			// Before authorization, which may ask the API server too.
			release, no := g.limits.acquire(u.Name)
			if no != nil {
				w.Header().Set("Retry-After", retryAfter(no.retryAfter))
				writeError(w, httpError(http.StatusTooManyRequests, codes.ResourceExhausted,
					"too many expensive requests: "+no.message+"; retry after "+retryAfter(no.retryAfter)+"s"))
				return
			}
			defer release()
		}
		if code, msg := g.authorize(ctx, u, rt, params); code != 0 {
			writeError(w, httpError(code, grpcCode(code), msg))
			return
		}
		if rt.Stream {
			// A watch streams for as long as the caller wants.
			rc := http.NewResponseController(w)
			_ = rc.SetWriteDeadline(time.Time{})
			_ = rc.SetReadDeadline(time.Time{})
		}
		next(w, r, params)
	}
}

// backendOf is the backend serving rt, nil when none is configured.
func (g *guard) backendOf(rt *route) *backend {
	if rt == nil {
		return nil
	}
	i := strings.LastIndexByte(rt.RPC, '.')
	if i < 0 {
		return nil
	}
	return g.backends[rt.RPC[:i]]
}

// nameBackend says which backend is unavailable when a call to it failed
// with Unavailable ("binder unavailable: connection refused"), so that a
// caller of one route knows which service is down and that the others
// still answer.
func (g *guard) nameBackend(rt *route, err error) error {
	s, ok := status.FromError(err)
	b := g.backendOf(rt)
	if !ok || s.Code() != codes.Unavailable || b == nil {
		return err
	}
	p := s.Proto()
	p.Message = b.name + " unavailable: " + p.Message
	return status.ErrorProto(p)
}

// withHTTPStatus maps gRPC codes to HTTP as grpc-gateway does, except
// FailedPrecondition, which is 409: the state forbids the step (400 would
// tell the caller to change the request).
func withHTTPStatus(err error) error {
	var he *runtime.HTTPStatusError
	if errors.As(err, &he) {
		return err
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.FailedPrecondition {
		return &runtime.HTTPStatusError{HTTPStatus: http.StatusConflict, Err: err}
	}
	return err
}

func tooLarge(max int64) error {
	return httpError(http.StatusRequestEntityTooLarge, codes.InvalidArgument,
		"the request body is larger than "+strconv.FormatInt(max, 10)+" bytes (--max-request-bytes)")
}

// httpError is an error answered with an HTTP status and a gRPC code.
func httpError(httpCode int, code codes.Code, msg string) error {
	return &runtime.HTTPStatusError{HTTPStatus: httpCode, Err: status.Error(code, msg)}
}

func grpcCode(httpCode int) codes.Code {
	switch httpCode {
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusRequestEntityTooLarge, http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusMethodNotAllowed:
		return codes.Unimplemented
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	}
	return codes.Unknown
}

// writeError answers err (an httpError) outside grpc-gateway in the same
// JSON: {"code": <gRPC code>, "message": ..., "details": []}.
func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	var he *runtime.HTTPStatusError
	if errors.As(err, &he) {
		code, err = he.HTTPStatus, he.Err
	}
	b, merr := marshaler.Marshal(status.Convert(err).Proto())
	if merr != nil {
		b = []byte(`{"code":13,"message":"failed to marshal the error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="volplane"`)
	}
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// public are the paths served without credentials.
var public = map[string]bool{"/healthz": true, "/readyz": true, "/openapi.json": true}

// front is the gateway's HTTP handler: request checks that need no route,
// authentication, then grpc-gateway (which authorizes in middleware).
func front(g *guard, o *HTTPOptions, open http.Handler, api http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		st := &reqState{}
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		defer func() {
			d := time.Since(start)
			observe(r, st, rec.code, d)
			logRequest(log, r, st, rec.code, d)
		}()
		w = rec

		if public[r.URL.Path] {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				writeError(w, httpError(http.StatusMethodNotAllowed, codes.Unimplemented, "method "+r.Method+" is not allowed on "+r.URL.Path+"; use GET"))
				return
			}
			open.ServeHTTP(w, r)
			return
		}
		if err := checkTarget(r); err != nil {
			writeError(w, httpError(http.StatusBadRequest, codes.InvalidArgument, err.Error()))
			return
		}
		if r.ContentLength > o.MaxRequestBytes {
			writeError(w, tooLarge(o.MaxRequestBytes))
			return
		}
		u, code, msg := g.authenticate(r.Context(), r)
		if code != 0 {
			writeError(w, httpError(code, grpcCode(code), msg))
			return
		}
		st.user = u.Name
		// Nothing of the caller's headers goes further: the credential
		// stays here, and the identity travels only as the gateway sets it.
		r.Header.Del("Authorization")
		r.Header.Del("Grpc-Timeout")
		for k := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "grpc-") {
				r.Header.Del(k)
			}
		}
		r = r.WithContext(auth.WithUser(r.Context(), u))
		limitBody(w, r, o.MaxRequestBytes, st)
		api.ServeHTTP(w, r)
	})
}

// logRequest logs a request with its caller: reads at debug level, writes
// at info, server errors at warn. Never the query or headers (no secret
// ends up in the log).
func logRequest(log *slog.Logger, r *http.Request, st *reqState, code int, d time.Duration) {
	level := slog.LevelDebug
	if st.route != nil && st.route.write() {
		level = slog.LevelInfo
	}
	if code >= 500 {
		level = slog.LevelWarn
	}
	attrs := []any{"method", r.Method, "path", truncate(r.URL.Path, 200), "status", code, "duration", d}
	if st.user != "" {
		attrs = append(attrs, "user", st.user)
	}
	log.Log(r.Context(), level, "http request", attrs...)
}

// Unwrap lets http.ResponseController reach the connection (to lift the
// deadlines of a watch).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
