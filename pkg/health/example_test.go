package health_test

import (
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/volplane/volplane/pkg/health"
)

func Example() {
	h := health.New()
	h.AddReadiness("etcd-session", func() error { return errors.New("not established (etcd at https://volplane-etcd:2379)") })
	h.AddReadiness("api-server", func() error { return nil })
	// The service's readiness loop (Loop) evaluates and sets its gRPC
	// health from the verdict; /readyz serves the same verdict.
	ready, _ := h.Evaluate()
	fmt.Println("ready:", ready)

	rec := httptest.NewRecorder()
	h.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	fmt.Print(rec.Code, "\n", rec.Body.String())

	// Waiting for etcd is not a reason to restart: /livez passes.
	rec = httptest.NewRecorder()
	h.LiveHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/livez", nil))
	fmt.Print(rec.Code, "\n", rec.Body.String())
	// Output:
	// ready: false
	// 503
	// [-]etcd-session failed: not established (etcd at https://volplane-etcd:2379)
	// [+]api-server ok
	// readyz check failed
	// 200
	// livez check passed
}
