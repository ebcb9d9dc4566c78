package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// statefulSet is a StatefulSet of the workload image whose pods write
// /data/id (their own name and nonce) on a claim of class from its
// volumeClaimTemplates, unless it is there, and hold.
func statefulSet(name, class, nonce string, replicas int) string {
	return fmt.Sprintf(`
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: %[1]s}
spec:
  serviceName: %[1]s
  replicas: %[4]d
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 2
      automountServiceAccountToken: false
      containers:
        - name: workload
          image: %[5]s
          imagePullPolicy: Never
          args: [hold, -write, "/data/id=$(POD_NAME) %[3]s"]
          env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
          volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        accessModes: [ReadWriteOnce]
        storageClassName: %[2]s
        resources: {requests: {storage: 10Mi}}
`, name, class, nonce, replicas, c.WorkloadImage)
}

// readIDs reads /data/id in each pod of a StatefulSet and checks that it
// is the pod's own.
func readIDs(t *testing.T, ns, sts, nonce string, replicas int) []string {
	t.Helper()
	var lines []string
	for i := range replicas {
		pod := fmt.Sprintf("%s-%d", sts, i)
		c.WaitPodReady(t, ns, pod, 3*time.Minute)
		got := c.Exec(t, ns, pod, "volplane-workload", "cat", "/data/id")
		if want := pod + " " + nonce; got != want {
			t.Errorf("pod %s reads %q from its volume, want %q", pod, got, want)
		}
		lines = append(lines, fmt.Sprintf("%s: /data/id = %q", pod, got))
	}
	return lines
}

