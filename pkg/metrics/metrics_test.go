package metrics_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/volplane/volplane/pkg/health"
	"github.com/volplane/volplane/pkg/metrics"
)

// The debug port serves the service's readiness and liveness next to its
// metrics: /readyz with the reason of each failing check, /livez (and
// /healthz, its old name) passing while the process only waits.
func TestHandlerServesHealth(t *testing.T) {
	h := health.New()
	h.AddReadiness("etcd-session", func() error { return errors.New("not established") })
	h.AddReadiness("api-server", func() error { return nil })
	h.Heartbeat("main-loop", 0)
	h.Evaluate()
	srv := httptest.NewServer(metrics.Handler(h))
	defer srv.Close()
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/readyz", http.StatusServiceUnavailable, "[-]etcd-session failed: not established\n[+]api-server ok\nreadyz check failed\n"},
		{"/livez", http.StatusOK, "[+]main-loop ok\nlivez check passed\n"},
		{"/healthz", http.StatusOK, "[+]main-loop ok\nlivez check passed\n"},
		{"/metrics", http.StatusOK, "go_goroutines"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := srv.Client().Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.want) {
				t.Errorf("%d, want %d with %q:\n%s", resp.StatusCode, tc.code, tc.want, b)
			}
		})
	}
}

// Without health checks there is no /readyz to be fooled by; /livez says
// the process answers.
func TestHandlerWithoutChecks(t *testing.T) {
	srv := httptest.NewServer(metrics.Handler(nil))
	defer srv.Close()
	for path, code := range map[string]int{"/readyz": http.StatusNotFound, "/livez": http.StatusOK, "/healthz": http.StatusOK} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != code {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, code)
		}
	}
}
