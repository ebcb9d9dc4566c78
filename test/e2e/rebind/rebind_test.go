package rebind

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/test/harness/e2e"
)

const timeout = 30 * time.Second

// setUp makes a namespace, a class (with the rebind policy, none when
// policy is ""; its provisioner is nobody's, so a claim nothing fits stays
// Pending, as with kube-controller-manager and no external provisioner)
// and a free Retain volume of that class, and binds the volume to a claim
// named like a StatefulSet's, which it then deletes: the volume is
// Released. It returns the namespace, the volume and the deleted claim's
// UID.
func setUp(t *testing.T, policy string) (string, string, types.UID) {
	t.Helper()
	c := cluster.client
	ns := e2e.Namespace(t, c)
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns}, Provisioner: "example.com/nobody"}
	if policy != "" {
		sc.Annotations = map[string]string{binder.AnnRebindReleased: policy}
	}
	e2e.CreateClass(t, c, sc)
	pv := e2e.Volume(ns+"-pv", "1Gi", ns)
	if _, err := c.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	claim := createClaim(t, ns)
	if b := e2e.ClaimPhase(t, c, ns, "data-web-0", corev1.ClaimBound, timeout); b.Spec.VolumeName != pv.Name {
		t.Fatalf("the claim bound %q, want %s", b.Spec.VolumeName, pv.Name)
	}
	deleteClaim(t, ns)
	v := e2e.VolumePhase(t, c, pv.Name, corev1.VolumeReleased, timeout)
	if v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != claim.UID {
		t.Fatalf("released volume's claimRef %+v, want UID %s", v.Spec.ClaimRef, claim.UID)
	}
	return ns, pv.Name, claim.UID
}

// createClaim creates claim data-web-0 of the namespace's class, as a
// StatefulSet's volumeClaimTemplate would.
func createClaim(t *testing.T, ns string) *corev1.PersistentVolumeClaim {
	t.Helper()
	created, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, "data-web-0", "1Gi", ns), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// deleteClaim deletes claim data-web-0 and waits until it is gone.
func deleteClaim(t *testing.T, ns string) {
	t.Helper()
	c := cluster.client
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), "data-web-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, timeout, func() string {
		_, err := c.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data-web-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return ""
		}
		return fmt.Sprintf("claim still there: %v", err)
	})
}

// volumeBoundTo checks that the volume is Bound, its claimRef naming the
// claim of that UID.
func volumeBoundTo(t *testing.T, name string, uid types.UID) {
	t.Helper()
	v := e2e.VolumePhase(t, cluster.client, name, corev1.VolumeBound, timeout)
	if v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != uid {
		t.Fatalf("volume %s bound to %+v, want the claim of UID %s", name, v.Spec.ClaimRef, uid)
	}
}

// The policy on the class: a StatefulSet's claim deleted by mistake and
// created again under its name gets its Retain volume back, with Events on
// both saying so.
func TestRebindRecreatedClaim(t *testing.T) {
	ns, pv, old := setUp(t, binder.RebindSameClaimName)
	again := createClaim(t, ns)
	got := e2e.ClaimPhase(t, cluster.client, ns, "data-web-0", corev1.ClaimBound, timeout)
	if got.Spec.VolumeName != pv || got.UID != again.UID {
		t.Fatalf("recreated claim %s bound %q, want %s", got.UID, got.Spec.VolumeName, pv)
	}
	if _, ok := got.Annotations[kube.AnnBindCompleted]; !ok {
		t.Error("the rebound claim has no bind-completed")
	}
	volumeBoundTo(t, pv, again.UID)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data-web-0", binder.EventVolumeRebound,
		fmt.Sprintf("Bound to Released volume %q, which last served an earlier claim of this name (UID %s)", pv, old), "", timeout)
	e2e.HasEvent(t, cluster.client, metav1.NamespaceDefault, "PersistentVolume", pv, binder.EventVolumeRebound,
		fmt.Sprintf("Released volume bound again to claim %s/data-web-0 (UID %s)", ns, again.UID), "", timeout)

	// Deleted and created again once more: rebound again.
	deleteClaim(t, ns)
	e2e.VolumePhase(t, cluster.client, pv, corev1.VolumeReleased, timeout)
	third := createClaim(t, ns)
	if b := e2e.ClaimPhase(t, cluster.client, ns, "data-web-0", corev1.ClaimBound, timeout); b.Spec.VolumeName != pv {
		t.Fatalf("third claim bound %q", b.Spec.VolumeName)
	}
	volumeBoundTo(t, pv, third.UID)
}

