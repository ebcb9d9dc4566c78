package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/services/binder"
)

// kcmUserAgent is kube-controller-manager's persistentvolume-binder
// client's: the API server names the field manager of its writes after
// the part before the first "/", "kube-controller-manager".
const kcmUserAgent = "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/0000000/persistent-volume-binder"

// writerAs is an admin client whose writes carry userAgent, hence its
// field manager.
func writerAs(t *testing.T, userAgent string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cluster.env.RESTConfig)
	cfg.UserAgent = userAgent
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// foreignBind makes the writes of kube-controller-manager's bind of claim
// ns/name to volume pv with client c: the volume's claimRef, bound-by-
// controller annotation and phase, the claim's volumeName, bind-completed
// and bound-by-controller annotations and phase, volume first or claim
// first. Each write is retried on a conflict (volplane's binder may be
// finishing what it sees half done meanwhile).
func foreignBind(t *testing.T, c kubernetes.Interface, ns, name, pv string, claimFirst bool) {
	t.Helper()
	ctx := t.Context()
	claimSide := func() error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cl, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cl.Spec.VolumeName = pv
			if cl.Annotations == nil {
				cl.Annotations = map[string]string{}
			}
			cl.Annotations[kube.AnnBindCompleted] = "yes"
			cl.Annotations[kube.AnnBoundByController] = "yes"
			if cl, err = c.CoreV1().PersistentVolumeClaims(ns).Update(ctx, cl, metav1.UpdateOptions{}); err != nil {
				return err
			}
			cl.Status.Phase = corev1.ClaimBound
			_, err = c.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
			return err
		})
	}
	volumeSide := func() error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cl, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			v, err := c.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
			if err != nil {
				return err
			}
			v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: name, UID: cl.UID, ResourceVersion: cl.ResourceVersion}
			if v.Annotations == nil {
				v.Annotations = map[string]string{}
			}
			v.Annotations[kube.AnnBoundByController] = "yes"
			if v, err = c.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{}); err != nil {
				return err
			}
			v.Status.Phase = corev1.VolumeBound
			_, err = c.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{})
			return err
		})
	}
	steps := []func() error{volumeSide, claimSide}
	if claimFirst {
		steps = []func() error{claimSide, volumeSide}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("foreign bind of %s/%s to %s: %v", ns, name, pv, err)
		}
	}
}

