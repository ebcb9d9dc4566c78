package dynamic

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/test/harness/e2e"
)

// scrape reads /metrics as the services serve it on --debug-address
// (their registry, in the text format). The services of this suite run in
// this process and share the registry, and tests that start more of them
// add gatherers whose series may clash: such errors are skipped here, as a
// process of its own never has them.
func scrape(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(metrics.Gatherer(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
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

// External-provisioner parity, its library's metrics: after a refused
// provisioning (a Block claim, which the dev driver refuses with
// InvalidArgument and which is then not tried again for
// --retry-interval-max), a successful one, a clone, and the deletion of
// both volumes, /metrics has sig-storage-lib-external-provisioner's
// series, with its labels (class and source for provisioning, class for
// deletion) and counts per attempt.
func TestExternalProvisionerMetricsAfterProvisionAndDelete(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	block := corev1.PersistentVolumeBlock
	refused := createClaim(t, ns, "raw", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeMode = &block })
	hasEventFrom(t, refused, "ProvisioningFailed", "access type block is not supported", driverName)
	src := createClaim(t, ns, "source", "1Gi", sc.Name)
	bound(t, ns, "source")
	clone := createClaim(t, ns, "copy", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}
	})
	bound(t, ns, "copy")
	deleteClaim(t, clone)
	deleteClaim(t, src)

	// Deletions exactly (one attempt each); provisioning at least once per
	// series: under load a call may time out and be made again, a second
	// attempt counted as upstream counts it.
	want := []string{
		fmt.Sprintf(`controller_persistentvolume_delete_total{class=%q} 2`, sc.Name),
		fmt.Sprintf(`controller_persistentvolume_delete_duration_seconds_count{class=%q} 2`, sc.Name),
		"# HELP controller_persistentvolumeclaim_provision_total Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
		"# TYPE controller_persistentvolumeclaim_provision_duration_seconds histogram",
	}
	var atLeastOnce []*regexp.Regexp
	for _, series := range []string{
		`controller_persistentvolumeclaim_provision_failed_total{class=%q,source=""}`, // the refused Block claim
		`controller_persistentvolumeclaim_provision_total{class=%q,source=""}`,
		`controller_persistentvolumeclaim_provision_total{class=%q,source="PersistentVolumeClaim"}`,
		`controller_persistentvolumeclaim_provision_duration_seconds_count{class=%q,source=""}`,
		`controller_persistentvolumeclaim_provision_duration_seconds_count{class=%q,source="PersistentVolumeClaim"}`,
		`controller_persistentvolumeclaim_provision_duration_seconds_bucket{class=%q,source="",le="+Inf"}`,
	} {
		atLeastOnce = append(atLeastOnce, regexp.MustCompile("(?m)^"+regexp.QuoteMeta(fmt.Sprintf(series, sc.Name))+" [1-9][0-9]*$"))
	}
	var body string
	e2e.Eventually(t, 60*time.Second, func() string {
		body = scrape(t)
		for _, w := range want {
			if !strings.Contains(body, w+"\n") {
				return "/metrics lacks " + w + "; it has:\n" + grepLines(body, sc.Name) + "\n(" + strings.SplitN(body, "\n", 2)[0] + " ...)"
			}
		}
		for _, re := range atLeastOnce {
			if !re.MatchString(body) {
				return "/metrics lacks " + re.String() + "; it has:\n" + grepLines(body, sc.Name)
			}
		}
		return ""
	})
	if strings.Contains(body, fmt.Sprintf(`controller_persistentvolume_delete_failed_total{class=%q}`, sc.Name)) {
		t.Errorf("a deletion attempt failed:\n%s", grepLines(body, sc.Name))
	}
	t.Logf("the library's series of class %s:\n%s", sc.Name, grepLines(body, sc.Name))
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
