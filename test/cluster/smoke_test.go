package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke checks what every workload of the cluster relies on: a Ready
// node, cluster DNS, and a pod with an emptyDir, a hostPath and a
// projected service-account token that resolves the kubernetes Service's
// name, authenticates to the API server through that Service (by name and
// by ClusterIP) with the projected token, and whose logs and exec work.
func TestSmoke(t *testing.T) {
	t.Run("node Ready", func(t *testing.T) {
		out := c.Kubectl(t, "get", "nodes", "-o",
			`jsonpath={range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 1 {
			t.Fatalf("want one node, got:\n%s", out)
		}
		f := strings.Fields(lines[0])
		if len(f) != 3 || f[1] != "True" {
			t.Fatalf("node not Ready: %q", lines[0])
		}
		if strings.HasPrefix(f[2], "127.") {
			t.Errorf("node %s's InternalIP is loopback (%s): pods could not reach it", f[0], f[2])
		}
	})
	t.Run("CoreDNS Running", func(t *testing.T) {
		waitFor(t, 2*time.Minute, func() string {
			out, err := c.Run(t.Context(), "", "get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns", "-o",
				`jsonpath={range .items[*]}{.status.phase}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
			if err != nil {
				return err.Error()
			}
			if !strings.Contains(out, "Running True") {
				return "CoreDNS pods: " + out
			}
			return ""
		})
	})

	ns := c.Namespace(t)
	t.Run("storage protection on, PV binder off", func(t *testing.T) {
		// A claim and a volume that kube-controller-manager's binder would
		// bind at once: StorageObjectInUseProtection and the protection
		// controllers add their finalizers, and the claim stays unbound.
		c.Apply(t, ns, fmt.Sprintf(`
apiVersion: v1
kind: PersistentVolume
metadata: {name: smoke-%[1]s}
spec:
  capacity: {storage: 1Mi}
  accessModes: [ReadWriteOnce]
  storageClassName: smoke-%[1]s
  hostPath: {path: /nonexistent}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: smoke}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: smoke-%[1]s
  resources: {requests: {storage: 1Mi}}
`, ns))
		t.Cleanup(func() { c.Run(context.Background(), "", "delete", "pv", "smoke-"+ns, "--wait=false") })
		waitFor(t, time.Minute, func() string {
			pvc, err := c.Run(t.Context(), "", "get", "pvc", "-n", ns, "smoke", "-o", "jsonpath={.metadata.finalizers}")
			if err != nil {
				return err.Error()
			}
			pv, err := c.Run(t.Context(), "", "get", "pv", "smoke-"+ns, "-o", "jsonpath={.metadata.finalizers}")
			if err != nil {
				return err.Error()
			}
			if !strings.Contains(pvc, "kubernetes.io/pvc-protection") || !strings.Contains(pv, "kubernetes.io/pv-protection") {
				return fmt.Sprintf("finalizers: claim %s, volume %s", pvc, pv)
			}
			return ""
		})
		holds(t, 10*time.Second, func() string {
			if phase := c.Kubectl(t, "get", "pvc", "-n", ns, "smoke", "-o", "jsonpath={.status.phase}"); phase != "Pending" {
				return "claim is " + phase + ": something bound it, but the PV binder should be off"
			}
			return ""
		})
	})

	hostDir := t.TempDir()
	nonce := randomSuffix()
	const pod = "smoke"
	c.Apply(t, ns, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  containers:
    - name: workload
      image: %[2]s
      imagePullPolicy: Never
      args: [hold, -write, /scratch/data=scratch-%[3]s, -write, /host/data=host-%[3]s]
      volumeMounts:
        - {name: scratch, mountPath: /scratch}
        - {name: host, mountPath: /host}
        - {name: token, mountPath: /var/run/secrets/tokens, readOnly: true}
  volumes:
    - name: scratch
      emptyDir: {}
    - name: host
      hostPath: {path: %[4]s, type: Directory}
    - name: token
      projected:
        sources:
          - serviceAccountToken: {path: token, expirationSeconds: 3600}
          - configMap:
              name: kube-root-ca.crt
              items: [{key: ca.crt, path: ca.crt}]
`, pod, c.WorkloadImage, nonce, hostDir))
	c.WaitPodReady(t, ns, pod, 3*time.Minute)

	t.Run("logs", func(t *testing.T) {
		waitFor(t, 30*time.Second, func() string {
			logs := c.Logs(t, ns, pod)
			if !strings.Contains(logs, "wrote /scratch/data") || !strings.Contains(logs, "holding") {
				return "log so far: " + logs
			}
			return ""
		})
	})
	t.Run("emptyDir", func(t *testing.T) {
		if got, want := c.Exec(t, ns, pod, "volplane-workload", "cat", "/scratch/data"), "scratch-"+nonce; got != want {
			t.Errorf("exec cat /scratch/data = %q, want %q", got, want)
		}
	})
	t.Run("hostPath", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(hostDir, "data"))
		if err != nil {
			t.Fatalf("the pod's file is not on the host: %v", err)
		}
		if got, want := string(b), "host-"+nonce; got != want {
			t.Errorf("host file = %q, want %q", got, want)
		}
	})

	svcIP := strings.TrimSpace(c.Kubectl(t, "get", "service", "kubernetes", "-n", "default", "-o", "jsonpath={.spec.clusterIP}"))
	t.Run("DNS", func(t *testing.T) {
		for _, name := range []string{"kubernetes.default.svc.cluster.local", "kubernetes.default"} {
			out := c.Exec(t, ns, pod, "volplane-workload", "resolve", name)
			if strings.TrimSpace(out) != svcIP {
				t.Errorf("resolve %s = %q, want the kubernetes Service's ClusterIP %s", name, out, svcIP)
			}
		}
	})
	t.Run("API through the kubernetes Service with the projected token", func(t *testing.T) {
		want := "system:serviceaccount:" + ns + ":default"
		for _, server := range []string{"https://kubernetes.default.svc", "https://" + svcIP} {
			out := c.Exec(t, ns, pod, "volplane-workload", "whoami",
				"-server", server, "-token", "/var/run/secrets/tokens/token", "-ca", "/var/run/secrets/tokens/ca.crt")
			if strings.TrimSpace(out) != want {
				t.Errorf("whoami via %s = %q, want %q", server, out, want)
			}
		}
	})
}