// foreignBinds is volplane_binder_foreign_binds_total{manager, kind}.
func foreignBinds(t *testing.T, manager, kind string) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "volplane_binder_foreign_binds_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["manager"] == manager && labels["kind"] == kind {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// noEvent checks that no event of reason is about the object.
func noEvent(t *testing.T, namespace, kind, name, reason string) string {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	list, err := cluster.client.CoreV1().Events(namespace).List(t.Context(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return err.Error()
	}
	if len(list.Items) > 0 {
		return fmt.Sprintf("%s %s %s/%s: %q", reason, kind, namespace, name, list.Items[0].Message)
	}
	return ""
}

// kube-controller-manager's binder left on is noticed, not fought in
// silence: its binds of claims and volumes volplane's binder owns bring a
// Warning Event ForeignBinder on the object, count in
// volplane_binder_foreign_binds_total and log a warning. No
// kube-controller-manager runs here: its writes are made by a client with
// its user agent, so the API server records them under its field manager,
// "kube-controller-manager", as it does for the real one. The same writes
// by another client (a user's kubectl), and volplane's own binds, are not
// reported.
func TestForeignBinderNoticed(t *testing.T) {
	n := ns(t)
	class := n + "-foreign"
	createClass(t, class, "kubernetes.io/no-provisioner", storagev1.VolumeBindingImmediate)
	// Claims whose selector no volume matches: volplane leaves them
	// Pending, so what binds them is the foreign binder alone.
	selector := func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"bound-by": "someone-else"}}
	}
	kcm, user := writerAs(t, kcmUserAgent), writerAs(t, "kubectl/v1.36.3 (linux/amd64) kubernetes/0000000")
	beforeClaims, beforeVolumes := foreignBinds(t, "kube-controller-manager", "claim"), foreignBinds(t, "kube-controller-manager", "volume")
	for _, name := range []string{"claim-first", "volume-first", "by-a-user"} {
		createPV(t, n+"-"+name, "1Gi", class)
		createPVC(t, n, name, "1Gi", class, selector)
	}
	for _, name := range []string{"claim-first", "volume-first", "by-a-user"} {
		pvcPhase(t, n, name, corev1.ClaimPending)
	}
	// volplane's own bind, in the same namespace.
	createPV(t, n+"-own", "1Gi", class)
	createPVC(t, n, "own", "1Gi", class)
	pvcPhase(t, n, "own", corev1.ClaimBound)

	// The first object a binder writes is the one it owns alone until
	// volplane finishes the other half: the claim in one bind, the volume
	// in the other.
	foreignBind(t, kcm, n, "claim-first", n+"-claim-first", true)
	foreignBind(t, kcm, n, "volume-first", n+"-volume-first", false)
	foreignBind(t, user, n, "by-a-user", n+"-by-a-user", true)

	hasForeignEvent := func(namespace, kind, name string) {
		t.Helper()
		sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": binder.ReasonForeignBinder}.AsSelector().String()
		eventually(t, 30*time.Second, func() string {
			list, err := cluster.client.CoreV1().Events(namespace).List(t.Context(), metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				return err.Error()
			}
			for _, e := range list.Items {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "kube-controller-manager also binds volumes") &&
					strings.Contains(e.Message, "--controllers=*,-persistentvolume-binder-controller") && e.Source.Component == "persistentvolume-controller" {
					return ""
				}
			}
			return fmt.Sprintf("no ForeignBinder event on %s %s/%s: %+v", kind, namespace, name, list.Items)
		})
	}
	hasForeignEvent(n, "PersistentVolumeClaim", "claim-first")
	// Events about a volume (cluster-scoped) are in "default".
	hasForeignEvent(metav1.NamespaceDefault, "PersistentVolume", n+"-volume-first")
	eventually(t, 30*time.Second, func() string {
		c, v := foreignBinds(t, "kube-controller-manager", "claim")-beforeClaims, foreignBinds(t, "kube-controller-manager", "volume")-beforeVolumes
		if c < 1 || v < 1 {
			return fmt.Sprintf("volplane_binder_foreign_binds_total: +%v claims, +%v volumes", c, v)
		}
		return ""
	})
	eventually(t, 30*time.Second, func() string {
		b, err := os.ReadFile(cluster.logs)
		if err != nil {
			return err.Error()
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "WARN") && strings.Contains(l, "another binder is active") && strings.Contains(l, "kube-controller-manager") {
				return ""
			}
		}
		return "no warning about kube-controller-manager in the binder's log"
	})
	// Every claim ends Bound, as it was bound: the foreign binds stand.
	for _, name := range []string{"claim-first", "volume-first", "by-a-user"} {
		if c := pvcPhase(t, n, name, corev1.ClaimBound); c.Spec.VolumeName != n+"-"+name {
			t.Errorf("claim %s bound to %q, want %s-%s", name, c.Spec.VolumeName, n, name)
		}
	}
	// A user's writes and volplane's own binds are nobody's foreign binds.
	consistently(t, 5*time.Second, func() string {
		for _, o := range []struct{ ns, kind, name string }{
			{n, "PersistentVolumeClaim", "by-a-user"}, {metav1.NamespaceDefault, "PersistentVolume", n + "-by-a-user"},
			{n, "PersistentVolumeClaim", "own"}, {metav1.NamespaceDefault, "PersistentVolume", n + "-own"},
		} {
			if why := noEvent(t, o.ns, o.kind, o.name, binder.ReasonForeignBinder); why != "" {
				return why
			}
		}
		return ""
	})
}
