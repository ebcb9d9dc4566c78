package crash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/test/harness/chaos"
	"github.com/volplane/volplane/test/harness/e2e"
)

// Every fault point, in one cluster of one replica per service: the
// replica is started with VOLPLANE_FAULTPOINT naming the point, made to
// reach it, seen to exit with faultpoint.ExitCode, and started again
// without it (a new member, as a replacement pod would be). Then every
// invariant of the chaos run holds: each claim Bound to exactly one
// volume, no CSI volume without a PV or journal record, no journal record
// left, the deleted claims' volumes gone, the marker files in live claims'
// volumes intact, the binder's cache equal to the API.
func TestCrashAtEveryFaultPoint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services as processes against a real kube-apiserver and etcd")
	}
	ctx := t.Context()
	bin := t.TempDir()
	if err := chaos.Build(ctx, bin); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := chaos.StartCluster(ctx, chaos.ClusterOptions{Dir: dir, BinDir: bin, Watchers: 1, Binders: 1, Provisioners: 1, Reclaimers: 1,
		Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	x := &crashes{t: t, c: c, book: chaos.NewBook()}
	x.setup()
	binder, provisioner, reclaimer := c.Replicas("binder")[0], c.Replicas("provisioner")[0], c.Replicas("reclaimer")[0]

	// First, while nothing else is bound: the binder's first bind is the
	// one that crashes.
	t.Run(faultpoint.BinderAfterClaimRef, func(t *testing.T) {
		x.t = t
		x.c.ArmFault(x.t, binder, faultpoint.BinderAfterClaimRef)
		x.staticVolume("b1", corev1.PersistentVolumeReclaimRetain)
		cl := x.claim("b1", "")
		chaos.WaitFaultExit(x.t, binder)
		pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, "crash-b1", metav1.GetOptions{})
		if err != nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != cl.UID || pv.Status.Phase == corev1.VolumeBound {
			t.Fatalf("at the crash the volume should name the claim and not be Bound yet: %v %v", pv, err)
		}
		x.restart(binder)
		x.bound(cl, "crash-b1")
	})
	t.Run(faultpoint.ProvisionerAfterCreateVolume+"/claim-kept", func(t *testing.T) {
		x.t = t
		x.c.ArmFault(x.t, provisioner, faultpoint.ProvisionerAfterCreateVolume)
		cl := x.claim("p1-keep", chaos.DynamicClass)
		chaos.WaitFaultExit(x.t, provisioner)
		x.restart(provisioner)
		x.bound(cl, "pvc-"+string(cl.UID))
	})
	t.Run(faultpoint.ProvisionerAfterCreateVolume+"/claim-deleted-meanwhile", func(t *testing.T) {
		x.t = t
		x.c.ArmFault(x.t, provisioner, faultpoint.ProvisionerAfterCreateVolume)
		cl := x.claim("p1-gone", chaos.DynamicClass)
		chaos.WaitFaultExit(x.t, provisioner)
		if !x.hasCSIVolume("pvc-" + string(cl.UID)) {
			t.Fatal("at the crash the CSI volume should exist")
		}
		x.delete(cl)
		x.restart(provisioner)
		x.gone(cl)
	})
	t.Run(faultpoint.ProvisionerAfterSaveVolume, func(t *testing.T) {
		x.t = t
		x.c.ArmFault(x.t, provisioner, faultpoint.ProvisionerAfterSaveVolume)
		cl := x.claim("p2", chaos.DynamicClass)
		chaos.WaitFaultExit(x.t, provisioner)
		x.restart(provisioner)
		x.bound(cl, "pvc-"+string(cl.UID))
	})
	t.Run(faultpoint.ReclaimerAfterScrub, func(t *testing.T) {
		x.t = t
		x.staticVolume("r1", corev1.PersistentVolumeReclaimRecycle)
		cl := x.claim("r1", "")
		x.bound(cl, "crash-r1")
		x.mark()
		x.c.ArmFault(x.t, reclaimer, faultpoint.ReclaimerAfterScrub)
		x.delete(cl)
		chaos.WaitFaultExit(x.t, reclaimer)
		x.restart(reclaimer)
		e2e.VolumePhase(t, c.Client, "crash-r1", corev1.VolumeAvailable, 2*time.Minute)
		if left, _ := os.ReadDir(filepath.Join(c.HostPath, "r1")); len(left) != 0 {
			t.Errorf("the recycled volume still holds %d entries", len(left))
		}
	})
	// The reclaim record is the deletion's only journal: with the
	// reclaimer stopped right after it journaled the deletion, the
	// PersistentVolume goes (its finalizers taken off, as a volume without
	// them would go), and the reclaimer started again still has the
	// backing volume deleted, from the record's copy of the volume.
	t.Run(faultpoint.ReclaimerBeforeDeleteVolume+"/volume-deleted-meanwhile", func(t *testing.T) {
		x.t = t
		cl := x.claim("d0", chaos.DynamicClass)
		name := "pvc-" + string(cl.UID)
		x.bound(cl, name)
		x.mark()
		x.c.ArmFault(x.t, reclaimer, faultpoint.ReclaimerBeforeDeleteVolume)
		x.delete(cl)
		chaos.WaitFaultExit(x.t, reclaimer)
		pvs := c.Client.CoreV1().PersistentVolumes()
		if _, err := pvs.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := pvs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := pvs.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the PersistentVolume should be gone: %v", err)
		}
		if !x.hasCSIVolume(name) {
			t.Fatal("at the crash the CSI volume should exist")
		}
		x.restart(reclaimer)
		x.gone(cl)
	})
	t.Run(faultpoint.ReclaimerAfterDeleteVolume, func(t *testing.T) {
		x.t = t
		cl := x.claim("d1", chaos.DynamicClass)
		x.bound(cl, "pvc-"+string(cl.UID))
		x.mark()
		x.c.ArmFault(x.t, reclaimer, faultpoint.ReclaimerAfterDeleteVolume)
		x.delete(cl)
		chaos.WaitFaultExit(x.t, reclaimer)
		x.restart(reclaimer)
		x.gone(cl)
	})

	// Not a fault point: a claim deleted while the CSI driver restarts,
	// handed to a reclaimer that reads the provisioner's drivers for the
	// first time then (it was just restarted). The provisioner lists the
	// driver's endpoint without a name; the reclaimer once took that for
	// "another deleter's volume" and skipped it for 10 minutes (the short
	// chaos run's lost Delete volume). The volume must be deleted once
	// the driver is back.
	t.Run("delete-while-the-driver-restarts", func(t *testing.T) {
		x.t = t
		cl := x.claim("d2", chaos.DynamicClass)
		x.bound(cl, "pvc-"+string(cl.UID))
		x.mark()
		unreachable := logCount(t, provisioner, "CSI driver unreachable")
		c.CSI.Kill()
		e2e.Eventually(t, time.Minute, func() string {
			if logCount(t, provisioner, "CSI driver unreachable") == unreachable {
				return "the provisioner has not seen the CSI driver go yet"
			}
			return ""
		})
		reclaimer.Kill()
		x.restart(reclaimer)
		if err := c.WaitServing(ctx, reclaimer, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		x.delete(cl)
		e2e.Eventually(t, time.Minute, func() string {
			pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, "pvc-"+string(cl.UID), metav1.GetOptions{})
			if err != nil || pv.Status.Phase != corev1.VolumeReleased {
				return fmt.Sprintf("the volume is not Released yet: %v", err)
			}
			return ""
		})
		// The reclaimer has the volume while the driver is away: it waits.
		e2e.Eventually(t, time.Minute, func() string {
			if logCount(t, reclaimer, "waiting for the provisioner to identify the CSI driver") == 0 {
				return "the reclaimer has not said it waits for the driver"
			}
			return ""
		})
		if err := c.CSI.Start(); err != nil {
			t.Fatal(err)
		}
		x.gone(cl)
	})

	// The whole cluster, once everything settled.
	x.t = t
	x.mark()
	e2e.Eventually(t, 2*time.Minute, func() string {
		res, err := chaos.Check(ctx, c, x.book)
		if err != nil {
			return err.Error()
		}
		if f := res.Failing(); len(f) > 0 {
			return fmt.Sprint(f)
		}
		return ""
	})
	res, _ := chaos.Check(ctx, c, x.book)
	var w writer
	res.Print(&w)
	t.Logf("final state:\n%s", w)
}

