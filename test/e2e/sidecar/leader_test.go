package sidecar

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/sidecar"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// lockName is the leader lock csi-provisioner v6.3.0 takes for the dev
// driver (hostpath.csi.volplane.io): its name with every character but
// letters, digits and '-' made '-'.
const lockName = "hostpath-csi-volplane-io"

// Short leader-election timings, so a takeover shows within a test.
const lockLease = 4 * time.Second

var leaderArgs = []string{"--leader-election", "--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s"}

// registered lists the pods registered in namespace.
func registered(t *testing.T, namespace string) []string {
	t.Helper()
	leases, err := env.client.CoordinationV1().Leases(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: sidecar.LabelRegistration + "=" + sidecar.Version})
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for i := range leases.Items {
		reg, err := sidecar.FromLease(&leases.Items[i])
		if err != nil {
			t.Fatalf("a sidecar wrote a registration that does not read: %v", err)
		}
		if !reg.LeaderElection {
			t.Fatalf("registration %+v does not say it is a leader's", reg)
		}
		pods = append(pods, reg.Pod)
	}
	return pods
}

// lockHolder is the holder of the driver's leader lock.
func lockHolder(t *testing.T, namespace string) string {
	t.Helper()
	l, err := env.client.CoordinationV1().Leases(namespace).Get(t.Context(), lockName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestOneLeaderRegisters: of two sidecars with --leader-election, only the
// one holding csi-provisioner's lock registers; when it stops, the other
// takes the lock and registers within the lock's lease duration.
func TestOneLeaderRegisters(t *testing.T) {
	ns := e2e.Namespace(t, env.client)
	procs := map[string]*proc{}
	for _, pod := range []string{"csi-controller-a", "csi-controller-b"} {
		procs[pod] = startSidecar(t, pod, ns, leaderArgs...)
	}
	var leader string
	e2e.Eventually(t, 30*time.Second, func() string {
		pods := registered(t, ns)
		if len(pods) != 1 {
			return fmt.Sprintf("registered: %v", pods)
		}
		leader = pods[0]
		if h := lockHolder(t, ns); h != leader {
			return fmt.Sprintf("%s registered, the lock %s is held by %q", leader, lockName, h)
		}
		return ""
	})
	e2e.Consistently(t, 3*time.Second, func() string {
		if pods := registered(t, ns); len(pods) != 1 || pods[0] != leader {
			return fmt.Sprintf("registered: %v, want only the leader %s", pods, leader)
		}
		return ""
	})
	follower := "csi-controller-a"
	if leader == follower {
		follower = "csi-controller-b"
	}

	stopped := time.Now()
	procs[leader].Stop()
	if st := procs[leader].ExitStatus(); st != "exit status 0" {
		t.Errorf("the leader ended with %q after SIGTERM", st)
	}
	if _, err := registration(t.Context(), ns, leader); !apierrors.IsNotFound(err) {
		t.Fatalf("the stopped leader's registration: %v, want deleted", err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		if pods := registered(t, ns); len(pods) != 1 || pods[0] != follower {
			return fmt.Sprintf("registered: %v, want %s", pods, follower)
		}
		return ""
	})
	took := time.Since(stopped)
	t.Logf("%s registered %s after %s stopped (lock lease %s)", follower, took.Round(10*time.Millisecond), leader, lockLease)
	// The lock is left to expire, as csi-provisioner leaves it: up to a
	// lease after the leader's last renewal (at most a retry period before
	// it stopped), then the follower's next try (a retry period, with
	// jitter), then its first write; a loaded machine adds seconds.
	if limit := lockLease + 5*time.Second; took > limit {
		t.Fatalf("the follower registered %s after the leader stopped, want within %s", took, limit)
	}
}

// TestLosingTheLockDeregistersAndExits: a leader whose lock is taken
// deletes its registration and exits non-zero, as csi-provisioner exits.
func TestLosingTheLockDeregistersAndExits(t *testing.T) {
	ns := e2e.Namespace(t, env.client)
	p := startSidecar(t, "csi-controller-0", ns, leaderArgs...)
	waitRegistered(t, p, 30*time.Second)
	leases := env.client.CoordinationV1().Leases(ns)
	e2e.Eventually(t, 10*time.Second, func() string {
		l, err := leases.Get(t.Context(), lockName, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		thief, secs, now := "thief", int32(60), metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &thief, &secs, &now, &now
		if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
			return "steal the lock: " + err.Error()
		}
		return ""
	})
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar still runs 30s after its lock was taken")
	}
	if st := p.ExitStatus(); st != "exit status 1" {
		t.Fatalf("the sidecar ended with %q, want exit status 1", st)
	}
	if _, err := registration(t.Context(), ns, p.pod); !apierrors.IsNotFound(err) {
		t.Fatalf("the registration after losing the lock: %v, want deleted", err)
	}
	if h := lockHolder(t, ns); h != "thief" {
		t.Fatalf("the lock is held by %q", h)
	}
}

// csiProvisioner is the pinned csi-provisioner: $VOLPLANE_CSI_PROVISIONER
// (make test sets it), else the Makefile's cache; "" when there is none.
func csiProvisioner() string {
	if p := os.Getenv("VOLPLANE_CSI_PROVISIONER"); p != "" {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	p := filepath.Join(home, ".cache", "volplane", "csi-provisioner-v6.3.0")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// TestSharesCSIProvisionersLock: during a swap the sidecar and the real
// csi-provisioner v6.3.0 contend for the same lock. While csi-provisioner
// holds it the sidecar does not register; once it is gone the sidecar
// takes the lock and registers.
func TestSharesCSIProvisionersLock(t *testing.T) {
	bin := csiProvisioner()
	if bin == "" {
		t.Skip("no csi-provisioner (make external-provisioner, or set VOLPLANE_CSI_PROVISIONER)")
	}
	ns := e2e.Namespace(t, env.client)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := devenv.StartProcessEnv(env.c.Dir(), "csi-provisioner-"+ns, bin, []string{"POD_NAMESPACE=" + ns},
		append([]string{"--csi-address=" + env.csiSock, "--kubeconfig=" + env.c.Kubeconfig, "--v=3"}, leaderArgs...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	e2e.Eventually(t, 30*time.Second, func() string {
		if h := lockHolder(t, ns); h != host {
			return fmt.Sprintf("lock %s held by %q, want csi-provisioner (%s; process: %s, log %s)", lockName, h, host, cp.ExitStatus(), cp.LogPath)
		}
		return ""
	})
	p := startSidecar(t, "csi-controller-new", ns, leaderArgs...)
	e2e.Consistently(t, 3*time.Second, func() string {
		if pods := registered(t, ns); len(pods) != 0 {
			return fmt.Sprintf("registered while csi-provisioner leads: %v", pods)
		}
		return ""
	})
	cp.Stop()
	waitRegistered(t, p, 30*time.Second)
	if h := lockHolder(t, ns); h != p.pod {
		t.Fatalf("the sidecar registered, the lock is held by %q", h)
	}
}
