package replicas

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/test/harness/e2e"
)

// scrapeWants are, by workload, the metrics whose samples must be there
// and non-zero once a bind, a provisioning and a Delete reclaim went
// through the rendered containers: a series is named by its metric name
// and, optionally, a substring of its labels.
var scrapeWants = map[string][]string{
	"volplane-watcher": {
		"volplane_build_info", `volplane_watcher_events_total{kind="persistent_volume_claim"`, "volplane_watcher_objects",
		"grpc_server_handled_total", "rest_client_requests_total", "rest_client_request_duration_seconds_count",
	},
	"volplane-binder": {
		"volplane_build_info", "pv_collector_bound_pvc_count", "pv_collector_total_pv_count",
		`volplane_binder_claim_bind_duration_seconds_count{storage_class="as-rendered-dynamic",volume="provisioned"}`,
		`volplane_binder_claim_bind_duration_seconds_count{storage_class="as-rendered-static",volume="existing"}`,
		`volume_operation_total_seconds_count{operation_name="provision",plugin_name="hostpath.csi.volplane.io"}`,
		`workqueue_adds_total{name="claims"}`, `volplane_etcd_session{service="binder"}`, "volplane_etcd_request_duration_seconds_count",
		`grpc_client_handled_total{grpc_code="OK",grpc_method="Provision"`, "grpc_server_handled_total", "rest_client_requests_total",
	},
	"volplane-provisioner": {
		"volplane_build_info", `csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.volplane.io",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"}`,
		`volplane_provisioner_claim_provision_duration_seconds_count{provisioner="hostpath.csi.volplane.io"}`,
		`volplane_provisioner_attempts_total{operation="provision",outcome="OUTCOME_FINISHED"}`,
		`volplane_etcd_session{service="provisioner"}`, "volplane_etcd_request_duration_seconds_count", "grpc_server_handled_total", "rest_client_requests_total",
	},
	"volplane-reclaimer": {
		"volplane_build_info", `volplane_reclaimer_reclaims_total{policy="Delete",result="succeeded"}`,
		`volplane_reclaimer_reclaim_duration_seconds_count{policy="Delete",result="succeeded"}`,
		`volume_operation_total_seconds_count{operation_name="delete",plugin_name="hostpath.csi.volplane.io"}`,
		`workqueue_adds_total{name="reclaims"}`, `volplane_etcd_session{service="reclaimer"}`, "volplane_etcd_request_duration_seconds_count",
		`grpc_client_handled_total{grpc_code="OK",grpc_method="DeleteVolume"`, "grpc_server_handled_total",
	},
	"volplane-gateway": {
		"volplane_build_info", `volplane_gateway_http_requests_total{code="200",method="GET",route="/v1/namespaces/{namespace}/claims/{name}"}`,
		`volplane_gateway_http_request_duration_seconds_count{method="GET",route="/v1/namespaces/{namespace}/claims/{name}"}`,
		`grpc_client_handled_total{grpc_code="OK",grpc_method="GetClaim"`, "rest_client_requests_total",
	},
}

// scrapeEach checks every workload's /metrics on its debug port (the port
// Prometheus scrapes, as the manifests render it) for scrapeWants. With
// $VOLPLANE_METRICS_SCRAPE_DIR set, each scrape is saved there.
func scrapeEach(t *testing.T, debug map[string]string) {
	t.Helper()
	for w, wants := range scrapeWants {
		var body string
		e2e.Eventually(t, time.Minute, func() string {
			resp, err := http.Get("http://" + debug[w] + "/metrics")
			if err != nil {
				return w + ": " + err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			for _, want := range wants {
				if !nonZeroSample(body, want) {
					return fmt.Sprintf("%s /metrics has no non-zero sample of %s", w, want)
				}
			}
			return ""
		})
		if dir := os.Getenv("VOLPLANE_METRICS_SCRAPE_DIR"); dir != "" {
			_ = os.WriteFile(filepath.Join(dir, w+".txt"), []byte(body), 0o644)
		}
		// pprof is off without --enable-pprof.
		if resp, err := http.Get("http://" + debug[w] + "/debug/pprof/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s serves /debug/pprof/ (%d) without --enable-pprof", w, resp.StatusCode)
			}
		}
	}
}

// nonZeroSample reports whether the exposition has a sample line that
// starts with series (a name, or a name and the start of its labels) and
// whose value is not zero.
func nonZeroSample(body, series string) bool {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, series) {
			continue
		}
		rest := line[len(series):]
		if !strings.Contains(series, "{") && !strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ") {
			continue // a longer name
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v != 0 {
			return true
		}
	}
	return false
}
