package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// staticPairs makes n volumes and n claims that match them, of a class
// no provisioner serves, named <prefix>-i.
func staticPairs(t *testing.T, ns, prefix string, n int) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: PersistentVolume
metadata: {name: %[1]s-%[3]d-%[2]s, labels: {test: %[2]s}}
spec:
  capacity: {storage: 1Mi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: cutover-%[2]s
  hostPath: {path: /nonexistent/%[2]s/%[3]d}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %[1]s-%[3]d, namespace: %[2]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cutover-%[2]s
  resources: {requests: {storage: 1Mi}}
`, prefix, ns, i)
	}
	c.Apply(t, "", b.String())
	t.Cleanup(func() { c.Run(context.Background(), "", "delete", "pv", "-l", "test="+ns, "--wait=false") })
}

// boundClaims counts the claims of ns named <prefix>-* that are Bound.
func boundClaims(t *testing.T, ns, prefix string) (bound, all int) {
	t.Helper()
	claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if !strings.HasPrefix(cl.Name, prefix+"-") {
			continue
		}
		all++
		if cl.Status.Phase == "Bound" {
			bound++
		}
	}
	return bound, all
}

// foreignNotices returns what volplane's binders said about another
// binder: ForeignBinder Events, the metric, warning log lines.
func foreignNotices(t *testing.T) (events string, metric float64, logs []string) {
	t.Helper()
	events, _ = c.Run(t.Context(), "", "get", "events", "-A", "--field-selector", "reason=ForeignBinder", "-o",
		`jsonpath={range .items[*]}{.type} {.reason} {.involvedObject.kind}/{.involvedObject.name}: {.message}{"\n"}{end}`)
	for _, p := range podsOf(t, "volplane-binder") {
		if _, body, err := httpGet(t.Context(), "http://"+p.IP+":9090/metrics"); err == nil {
			v, _ := metricValue(body, "volplane_binder_foreign_binds_total", `manager="kube-controller-manager"`)
			metric += v
		}
		out, _ := c.Run(t.Context(), "", "logs", "-n", volplaneNS, p.Name)
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "another binder is active") {
				logs = append(logs, p.Name+": "+line)
			}
		}
	}
	return events, metric, logs
}

// testCutover: kube-controller-manager started again with its binder on
// (docs/install.md's rollback step, here as the mistake of a cutover not
// done): volplane notices and says so (Event, metric, warning); then
// docs/install.md's rollback of volplane, after which
// kube-controller-manager alone binds (the driver's csi-provisioner comes
// back after it: vendorCutover.rollback).
func testCutover(t *testing.T, in *Install) string {
	requireVolplaneReady(t)
	ns := c.Namespace(t)
	start := time.Now()
	in.Run(t, "kcm-binder-on")
	in.Run(t, "kcm-wait-on")
	kcmBinderOff(t, false)
	t.Logf("kube-controller-manager restarted with its binder on in %v", time.Since(start).Round(time.Second))

	var (
		events  string
		metric  float64
		logs    []string
		rounds  int
		created int
		last    time.Time
	)
	waitFor(t, 4*time.Minute, func() string {
		// Both binders race for each new pair; kube-controller-manager
		// wins some, and volplane's binder reports those: a round of
		// pairs every 15s until it has.
		if (events == "" || metric == 0 || len(logs) == 0) && rounds < 8 && time.Since(last) > 15*time.Second {
			staticPairs(t, ns, fmt.Sprintf("r%d", rounds), 5)
			created += 5
			rounds++
			last = time.Now()
		}
		events, metric, logs = foreignNotices(t)
		switch {
		case events == "":
			return "no ForeignBinder Event yet"
		case metric == 0:
			return "volplane_binder_foreign_binds_total{manager=\"kube-controller-manager\"} is 0"
		case len(logs) == 0:
			return "no warning in the binders' logs"
		}
		return ""
	})
	t.Logf("volplane noticed kube-controller-manager's binder (%d claims created):\nEvents:\n%s"+
		"volplane_binder_foreign_binds_total{manager=\"kube-controller-manager\"} = %v (binders summed)\nlog:\n  %s",
		created, events, metric, strings.Join(logs, "\n  "))

	// The rollback of docs/install.md: volplane's binder, provisioner and
	// reclaimer stopped, kube-controller-manager's binder on (it already
	// is: the step is the same sed, and changes nothing now).
	start = time.Now()
	in.Run(t, "rollback-volplane")
	in.Run(t, "kcm-binder-on")
	in.Run(t, "kcm-wait-on")
	kcmBinderOff(t, false)
	for _, app := range []string{"volplane-binder", "volplane-provisioner", "volplane-reclaimer"} {
		if ps := podsOf(t, app); len(ps) != 0 {
			t.Errorf("%d pods of %s after the rollback", len(ps), app)
		}
	}
	t.Logf("rolled back in %v", time.Since(start).Round(time.Second))
	// kube-controller-manager alone binds now.
	staticPairs(t, ns, "after", 3)
	waitFor(t, 2*time.Minute, func() string {
		if b, n := boundClaims(t, ns, "after"); b != n || n != 3 {
			return fmt.Sprintf("%d of %d claims Bound after the rollback", b, n)
		}
		return ""
	})
	cl, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "after-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var managers []string
	for _, mf := range cl.ManagedFields {
		managers = append(managers, mf.Manager)
	}
	if !strings.Contains(strings.Join(managers, " "), "kube-controller-manager") {
		t.Errorf("claim after-0 was bound by %v, not kube-controller-manager", managers)
	}
	t.Logf("after the rollback kube-controller-manager binds: claims after-0..2 Bound (claim after-0's managers: %v)", managers)
	return fmt.Sprintf("ForeignBinder Events, metric %v, %d warnings; rolled back; kube-controller-manager binds again", metric, len(logs))
}
