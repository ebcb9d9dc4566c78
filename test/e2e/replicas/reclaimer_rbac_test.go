package replicas

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/kube"
	startup "github.com/volplane/volplane/pkg/replica"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/test/harness/devenv"
)

// releasedVolume creates a volume of claim ns/gone (which does not exist)
// and sets it Released, as the binder would.
func releasedVolume(t *testing.T, name string, src corev1.PersistentVolumeSource, affinity *corev1.VolumeNodeAffinity) *corev1.PersistentVolume {
	t.Helper()
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kube.AnnBoundByController: "yes"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRecycle,
			PersistentVolumeSource:        src,
			NodeAffinity:                  affinity,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "rbac-reclaim", Name: "gone", UID: "uid-gone"},
		},
	}
	ctx := context.Background()
	v, err := client.CoreV1().PersistentVolumes().Create(ctx, v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	v.Status.Phase = corev1.VolumeReleased
	if v, err = client.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return v
}

func runReclaimer(t *testing.T, o reclaimer.Options) reclaimerv1.ReclaimerServiceClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr, _ := devenv.FreeAddr()
	o.EtcdEndpoints, o.Etcd, o.Listen, o.TLS = env.EtcdEndpoints, env.EtcdSecurity, addr, cl.TLS("reclaimer")
	errc := make(chan error, 1)
	go func() { errc <- reclaimer.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("reclaimer %s: %v", o.MemberID, err)
		}
	})
	if err := cl.WaitServing(ctx, addr, time.Minute); err != nil {
		t.Fatal(err)
	}
	cc, err := cl.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return reclaimerv1.NewReclaimerServiceClient(cc)
}

func recycled(t *testing.T, c reclaimerv1.ReclaimerServiceClient, name string) {
	t.Helper()
	eventually(t, 30*time.Second, func() string {
		v, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v.Status.Phase != corev1.VolumeAvailable || v.Spec.ClaimRef != nil {
			r, _ := c.GetReclaim(context.Background(), &reclaimerv1.GetReclaimRequest{VolumeName: name})
			return "not recycled yet: " + string(v.Status.Phase) + "; " + r.GetReclaim().GetMessage()
		}
		return ""
	})
}

// recyclerNamespace is where deploy/kubernetes runs recycler pods
// (--recycler-namespace; rbac.yaml gives the reclaimer pod rights there
// only).
const recyclerNamespace = "volplane-recycler"

// The reclaimer needs no more than deploy/kubernetes/rbac.yaml grants: as
// its ServiceAccount it runs (and watches, and deletes) a recycler pod in
// the recycler namespace,
// repeats the pod's Events, reads the claims and pods it checks before a
// scrub, reads its Node, and updates the volume.
func TestReclaimerRunsWithTheDeployedRBAC(t *testing.T) {
	applyRBAC(t)
	sa := asComponent("reclaimer")
	ctx := context.Background()

	t.Run("recycler pod", func(t *testing.T) {
		// The recycler namespace of the manifests, where a Role gives the
		// reclaimer its pod rights (its "default" ServiceAccount is
		// kube-controller-manager's to make; this API server runs none).
		ns := recyclerNamespace
		if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		c := runReclaimer(t, reclaimer.Options{Options: startup.Options{RESTConfig: sa, MemberID: "reclaimer-rbac-pod", Logger: logger("reclaimer-rbac-pod")}, RecyclerNamespace: ns})
		v := releasedVolume(t, "rbac-nfs", corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/x"}}, nil)
		if _, err := c.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name}); err != nil {
			t.Fatal(err)
		}
		var pod *corev1.Pod
		eventually(t, 30*time.Second, func() string {
			var err error
			if pod, err = client.CoreV1().Pods(ns).Get(ctx, "recycler-for-rbac-nfs", metav1.GetOptions{}); err != nil {
				return err.Error()
			}
			return ""
		})
		pod.Status.Phase = corev1.PodSucceeded
		if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		recycled(t, c, v.Name)
	})

	// Its pod rights stop at the recycler namespace: elsewhere it may list
	// pods (the guard before a scrub) and nothing more.
	t.Run("no pod rights elsewhere", func(t *testing.T) {
		as, err := kubernetes.NewForConfig(sa)
		if err != nil {
			t.Fatal(err)
		}
		other := newNamespace(t, "rbac-not-recyclers")
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "recycler-for-nothing"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/x:1"}}}}
		for _, ns := range []string{other, "default", "volplane-system"} {
			if _, err := as.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("the reclaimer created a pod in %s: %v, want Forbidden", ns, err)
			}
			if err := as.CoreV1().Pods(ns).Delete(ctx, "anything", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("the reclaimer may delete pods in %s: %v, want Forbidden", ns, err)
			}
			if _, err := as.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("the reclaimer cannot list the pods of %s (its guard): %v", ns, err)
			}
		}
		if _, err := as.CoreV1().Pods(recyclerNamespace).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("list pods in %s: %v", recyclerNamespace, err)
		}
	})

	t.Run("node-local", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ".data"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		c := runReclaimer(t, reclaimer.Options{
			Options:             startup.Options{RESTConfig: sa, MemberID: "reclaimer-rbac-node", Logger: logger("reclaimer-rbac-node")},
			RecycleMode:         reclaimer.RecycleNodeLocal,
			NodeName:            "rbac-node",
			RecyclePathPrefixes: []string{filepath.Dir(dir)},
		})
		affinity := &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"rbac-node"}}},
		}}}}
		v := releasedVolume(t, "rbac-local", corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}}, affinity)
		if _, err := c.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name}); err != nil {
			t.Fatal(err)
		}
		recycled(t, c, v.Name)
		if es, _ := os.ReadDir(dir); len(es) != 0 {
			t.Errorf("left after the scrub: %v", es)
		}
		// Its Node was read (here: found missing), not refused.
		if b, _ := os.ReadFile(cl.LogPath); strings.Contains(string(b), "cannot read this replica's node") {
			t.Error("the reclaimer may not read its Node")
		}
	})
}
