package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
)

// In a real cluster the pvc-protection finalizer keeps a deleted claim
// that a pod still uses: the claim exists (Terminating) and its volume
// must stay Bound. Only when the finalizer goes and the claim is gone is
// the volume Released.
func TestTerminatingClaimKeepsItsVolume(t *testing.T) {
	n, cls := ns(t), "protection"
	createPV(t, n+"-pv", "1Gi", cls)
	createPVC(t, n, "data", "1Gi", cls, func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = []string{kube.FinalizerPVCProtection}
	})
	pvcPhase(t, n, "data", corev1.ClaimBound)
	if err := cluster.client.CoreV1().PersistentVolumeClaims(n).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if c := getPVC(t, n, "data"); c.DeletionTimestamp == nil {
		t.Fatal("the claim has no deletionTimestamp: the finalizer did not hold it")
	}
	consistently(t, 2*time.Second, func() string {
		if v := getPV(t, n+"-pv"); v.Status.Phase != corev1.VolumeBound {
			return "the volume of a Terminating claim is " + string(v.Status.Phase) + ", want Bound"
		}
		return ""
	})
	// What the protection controller does once no pod uses the claim.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": nil}})
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(n).Patch(context.Background(), "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pvPhase(t, n+"-pv", corev1.VolumeReleased)
}