type writer []byte

func (w *writer) Write(b []byte) (int, error) { *w = append(*w, b...); return len(b), nil }
func (w writer) String() string               { return string(w) }

// crashes carries the test's cluster and book through the steps.
type crashes struct {
	t    testing.TB
	c    *chaos.Cluster
	book *chaos.Book
}

func (x *crashes) setup() {
	x.t.Helper()
	// The chaos run's namespace and dynamic class.
	if _, err := x.c.Client.CoreV1().Namespaces().Create(x.t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chaos.Namespace}}, metav1.CreateOptions{}); err != nil {
		x.t.Fatal(err)
	}
	del := corev1.PersistentVolumeReclaimDelete
	e2e.CreateClass(x.t, x.c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: chaos.DynamicClass},
		Provisioner: devcsi.DefaultName, ReclaimPolicy: &del})
}

// restart starts r again without the fault.
func (x *crashes) restart(r *chaos.Replica) {
	x.t.Helper()
	if err := r.Start(); err != nil {
		x.t.Fatal(err)
	}
}

func (x *crashes) staticVolume(name string, policy corev1.PersistentVolumeReclaimPolicy) {
	x.t.Helper()
	dir := filepath.Join(x.c.HostPath, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		x.t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "crash-" + name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: policy,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}
	if _, err := x.c.Client.CoreV1().PersistentVolumes().Create(x.t.Context(), pv, metav1.CreateOptions{}); err != nil {
		x.t.Fatal(err)
	}
}

