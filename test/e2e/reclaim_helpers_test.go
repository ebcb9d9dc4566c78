package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/services/reclaimer"
)

// reclaimerClient dials a reclaimer's gRPC API.
func reclaimerClient(t *testing.T, addr string) reclaimerv1.ReclaimerServiceClient {
	t.Helper()
	cc, err := cluster.e2e.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return reclaimerv1.NewReclaimerServiceClient(cc)
}

// testReclaimer is a reclaimer replica a test starts (and may stop) itself,
// next to the shared one.
type testReclaimer struct {
	addr   string
	client reclaimerv1.ReclaimerServiceClient
	stop   func()
}

// startReclaimer runs another reclaimer replica with o (its connection
// settings filled in) until the test ends or stop is called.
func startReclaimer(t *testing.T, name string, o reclaimer.Options) *testReclaimer {
	t.Helper()
	lf, err := os.OpenFile(cluster.logs, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	o.Kubeconfig, o.EtcdEndpoints, o.Listen = cluster.env.Kubeconfig, cluster.env.EtcdEndpoints, freeAddr()
	o.MemberID, o.TLS = name, cluster.e2e.TLS("reclaimer")
	o.Logger = slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", name)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- reclaimer.Run(ctx, o) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("reclaimer %s stopped with: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("reclaimer %s did not stop within 30s", name)
			}
			lf.Close()
		})
	}
	t.Cleanup(stop)
	if err := waitServing(ctx, o.Listen, errc); err != nil {
		t.Fatal(err)
	}
	return &testReclaimer{addr: o.Listen, client: reclaimerClient(t, o.Listen), stop: stop}
}

// recyclerNamespace is a namespace for recycler pods, with the default
// ServiceAccount the API server's admission wants for a pod (no
// controller-manager creates it here).
func recyclerNamespace(t *testing.T) string {
	t.Helper()
	n := ns(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := cluster.client.CoreV1().ServiceAccounts(n).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitReclaim polls a reclaimer until the volume's reclaim is in state.
func waitReclaim(t *testing.T, c reclaimerv1.ReclaimerServiceClient, volume string, state reclaimerv1.State) *reclaimerv1.Reclaim {
	t.Helper()
	var r *reclaimerv1.Reclaim
	eventually(t, 30*time.Second, func() string {
		resp, err := c.GetReclaim(t.Context(), &reclaimerv1.GetReclaimRequest{VolumeName: volume})
		if err != nil {
			return err.Error()
		}
		if r = resp.Reclaim; r.State != state {
			return fmt.Sprintf("reclaim of %s is %s (%s), want %s", volume, r.State, r.Message, state)
		}
		return ""
	})
	return r
}

// writeTree fills dir with visible and hidden files, nested directories
// and a symbolic link to outside, which a scrub must remove without
// following.
func writeTree(t *testing.T, dir, outside string) {
	t.Helper()
	for _, f := range []string{"file", ".hidden", ".dir/.deeper/x", "a/b/c/d", "a/.e"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("data of "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("not the volume's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "a", "link")); err != nil {
		t.Fatal(err)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

func withHostPath(dir string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}
	}
}

func withNFS(server, path string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: server, Path: path}}
	}
}

// bindAndRelease binds the volume to a new claim, deletes the claim and
// waits until the volume is Released.
func bindAndRelease(t *testing.T, namespace, volume, cls string) {
	t.Helper()
	createPVC(t, namespace, "data", "1Gi", cls, wantVolume(volume))
	pvcPhase(t, namespace, "data", corev1.ClaimBound)
	if err := cluster.client.CoreV1().PersistentVolumeClaims(namespace).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Released, or already past it: a node-local recycle can make the
	// volume Available again between two polls. Callers check the end state.
	eventually(t, 30*time.Second, func() string {
		v := getPV(t, volume)
		if v == nil {
			return "PV " + volume + " not found"
		}
		if v.Status.Phase == corev1.VolumeBound || v.Status.Phase == corev1.VolumePending {
			return fmt.Sprintf("PV %s is still %s", volume, v.Status.Phase)
		}
		return ""
	})
}
