package grpcutil

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Trace context crosses volplane's gRPC calls as W3C traceparent metadata,
// so that a claim's timeline spans (pkg/timeline) in the binder, the
// provisioner and the CSI driver are one OpenTelemetry trace. A client
// sends it only when its context carries a span (tracing is on in the
// calling service); a server takes it only when the call carries it. No
// span is made here, and nothing is exported: without tracing the cost is
// a check of the context and of the metadata.

var traceContext propagation.TraceContext

// mdCarrier adapts gRPC metadata to a TextMapCarrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// injectTrace adds ctx's span context, if any, to the outgoing metadata.
func injectTrace(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md := metadata.MD{}
	traceContext.Inject(ctx, mdCarrier(md))
	kv := make([]string, 0, 2*len(md))
	for k, vs := range md {
		for _, v := range vs {
			kv = append(kv, k, v)
		}
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// extractTrace makes the caller's span context, if the call carries one,
// the remote parent of ctx.
func extractTrace(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get("traceparent")) == 0 {
		return ctx
	}
	return traceContext.Extract(ctx, mdCarrier(md))
}

func clientTrace() (grpc.UnaryClientInterceptor, grpc.StreamClientInterceptor) {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(injectTrace(ctx), method, req, reply, cc, opts...)
		}, func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(injectTrace(ctx), desc, cc, method, opts...)
		}
}

func serverTrace() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(extractTrace(ctx), req)
	}
}