// The policy off (the default): exactly Kubernetes' behaviour. The
// recreated claim waits for its provisioner (Pending), the volume stays
// Released with its old claimRef.
func TestRebindOffStaysReleased(t *testing.T) {
	ns, pv, old := setUp(t, "")
	createClaim(t, ns)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data-web-0", kube.EventExternalProvisioning, "example.com/nobody", "", timeout)
	e2e.Consistently(t, 3*time.Second, func() string {
		c, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data-web-0", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if c.Status.Phase != corev1.ClaimPending || c.Spec.VolumeName != "" {
			return fmt.Sprintf("claim %s, volume %q", c.Status.Phase, c.Spec.VolumeName)
		}
		v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pv, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v.Status.Phase != corev1.VolumeReleased || v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != old {
			return fmt.Sprintf("volume %s, claimRef %+v", v.Status.Phase, v.Spec.ClaimRef)
		}
		return ""
	})
	if evs, err := e2e.Events(cluster.client, ns, "PersistentVolumeClaim", "data-web-0"); err == nil {
		for _, e := range evs {
			if strings.HasPrefix(e.Reason, "VolumeRebind") || e.Reason == binder.EventVolumeRebound {
				t.Errorf("event %s: %s with the policy off", e.Reason, e.Message)
			}
		}
	}
}

// A Retain volume whose reclaim is journaled in etcd (its policy changed
// while a Delete ran: the data may be going) is not rebound while the
// record exists; the claim is told, and gets the volume once the record
// is gone.
func TestRebindRefusedWhileReclaimJournaled(t *testing.T) {
	ns, pv, _ := setUp(t, binder.RebindSameClaimName)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: cluster.etcd, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	key := "/volplane/journal/reclaim/" + pv
	if _, err := etcd.Put(t.Context(), key, "a reclaim in flight"); err != nil {
		t.Fatal(err)
	}
	again := createClaim(t, ns)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data-web-0", binder.EventVolumeRebindRefused, "a reclaim of it is journaled", "", timeout)
	if v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pv, metav1.GetOptions{}); err != nil || v.Status.Phase != corev1.VolumeReleased {
		t.Fatalf("volume while its reclaim is journaled: %v %v", v.Status.Phase, err)
	}
	if _, err := etcd.Delete(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	// Retried with the claim's backoff.
	if b := e2e.ClaimPhase(t, cluster.client, ns, "data-web-0", corev1.ClaimBound, 2*time.Minute); b.Spec.VolumeName != pv {
		t.Fatalf("claim bound %q", b.Spec.VolumeName)
	}
	volumeBoundTo(t, pv, again.UID)
}

// The claim deleted and created again and again, quickly (the binder may
// see any of the incarnations, or none, and its writes for one that is
// gone fail on the claim read or the resourceVersion): the volume ends
// Bound to the last one and stays so.
func TestRebindQuickRecreation(t *testing.T) {
	ns, pv, _ := setUp(t, binder.RebindSameClaimName)
	c := cluster.client
	for range 3 {
		createClaim(t, ns)
		if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), "data-web-0", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e2e.Eventually(t, timeout, func() string {
			_, err := c.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data-web-0", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return ""
			}
			return "claim still there"
		})
	}
	last := createClaim(t, ns)
	e2e.Eventually(t, timeout, func() string {
		b, err := c.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data-web-0", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if b.Status.Phase == corev1.ClaimBound && b.Spec.VolumeName == pv {
			return ""
		}
		v, err := c.CoreV1().PersistentVolumes().Get(t.Context(), pv, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return fmt.Sprintf("claim %s (UID %s) %s to %q; volume %s, claimRef %+v", b.Name, b.UID, b.Status.Phase, b.Spec.VolumeName, v.Status.Phase, v.Spec.ClaimRef)
	})
	volumeBoundTo(t, pv, last.UID)
	e2e.Consistently(t, 2*time.Second, func() string {
		v, err := c.CoreV1().PersistentVolumes().Get(t.Context(), pv, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v.Status.Phase != corev1.VolumeBound || v.Spec.ClaimRef.UID != last.UID {
			return fmt.Sprintf("volume %s, claimRef %+v", v.Status.Phase, v.Spec.ClaimRef)
		}
		return ""
	})
}