func (x *crashes) claim(name, class string) *corev1.PersistentVolumeClaim {
	x.t.Helper()
	cl, err := x.c.Client.CoreV1().PersistentVolumeClaims(chaos.Namespace).Create(x.t.Context(), e2e.Claim(chaos.Namespace, name, "1Gi", class), metav1.CreateOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	x.book.Created(cl, class != "")
	return cl
}

func (x *crashes) delete(cl *corev1.PersistentVolumeClaim) {
	x.t.Helper()
	if err := x.c.Client.CoreV1().PersistentVolumeClaims(cl.Namespace).Delete(x.t.Context(), cl.Name, metav1.DeleteOptions{}); err != nil {
		x.t.Fatal(err)
	}
	x.book.Deleted(cl.UID, cl.Namespace+"/"+cl.Name)
}

// bound waits until the claim is Bound to volume, and volume is the only
// one naming it.
func (x *crashes) bound(cl *corev1.PersistentVolumeClaim, volume string) {
	x.t.Helper()
	e2e.Eventually(x.t, 2*time.Minute, func() string {
		got, err := x.c.Client.CoreV1().PersistentVolumeClaims(cl.Namespace).Get(x.t.Context(), cl.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if got.Status.Phase != corev1.ClaimBound || got.Spec.VolumeName != volume {
			return fmt.Sprintf("claim %s is %s on %q, want Bound to %s", cl.Name, got.Status.Phase, got.Spec.VolumeName, volume)
		}
		pvs, err := x.c.Client.CoreV1().PersistentVolumes().List(x.t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		for _, pv := range pvs.Items {
			if ref := pv.Spec.ClaimRef; ref != nil && ref.UID == cl.UID && pv.Name != volume {
				return fmt.Sprintf("volume %s names claim %s too", pv.Name, cl.Name)
			}
			if pv.Name == volume && pv.Status.Phase != corev1.VolumeBound {
				return fmt.Sprintf("volume %s is %s", volume, pv.Status.Phase)
			}
		}
		return ""
	})
}

// gone waits until the deleted dynamic claim's PV and CSI volume are gone
// and no journal record names them.
func (x *crashes) gone(cl *corev1.PersistentVolumeClaim) {
	x.t.Helper()
	name := "pvc-" + string(cl.UID)
	e2e.Eventually(x.t, chaos.GoneWithin, func() string {
		if _, err := x.c.Client.CoreV1().PersistentVolumes().Get(x.t.Context(), name, metav1.GetOptions{}); err == nil {
			return "PV " + name + " still exists"
		}
		if x.hasCSIVolume(name) {
			return "CSI volume " + name + " still exists"
		}
		return ""
	})
}

func (x *crashes) hasCSIVolume(name string) bool {
	x.t.Helper()
	vols, err := x.c.CSIVolumes()
	if err != nil {
		x.t.Fatal(err)
	}
	for _, n := range vols {
		if n == name {
			return true
		}
	}
	return false
}

// logCount is how many lines of r's log hold what.
func logCount(t testing.TB, r *chaos.Replica, what string) int {
	t.Helper()
	b, err := os.ReadFile(r.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), what)
}

// mark writes marker files into every Bound claim's volume.
func (x *crashes) mark() {
	x.t.Helper()
	if err := x.book.MarkBound(context.WithoutCancel(x.t.Context()), x.c); err != nil {
		x.t.Fatal(err)
	}
}

// dumpLogs prints the end of every process's log.
func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if len(b) > 8<<10 {
			b = b[len(b)-8<<10:]
		}
		t.Logf("---- %s (end) ----\n%s", filepath.Base(l), b)
	}
}
