package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// BenchmarkGetClaim is the gateway's own cost per read, with the reviews
// cached (as in steady state): the same GET through grpc-gateway's bare mux
// and through the gateway, to a fake backend, in process.
func BenchmarkGetClaim(b *testing.B) {
	g := startGateway(b, func(o *Options) { o.Auth.TokenCacheTTL, o.Auth.AllowedCacheTTL, o.Auth.DeniedCacheTTL = 0, 0, 0 })
	cc, err := grpcutil.Dial(g.backend.addr, grpcutil.TLSFiles{InsecurePlaintext: true})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	bare := runtime.NewServeMux()
	if err := binderv1.RegisterBinderServiceHandler(context.Background(), bare, cc); err != nil {
		b.Fatal(err)
	}
	for _, m := range []struct {
		name string
		h    http.Handler
	}{{"no-auth", bare}, {"auth-cached", g.handler}} {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("GET", "/v1/namespaces/team/claims/c", nil)
				req.Header.Set("Authorization", "Bearer viewer-token")
				rec := httptest.NewRecorder()
				m.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusNotFound {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
			g.backend.take()
		})
	}
}
