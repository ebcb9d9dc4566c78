package grpcutil_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// TestTraceContextCrossesCalls: a caller's span context reaches the
// handler as its remote parent; a caller without one sends none.
func TestTraceContextCrossesCalls(t *testing.T) {
	seen := make(chan trace.SpanContext, 1)
	srv, err := grpcutil.NewServer(discard(), grpcutil.ServerOptions{TLS: grpcutil.TLSFiles{InsecurePlaintext: true}},
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			seen <- trace.SpanContextFromContext(ctx)
			return h(ctx, req)
		}))
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, serve(t, srv), grpcutil.TLSFiles{InsecurePlaintext: true})
	client := healthpb.NewHealthClient(cc)

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	for name, tc := range map[string]struct {
		ctx  context.Context
		want trace.SpanContext
	}{
		"with a span":    {trace.ContextWithSpanContext(ctxTimeout(t), sc), sc.WithRemote(true)},
		"without a span": {ctxTimeout(t), trace.SpanContext{}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := client.Check(tc.ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			if got := <-seen; !got.Equal(tc.want) {
				t.Errorf("handler's span context %v, want %v", got, tc.want)
			}
		})
	}
}