// testWorkloads: a StatefulSet keeps its data across pod deletions on
// volumes the real scheduler placed (WaitForFirstConsumer) and volplane
// provisioned; a static PV with a pre-bound claim; Delete removes the
// backing volumes, Retain keeps them; a claim too big for the node stays
// Pending and `kubectl volplane explain` says why.
func testWorkloads(t *testing.T) {
	requireVolplaneReady(t)
	ns := c.Namespace(t)
	nonce := randomSuffix()
	node := strings.TrimSpace(c.Kubectl(t, "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"))

	t.Run("StatefulSet keeps its data", func(t *testing.T) {
		start := time.Now()
		c.Apply(t, ns, statefulSet("data", classWFFC, nonce, 3))
		first := readIDs(t, ns, "data", nonce, 3)
		t.Logf("3 pods Ready on their new volumes in %v:\n  %s", time.Since(start).Round(time.Second), strings.Join(first, "\n  "))
		// The scheduler chose the node; volplane provisioned there.
		for i := range 3 {
			claim := fmt.Sprintf("data-data-%d", i)
			sel := c.Kubectl(t, "get", "pvc", "-n", ns, claim, "-o", `jsonpath={.metadata.annotations.volume\.kubernetes\.io/selected-node}`)
			if sel != node {
				t.Errorf("claim %s: selected-node %q, want %q (the scheduler's choice)", claim, sel, node)
			}
		}
		uids := c.Kubectl(t, "get", "pods", "-n", ns, "-l", "app=data", "-o", "jsonpath={.items[*].metadata.uid}")
		c.Kubectl(t, "delete", "pods", "-n", ns, "-l", "app=data", "--wait=true")
		waitFor(t, 3*time.Minute, func() string {
			now := c.Kubectl(t, "get", "pods", "-n", ns, "-l", "app=data", "-o", "jsonpath={.items[*].metadata.uid}")
			for _, u := range strings.Fields(uids) {
				if strings.Contains(now, u) {
					return "an old pod is still there"
				}
			}
			if len(strings.Fields(now)) != 3 {
				return "pods: " + now
			}
			return ""
		})
		again := readIDs(t, ns, "data", nonce, 3)
		for i := range 3 {
			pod := fmt.Sprintf("data-%d", i)
			if log := c.Logs(t, ns, pod); !strings.Contains(log, "kept /data/id: "+pod+" "+nonce) {
				t.Errorf("pod %s, recreated, did not find its data at start: %s", pod, log)
			}
		}
		t.Logf("pods deleted and recreated, each read its own data back:\n  %s", strings.Join(again, "\n  "))
	})

	t.Run("static PV with a pre-bound claim", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "static")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		pv := "static-" + ns
		c.Apply(t, ns, fmt.Sprintf(`
apiVersion: v1
kind: PersistentVolume
metadata: {name: %[1]s}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: %[2]s, name: static}
  hostPath: {path: %[3]q, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: static}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: %[1]s
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: static}
spec:
  terminationGracePeriodSeconds: 2
  automountServiceAccountToken: false
  containers:
    - name: workload
      image: %[4]s
      imagePullPolicy: Never
      args: [hold, -write, /data/id=static-%[5]s]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: static}}]
`, pv, ns, dir, c.WorkloadImage, nonce))
		t.Cleanup(func() { c.Run(context.Background(), "", "delete", "pv", pv, "--wait=false") })
		c.WaitPodReady(t, ns, "static", 3*time.Minute)
		if got := c.Kubectl(t, "get", "pvc", "-n", ns, "static", "-o", "jsonpath={.status.phase} {.spec.volumeName}"); got != "Bound "+pv {
			t.Errorf("pre-bound claim: %q, want Bound to %s", got, pv)
		}
		b, err := os.ReadFile(filepath.Join(dir, "id"))
		if err != nil || string(b) != "static-"+nonce {
			t.Errorf("the pod's write on the host: %q, %v", b, err)
		}
		t.Logf("static PV %s bound to its pre-bound claim; the pod wrote %q in %s on the host", pv, b, dir)
		c.Kubectl(t, "delete", "pod", "-n", ns, "static", "--wait=true")
	})

	t.Run("Delete removes backing volumes, Retain keeps them", func(t *testing.T) {
		c.Apply(t, ns, statefulSet("keep", classRetain, nonce, 1))
		readIDs(t, ns, "keep", nonce, 1)
		handles := map[string]string{} // claim -> volume handle
		for _, claim := range []string{"data-data-0", "data-data-1", "data-data-2", "data-keep-0"} {
			pv := c.Kubectl(t, "get", "pvc", "-n", ns, claim, "-o", "jsonpath={.spec.volumeName}")
			h := c.Kubectl(t, "get", "pv", pv, "-o", "jsonpath={.spec.csi.volumeHandle}")
			handles[claim] = h
			if !backingVolumes(t)[h] {
				t.Fatalf("claim %s's volume %s has no directory in %s/volumes", claim, h, devDriverRoot)
			}
		}
		retained := c.Kubectl(t, "get", "pvc", "-n", ns, "data-keep-0", "-o", "jsonpath={.spec.volumeName}")
		c.Kubectl(t, "scale", "statefulset", "-n", ns, "data", "keep", "--replicas=0")
		waitFor(t, 2*time.Minute, func() string {
			if out := c.Kubectl(t, "get", "pods", "-n", ns, "-l", "app in (data,keep)", "-o", "name"); out != "" {
				return "pods left: " + out
			}
			return ""
		})
		c.Kubectl(t, "delete", "pvc", "-n", ns, "data-data-0", "data-data-1", "data-data-2", "data-keep-0")
		waitFor(t, 2*time.Minute, func() string {
			have := backingVolumes(t)
			for _, claim := range []string{"data-data-0", "data-data-1", "data-data-2"} {
				if have[handles[claim]] {
					return fmt.Sprintf("the backing volume %s of deleted claim %s (policy Delete) is still there", handles[claim], claim)
				}
			}
			return ""
		})
		holds(t, 5*time.Second, func() string {
			if !backingVolumes(t)[handles["data-keep-0"]] {
				return "the backing volume of the Retain claim is gone"
			}
			return ""
		})
		if phase := c.Kubectl(t, "get", "pv", retained, "-o", "jsonpath={.status.phase}"); phase != "Released" {
			t.Errorf("retained volume %s: phase %s, want Released", retained, phase)
		}
		b, err := os.ReadFile(filepath.Join(devDriverRoot, "volumes", handles["data-keep-0"], "id"))
		if err != nil || string(b) != "keep-0 "+nonce {
			t.Errorf("retained data on the host: %q, %v", b, err)
		}
		t.Logf("policy Delete: backing volumes %s, %s, %s removed; policy Retain: %s kept (PV %s Released), its data on the host: %q",
			handles["data-data-0"], handles["data-data-1"], handles["data-data-2"], handles["data-keep-0"], retained, b)
		// An administrator done with the retained data: policy Delete
		// makes volplane delete it, leaving no backing volume behind.
		c.Kubectl(t, "patch", "pv", retained, "-p", `{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
		waitFor(t, 2*time.Minute, func() string {
			if backingVolumes(t)[handles["data-keep-0"]] {
				return "the retained volume, now policy Delete, is still there"
			}
			if _, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), retained, metav1.GetOptions{}); err == nil {
				return "PV " + retained + " is still there"
			}
			return ""
		})
	})

	t.Run("a claim too big stays Pending and explain says why", func(t *testing.T) {
		c.Apply(t, ns, `
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: too-big}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: `+classImmediate+`
  resources: {requests: {storage: 20Gi}}
`)
		waitFor(t, time.Minute, func() string {
			ev := c.Kubectl(t, "get", "events", "-n", ns, "--field-selector", "involvedObject.name=too-big,reason=ProvisioningFailed", "-o", "jsonpath={.items[*].message}")
			if ev == "" {
				return "no ProvisioningFailed event yet"
			}
			return ""
		})
		holds(t, 5*time.Second, func() string {
			if p := c.Kubectl(t, "get", "pvc", "-n", ns, "too-big", "-o", "jsonpath={.status.phase}"); p != "Pending" {
				return "too-big is " + p
			}
			return ""
		})
		g := gateway(t)
		out := g.waitPlugin(t, "explain", "pvc", "too-big", "-n", ns)
		t.Logf("kubectl volplane explain pvc too-big:\n%s", out)
		for _, want := range []string{"Pending", "ResourceExhausted"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain does not say %q", want)
			}
		}
		c.Kubectl(t, "delete", "pvc", "-n", ns, "too-big")
	})
}
