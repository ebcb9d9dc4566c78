package dynamic

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// What external-provisioner v6.3.0 sends and writes where volplane once
// differed (createVolumeOperation / Provision in its pkg/controller): no
// limit_bytes, whatever limit the claim sets; no fsType unless the class
// asks for one; the csiProvisionerIdentity volume attribute; both
// deletion-secret annotations, empty when the class names no secret.
func TestProvisionAsExternalProvisionerDoes(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	c := createClaim(t, ns, "data", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	})
	_, pv := bound(t, ns, "data")
	req := cluster.requests.createsFor(pv.Name)[0]
	if r := req.GetCapacityRange(); r.GetRequiredBytes() != 1<<30 || r.GetLimitBytes() != 0 {
		t.Errorf("capacity range %v, want the request and no limit", r)
	}
	for _, cap := range req.GetVolumeCapabilities() {
		if fs := cap.GetMount().GetFsType(); fs != "" {
			t.Errorf("fsType %q sent for a class that names none", fs)
		}
	}
	if pv.Spec.CSI.FSType != "" {
		t.Errorf("PV fsType %q, want empty", pv.Spec.CSI.FSType)
	}
	id := pv.Spec.CSI.VolumeAttributes["storage.kubernetes.io/csiProvisionerIdentity"]
	if parts := strings.SplitN(id, "-", 3); len(parts) != 3 || parts[2] != driverName {
		t.Errorf("csiProvisionerIdentity %q, want <ms>-<n>-%s", id, driverName)
	}
	for _, k := range []string{"volume.kubernetes.io/provisioner-deletion-secret-name", "volume.kubernetes.io/provisioner-deletion-secret-namespace"} {
		if v, ok := pv.Annotations[k]; !ok || v != "" {
			t.Errorf("annotation %s = %q (present %v), want present and empty", k, v, ok)
		}
	}
	// Events come from "<driver>_<host>_<uuid>", as external-provisioner's.
	e2e.Eventually(t, 30*time.Second, func() string {
		evs, err := e2e.Events(cluster.client, ns, "PersistentVolumeClaim", c.Name)
		if err != nil {
			return err.Error()
		}
		for _, e := range evs {
			if e.Reason == kube.EventProvisioningSucceeded {
				parts := strings.Split(e.Source.Component, "_")
				if len(parts) != 3 || parts[0] != driverName || parts[1] == "" || len(parts[2]) != 36 {
					return fmt.Sprintf("event source %q, want %s_<host>_<uuid>", e.Source.Component, driverName)
				}
				return ""
			}
		}
		return "no ProvisioningSucceeded event"
	})
}

// A deletion secret that can no longer be read (deleted with its
// namespace, say): external-provisioner deletes the volume without it;
// the volume must not stay Released forever.
func TestDeletionWithoutAReadableSecret(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	if _, err := cluster.client.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ns}, StringData: map[string]string{"password": e2e.Secret("del-Secret-4a1")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":      "creds",
			"csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
		}
	})
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	_, pv := bound(t, ns, "data")
	id := pv.Spec.CSI.VolumeHandle
	if err := cluster.client.CoreV1().Secrets(ns).Delete(t.Context(), "creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleteClaim(t, c)
	e2e.Eventually(t, time.Minute, func() string {
		if _, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{}); err == nil {
			return "the PV is still there"
		}
		if driverVolumes(t)[id] {
			return "the CSI volume is still there"
		}
		return ""
	})
	dels := cluster.requests.deletesOf(id)
	if len(dels) == 0 || len(dels[len(dels)-1].GetSecrets()) != 0 {
		t.Errorf("DeleteVolume calls %v, want one without secrets", dels)
	}
}

// The scheduler's node is gone (deleted after it chose it): as
// external-provisioner, the claim's selected-node annotation is removed
// so that the scheduler chooses a live node; nothing is provisioned.
func TestASelectedNodeThatIsGoneAsksTheSchedulerAgain(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, waitForFirstConsumer)
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	selectNode(t, c, "node-deleted")
	hasEventFrom(t, c, kube.EventProvisioningFailed, `"node-deleted" not found`, driverName)
	e2e.Eventually(t, 30*time.Second, func() string {
		cur, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v, ok := cur.Annotations[kube.AnnSelectedNode]; ok {
			return "selected-node is still " + v
		}
		return ""
	})
	if n := len(cluster.requests.createsFor(pvName(c))); n != 0 {
		t.Errorf("%d CreateVolume calls for a node that is gone", n)
	}
}

