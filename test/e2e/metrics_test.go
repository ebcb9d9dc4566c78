package e2e

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/metrics"
)

// The services report under the names kube-controller-manager operators
// know (pv_collector_*, workqueue_*), plus volplane's own.
func TestMetricsUseKubernetesNames(t *testing.T) {
	n := ns(t)
	createPV(t, n+"-metrics", "1Gi", "metrics")
	createPVC(t, n, "claim", "1Gi", "metrics")
	pvcPhase(t, n, "claim", corev1.ClaimBound)

	srv := httptest.NewServer(metrics.Handler(nil, metrics.Debug{}))
	defer srv.Close()
	eventually(t, 30*time.Second, func() string {
		resp, err := srv.Client().Get(srv.URL + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body := string(b)
		for _, want := range []string{
			`pv_collector_bound_pv_count{storage_class="metrics"} 1`,
			`pv_collector_bound_pvc_count{namespace="` + n + `",storage_class="metrics",volume_attributes_class=""} 1`,
			`workqueue_adds_total{name="claims"}`,
			`workqueue_depth{name="volumes"}`,
			`volplane_binder_binds_total`,
			`volplane_watcher_events_total{kind="persistent_volume_claim",type="added"}`,
			`volplane_watcher_subscribers`,
		} {
			if !strings.Contains(body, want) {
				return "no " + want + " in /metrics"
			}
		}
		return ""
	})
}
