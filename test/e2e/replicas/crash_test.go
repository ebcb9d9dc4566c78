package replicas

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/test/harness/devenv"
)

// A binder process killed with SIGKILL in the middle of binding leaves
// half-done binds and a live lease behind; the next binder process finishes
// every bind (after the dead replica's lease expires and its share of the
// claims moves over) and binds no volume twice.
func TestKilledBinderIsFinishedByTheNextOne(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "binder")
	began := time.Now()
	build := exec.Command("go", "build", "-o", bin, "github.com/volplane/volplane/services/binder/cmd/binder")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the binder: %v\n%s", err, out)
	}
	t.Logf("binder built in %s", time.Since(began).Round(time.Millisecond))
	dir := t.TempDir()
	start := func(name string) (*devenv.Process, string) {
		t.Helper()
		addr, err := devenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		p, err := devenv.StartProcess(dir, name, bin, "--kubeconfig", env.Kubeconfig,
			"--etcd-endpoints", strings.Join(env.EtcdEndpoints, ","), "--listen", addr,
			"--watcher-address", watcherAddr, "--member-id", name, "--resync-period", "2s",
			"--etcd-cacert", env.EtcdSecurity.CAFile, "--etcd-cert", env.EtcdSecurity.CertFile, "--etcd-key", env.EtcdSecurity.KeyFile,
			"--tls-ca-file", cl.TLS("binder").CAFile, "--tls-cert-file", cl.TLS("binder").CertFile, "--tls-key-file", cl.TLS("binder").KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		if err := cl.WaitServing(context.Background(), addr, time.Minute); err != nil {
			b, _ := os.ReadFile(p.LogPath)
			t.Fatalf("%s: %v\n%s", name, err, b)
		}
		return p, addr
	}

	ns := newNamespace(t, "crash")
	first, _ := start("binder-first")
	const total = 300
	createPairs(t, ns, "crash", total)
	// Kill it once it has bound some, not all.
	eventually(t, time.Minute, func() string {
		claims, err := client.CoreV1().PersistentVolumeClaims(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		n := 0
		for _, c := range claims.Items {
			if c.Spec.VolumeName != "" {
				n++
			}
		}
		if n < 30 {
			return "fewer than 30 claims bound yet"
		}
		return ""
	})
	if err := syscall.Kill(-pid(t, first), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.Done()
	killed := time.Now()

	start("binder-second")
	allBound(t, ns, total)
	t.Logf("all %d bound %s after the kill", total, time.Since(killed).Round(time.Millisecond))
}

func pid(t *testing.T, p *devenv.Process) int {
	t.Helper()
	id := p.PID()
	if id <= 0 {
		t.Fatal("no pid")
	}
	return id
}
