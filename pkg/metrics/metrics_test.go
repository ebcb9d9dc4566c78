package metrics_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

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
	srv := httptest.NewServer(metrics.Handler(h, metrics.Debug{}))
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
	srv := httptest.NewServer(metrics.Handler(nil, metrics.Debug{}))
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

// pprof is served only when asked for (--enable-pprof): profiles and the
// command line are not for whoever reaches the debug port.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	for _, tc := range []struct {
		debug metrics.Debug
		code  int
	}{
		{metrics.Debug{}, http.StatusNotFound},
		{metrics.Debug{Pprof: true}, http.StatusOK},
	} {
		t.Run(fmt.Sprintf("pprof=%v", tc.debug.Pprof), func(t *testing.T) {
			srv := httptest.NewServer(metrics.Handler(nil, tc.debug))
			defer srv.Close()
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
				resp, err := srv.Client().Get(srv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != tc.code {
					t.Errorf("%s: %d, want %d", path, resp.StatusCode, tc.code)
				}
			}
		})
	}
}

// client-go's REST client reports under kube-controller-manager's names:
// request latency, rate-limiter waits and results, by verb, code and host.
func TestRESTClientMetrics(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: 100, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(api.URL, "http://")
	if _, err := client.CoreV1().Namespaces().Get(t.Context(), "nope", metav1.GetOptions{}); err == nil {
		t.Fatal("GET answered 404 succeeded")
	}
	body := scrape(t)
	for _, want := range []string{
		`rest_client_requests_total{code="404",host="` + host + `",method="GET"} 1`,
		`rest_client_request_duration_seconds_count{host="` + host + `",verb="GET"} 1`,
		`rest_client_rate_limiter_duration_seconds_count{host="` + host + `",verb="GET"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in /metrics", want)
		}
	}
}

// A queue that retries without AddRateLimited (the binder's) still counts
// its retries in workqueue_retries_total.
func TestWorkqueueRetry(t *testing.T) {
	metrics.RegisterWorkqueueMetrics()
	metrics.RegisterWorkqueueMetrics() // twice is fine
	metrics.WorkqueueRetry("test-retry")
	metrics.WorkqueueRetry("test-retry")
	if body := scrape(t); !strings.Contains(body, `workqueue_retries_total{name="test-retry"} 2`) {
		t.Errorf("no workqueue_retries_total{name=\"test-retry\"} 2 in /metrics")
	}
}

// scrape returns what /metrics serves now.
func scrape(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(metrics.Handler(nil, metrics.Debug{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// volplane_build_info says which build runs, as kubernetes_build_info.
func TestBuildInfo(t *testing.T) {
	body := scrape(t)
	if !regexp.MustCompile(`(?m)^volplane_build_info\{commit="[^"]+",go_version="go[^"]+",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("no volplane_build_info{commit,go_version,version} 1 in /metrics")
	}
}

// Descs lists a metric that has no sample yet (a vector nobody has used),
// by name, so docs/metrics.md can be checked against everything
// registered.
func TestDescsListMetricsWithoutSamples(t *testing.T) {
	names := map[string]bool{}
	for _, d := range metrics.Descs() {
		names[metrics.DescName(d)] = true
	}
	for _, want := range []string{"volplane_build_info", "volume_operation_total_seconds", "volume_operation_total_errors",
		"rest_client_request_duration_seconds", "workqueue_depth", "workqueue_retries_total"} {
		if !names[want] {
			t.Errorf("Descs has no %s", want)
		}
	}
	if body := scrape(t); strings.Contains(body, "volume_operation_total_errors") {
		t.Fatal("volume_operation_total_errors has samples: the test no longer proves Descs lists what Gather does not")
	}
}

// kube-controller-manager's volume operation metrics, with its labels and
// "N/A" for an unknown plugin.
func TestVolumeOperations(t *testing.T) {
	metrics.VolumeOperationDone("hostpath.csi.volplane.io", metrics.OperationProvision, 3*time.Second)
	metrics.VolumeOperationDone("", metrics.OperationDelete, time.Second)
	body := scrape(t)
	for _, want := range []string{
		`volume_operation_total_seconds_count{operation_name="provision",plugin_name="hostpath.csi.volplane.io"} 1`,
		`volume_operation_total_seconds_bucket{operation_name="provision",plugin_name="hostpath.csi.volplane.io",le="5"} 1`,
		`volume_operation_total_seconds_count{operation_name="delete",plugin_name="N/A"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %s in /metrics", want)
		}
	}
}
