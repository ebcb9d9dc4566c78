package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testDefects checks, in the cluster, the defects issue 24 found in
// deploy/: each subtest is one.
func testDefects(t *testing.T) {
	requireVolplaneReady(t)

	t.Run("etcd needs no claim", func(t *testing.T) {
		sts, err := c.Client.AppsV1().StatefulSets(volplaneNS).Get(t.Context(), "volplane-etcd", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(sts.Spec.VolumeClaimTemplates); n != 0 {
			t.Errorf("etcd has %d volumeClaimTemplates", n)
		}
		claims, err := c.Client.CoreV1().PersistentVolumeClaims(volplaneNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(claims.Items) != 0 {
			t.Errorf("volplane-system has %d claims", len(claims.Items))
		}
		// Compaction and the quota are on, and visible to Prometheus.
		for _, p := range podsOf(t, "volplane-etcd") {
			_, body, err := httpGet(t.Context(), "http://"+p.IP+":2381/metrics")
			if err != nil {
				t.Fatal(err)
			}
			quota, _ := metricValue(body, "etcd_server_quota_backend_bytes")
			leader, _ := metricValue(body, "etcd_server_has_leader")
			if quota != 1<<30 || leader != 1 {
				t.Errorf("etcd %s: quota %v bytes, has leader %v", p.Name, quota, leader)
			}
		}
		t.Logf("etcd: %d members on emptyDir, no claim in %s (the install above started it with kube-controller-manager's binder off and volplane's not yet running); quota 1 GiB and leader reported on :2381/metrics",
			*sts.Spec.Replicas, volplaneNS)
	})

	t.Run("readiness is real, liveness spares a waiting pod", func(t *testing.T) {
		apps := []string{"volplane-binder", "volplane-provisioner", "volplane-reclaimer"}
		restarts := map[string]int32{}
		for _, app := range apps {
			for _, p := range podsOf(t, app) {
				restarts[p.Name] = p.Restarts
			}
		}
		// Scaled to 0, etcd loses its members' data (emptyDir): the
		// journal too. So first let every operation in flight end (the
		// previous tests' volumes being deleted), as an operator would.
		quiesce(t)
		c.Kubectl(t, "scale", "statefulset", "-n", volplaneNS, "volplane-etcd", "--replicas=0")
		scaledBack := false
		defer func() {
			if !scaledBack {
				c.Run(t.Context(), "", "scale", "statefulset", "-n", volplaneNS, "volplane-etcd", "--replicas=3")
			}
		}()
		start := time.Now()
		waitFor(t, 3*time.Minute, func() string {
			for _, app := range apps {
				for _, p := range podsOf(t, app) {
					if p.Ready {
						return p.Name + " still Ready without etcd"
					}
				}
			}
			return ""
		})
		t.Logf("without etcd, every binder, provisioner and reclaimer NotReady after %v", time.Since(start).Round(time.Second))
		for _, app := range apps {
			p := podsOf(t, app)[0]
			code, body, err := httpGet(t.Context(), "http://"+p.IP+":9090/readyz")
			if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd") {
				t.Errorf("%s /readyz: %d %q %v; want 503 naming etcd", p.Name, code, body, err)
			}
			t.Logf("%s /readyz: %d\n%s", p.Name, code, body)
		}
		// Longer than liveness' periodSeconds × failureThreshold (30s):
		// nobody is restarted for waiting.
		holds(t, 45*time.Second, func() string {
			for _, app := range apps {
				for _, p := range podsOf(t, app) {
					if p.Restarts != restarts[p.Name] {
						return fmt.Sprintf("%s restarted (%d restarts, %d before) while waiting for etcd", p.Name, p.Restarts, restarts[p.Name])
					}
				}
			}
			return ""
		})
		c.Kubectl(t, "scale", "statefulset", "-n", volplaneNS, "volplane-etcd", "--replicas=3")
		scaledBack = true
		start = time.Now()
		requireVolplaneReady(t)
		t.Logf("etcd scaled back to 3 (a new cluster on empty members): everything Ready again after %v", time.Since(start).Round(time.Second))
		for _, app := range apps {
			for _, p := range podsOf(t, app) {
				if p.Restarts != restarts[p.Name] {
					t.Errorf("%s restarted (%d, %d before)", p.Name, p.Restarts, restarts[p.Name])
				}
			}
		}
	})

	t.Run("gateway serves with a backend down and names it", func(t *testing.T) {
		g := gateway(t)
		g.waitPlugin(t, "drivers")
		c.Kubectl(t, "scale", "statefulset", "-n", volplaneNS, "volplane-reclaimer", "--replicas=0")
		defer c.Run(t.Context(), "", "scale", "statefulset", "-n", volplaneNS, "volplane-reclaimer", "--replicas=2")
		waitFor(t, 2*time.Minute, func() string {
			if ps := podsOf(t, "volplane-reclaimer"); len(ps) > 0 {
				return fmt.Sprintf("%d reclaimer pods left", len(ps))
			}
			code, body, err := g.Readyz(t.Context())
			if err != nil || code != http.StatusOK || !strings.Contains(body, `"unavailable":["reclaimer"]`) {
				return fmt.Sprintf("gateway /readyz: %d %s %v", code, body, err)
			}
			return ""
		})
		_, body, _ := g.Readyz(t.Context())
		t.Logf("reclaimers down: gateway /readyz 200: %s", body)
		holds(t, 12*time.Second, func() string {
			for _, p := range podsOf(t, "volplane-gateway") {
				if !p.Ready {
					return "gateway pod " + p.Name + " NotReady with one backend down"
				}
			}
			return ""
		})
		out, err := g.Plugin(t.Context(), "reclaims")
		if err == nil || !strings.Contains(out, "reclaimer") {
			t.Errorf("kubectl volplane reclaims with the reclaimers down: %v: %s; want an error naming the reclaimer", err, out)
		}
		t.Logf("kubectl volplane reclaims: %s", strings.TrimSpace(out))
		if out, err := g.Plugin(t.Context(), "claims", "-A"); err != nil {
			t.Errorf("kubectl volplane claims with the reclaimers down: %v", err)
		} else {
			t.Logf("kubectl volplane claims -A still works:\n%s", out)
		}
		c.Kubectl(t, "scale", "statefulset", "-n", volplaneNS, "volplane-reclaimer", "--replicas=2")
		requireVolplaneReady(t)
	})

	t.Run("reclaimer manages pods in its own namespace only", func(t *testing.T) {
		const sa = "system:serviceaccount:volplane-system:volplane-reclaimer"
		for _, tc := range []struct {
			verb, ns string
			want     string
		}{
			{"create", "volplane-recycler", "yes"},
			{"delete", "volplane-recycler", "yes"},
			{"create", "default", "no"},
			{"delete", "default", "no"},
			{"create", volplaneNS, "no"},
			{"delete", "kube-system", "no"},
		} {
			out, _ := c.Run(t.Context(), "", "auth", "can-i", tc.verb, "pods", "-n", tc.ns, "--as", sa)
			if got := strings.TrimSpace(out); got != tc.want {
				t.Errorf("can-i %s pods -n %s as the reclaimer: %q, want %q", tc.verb, tc.ns, got, tc.want)
			}
			t.Logf("kubectl auth can-i %s pods -n %s --as %s: %s", tc.verb, tc.ns, sa, strings.TrimSpace(out))
		}
		out, _ := c.Run(t.Context(), "", "auth", "can-i", "create", "pods", "--all-namespaces", "--as", sa)
		if strings.TrimSpace(out) != "no" {
			t.Errorf("can-i create pods --all-namespaces as the reclaimer: %q", out)
		}
	})

	t.Run("FlowSchema volplane-controllers matches the controllers", func(t *testing.T) {
		uid := c.Kubectl(t, "get", "flowschema", "volplane-controllers", "-o", "jsonpath={.metadata.uid}")
		// A request with the binder's own identity: the API server says
		// which FlowSchema it matched.
		token := strings.TrimSpace(c.Kubectl(t, "create", "token", "volplane-binder", "-n", volplaneNS, "--duration=10m"))
		ca, err := os.ReadFile(filepath.Join(clusterDir(), "pki/ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://127.0.0.1:6443/api/v1/persistentvolumeclaims?limit=1", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")
		if resp.StatusCode != http.StatusOK || got != uid {
			t.Errorf("the binder's list of claims: %s, FlowSchema UID %q, want volplane-controllers' %q", resp.Status, got, uid)
		}
		t.Logf("a request as volplane-binder: X-Kubernetes-PF-FlowSchema-UID %s = volplane-controllers, X-Kubernetes-PF-PriorityLevel-UID %s",
			got, resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID"))
		// And the running controllers' own requests, by the API server's
		// metrics.
		metrics := c.Kubectl(t, "get", "--raw", "/metrics")
		n, _ := metricValue(metrics, "apiserver_flowcontrol_dispatched_requests_total", `flow_schema="volplane-controllers"`, `priority_level="volplane"`)
		if n == 0 {
			t.Errorf("no request dispatched by FlowSchema volplane-controllers at priority level volplane")
		}
		t.Logf("apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"volplane-controllers\",priority_level=\"volplane\"} = %v", n)
	})

	t.Run("metrics reachable", func(t *testing.T) {
		for _, app := range []string{"volplane-binder", "volplane-provisioner", "volplane-reclaimer", "volplane-watcher"} {
			p := podsOf(t, app)[0]
			code, body, err := httpGet(t.Context(), "http://"+p.IP+":9090/metrics")
			// volplane's own metrics appear as they are first counted
			// (a reclaimer that reclaimed nothing has none yet); the
			// process's and the gRPC server's are there from the start.
			if err != nil || code != http.StatusOK || !strings.Contains(body, "# TYPE go_goroutines") {
				t.Errorf("%s :9090/metrics: %d %v", p.Name, code, err)
				continue
			}
			t.Logf("%s (%s:9090/metrics): %d samples, %d of them volplane_", p.Name, p.IP,
				strings.Count(body, "\n")-strings.Count(body, "\n#"), strings.Count(body, "\nvolplane_"))
		}
	})

	t.Run("the gateway's client CA Secret exists", func(t *testing.T) {
		out := c.Kubectl(t, "get", "secret", "-n", volplaneNS, "volplane-gateway-client-ca", "-o", "jsonpath={.data.ca\\.crt}")
		if out == "" {
			t.Error("volplane-gateway-client-ca has no ca.crt")
		}
	})
}

// quiesce waits until volplane has nothing in flight: no volume of a CSI
// driver waiting for its reclaim (a Released volume of policy Retain
// waits for nothing: the earlier phases keep some), no journaled
// operation.
func quiesce(t *testing.T) {
	t.Helper()
	g := gateway(t)
	waitFor(t, 5*time.Minute, func() string {
		pvs, err := c.Client.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		n := 0
		for _, pv := range pvs.Items {
			retained := pv.Status.Phase == "Released" && pv.Spec.PersistentVolumeReclaimPolicy == "Retain"
			if pv.Spec.CSI != nil && pv.Status.Phase != "Bound" && pv.Status.Phase != "Available" && !retained {
				n++
			}
		}
		if n > 0 {
			return fmt.Sprintf("%d volumes of CSI drivers are being reclaimed", n)
		}
		out, err := g.Plugin(t.Context(), "operations", "-o", "json")
		var ops struct {
			Operations []json.RawMessage `json:"operations"`
		}
		if err == nil {
			err = json.Unmarshal([]byte(out), &ops)
		}
		if err != nil || len(ops.Operations) > 0 {
			return fmt.Sprintf("operations in flight: %s %v", out, err)
		}
		return ""
	})
}