// ProvisioningFailed says what the driver said, as external-provisioner's
// controller words it: the error alone, and InvalidArgument with its
// "infeasible" note.
func TestProvisioningFailedMessages(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		want string
	}{
		{codes.ResourceExhausted, "rpc error: code = ResourceExhausted desc = out of space"},
		{codes.InvalidArgument, "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = no such tier"},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			ns := e2e.Namespace(t, cluster.client)
			sc := class(t)
			f := faults(t)
			f.FailNext("CreateVolume", 1, tc.code, strings.TrimPrefix(tc.want[strings.Index(tc.want, "desc = "):], "desc = "))
			c := createClaim(t, ns, "data", "1Gi", sc.Name)
			e2e.Eventually(t, 30*time.Second, func() string {
				evs, err := e2e.Events(cluster.client, ns, "PersistentVolumeClaim", "data")
				if err != nil {
					return err.Error()
				}
				var seen []string
				for _, e := range evs {
					if e.Reason == kube.EventProvisioningFailed {
						if e.Message == tc.want {
							return ""
						}
						seen = append(seen, e.Message)
					}
				}
				return fmt.Sprintf("ProvisioningFailed messages %q, want %q", seen, tc.want)
			})
			if tc.code != codes.InvalidArgument { // retried after --retry-interval-max: infeasible_test.go
				bound(t, ns, c.Name)
			}
		})
	}
}

// While a clone is made its source claim carries external-provisioner's
// cloning-protection finalizer, and keeps it, as v6.3.0's
// CloningProtectionController does, until the source is being deleted and
// no Pending claim clones it: a finished clone does not remove it, a
// Pending clone holds a deleted source, and the source goes once that
// clone is gone. A clone of another volume mode is refused before the
// driver is asked, with upstream's message.
func TestCloneProtectsItsSource(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	bound(t, ns, "source")
	source := func() (*corev1.PersistentVolumeClaim, error) {
		return cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "source", metav1.GetOptions{})
	}
	protected := func() (bool, error) {
		src, err := source()
		if err != nil {
			return false, err
		}
		return slices.Contains(src.Finalizers, finalizerCloneProtection), nil
	}
	// The driver is slow: the clone stays Pending for a while.
	f := faults(t)
	f.FailNext("CreateVolume", 3, codes.Unavailable, "copying")
	createClaim(t, ns, "copy", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}
	})
	e2e.Eventually(t, 30*time.Second, func() string {
		if ok, err := protected(); err != nil || !ok {
			return fmt.Sprintf("the source is not protected while it is cloned (%v)", err)
		}
		return ""
	})
	bound(t, ns, "copy")
	cloneSweepPassed(t, ns, "after-bound")
	if ok, err := protected(); err != nil || !ok {
		t.Fatalf("the source lost its cloning protection when its clone was Bound, while it is not being deleted (%v)", err)
	}

	block := corev1.PersistentVolumeBlock
	bad := createClaim(t, ns, "block-copy", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.VolumeMode = &block
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}
	})
	hasEventFrom(t, bad, kube.EventProvisioningFailed,
		"the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block", driverName)
	if n := len(cluster.requests.createsFor(pvName(bad))); n != 0 {
		t.Errorf("%d CreateVolume calls for a clone of another volume mode", n)
	}
	startDeleting(t, ns, bad.Name)

	// A clone that stays Pending (its class waits for a consumer that
	// never comes) holds the source once it is deleted.
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	late := class(t, func(c *storagev1.StorageClass) { c.VolumeBindingMode = &wffc })
	createClaim(t, ns, "pending-copy", "1Gi", late.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}
	})
	startDeleting(t, ns, "source")
	cloneSweepPassed(t, ns, "while-pending")
	if src, err := source(); err != nil || src.DeletionTimestamp == nil || !slices.Contains(src.Finalizers, finalizerCloneProtection) {
		t.Fatalf("a deleted source with a Pending clone: %v (error %v), want Terminating with its cloning protection", src, err)
	}
	startDeleting(t, ns, "pending-copy")
	e2e.Eventually(t, 30*time.Second, func() string {
		if src, err := source(); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the deleted source with no clone in progress is still there: %v (error %v)", src.GetFinalizers(), err)
		}
		return ""
	})
}

const finalizerCloneProtection = "provisioner.storage.kubernetes.io/cloning-protection"

// startDeleting deletes a claim without waiting for it to go.
func startDeleting(t *testing.T, ns, name string) {
	t.Helper()
	if err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim %s/%s: %v", ns, name, err)
	}
}

// cloneSweepPassed returns once the provisioner has swept the
// cloning-protection finalizers after every change made so far: a claim
// of no class that carries the finalizer is deleted, and the sweep that
// releases it (it clones nothing) saw every earlier change of the
// namespace's claims (one watch, in order).
func cloneSweepPassed(t *testing.T, ns, name string) {
	t.Helper()
	marker := "sweep-" + name
	none := ""
	createClaim(t, ns, marker, "1Gi", "", func(c *corev1.PersistentVolumeClaim) {
		c.Spec.StorageClassName = &none
		c.Finalizers = []string{finalizerCloneProtection}
	})
	startDeleting(t, ns, marker)
	e2e.Eventually(t, 30*time.Second, func() string {
		if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), marker, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim %s is still there (%v): no sweep of cloning protection", marker, err)
		}
		return ""
	})
}
