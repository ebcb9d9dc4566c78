package provisioner

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cloning-protection finalizer goes by external-provisioner v6.3.0's
// rule only: the source is being deleted and no Pending claim of its
// namespace names it in spec.dataSource.
func TestReleaseCloneSources(t *testing.T) {
	now := metav1.Now()
	claim := func(ns, name string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
		for _, o := range opts {
			o(c)
		}
		return c
	}
	protected := func(c *corev1.PersistentVolumeClaim) {
		c.Finalizers = []string{"kubernetes.io/pvc-protection", finalizerCloneProtection}
	}
	deleting := func(c *corev1.PersistentVolumeClaim) { c.DeletionTimestamp = &now }
	pending := func(c *corev1.PersistentVolumeClaim) { c.Status.Phase = corev1.ClaimPending }
	cloneOf := func(src string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: src}
		}
	}
	for _, tc := range []struct {
		name string
		all  []*corev1.PersistentVolumeClaim
		want []string
	}{
		{"not deleted, no clone: kept", []*corev1.PersistentVolumeClaim{claim("a", "src", protected)}, nil},
		{"not deleted, clone Bound: kept", []*corev1.PersistentVolumeClaim{claim("a", "src", protected), claim("a", "copy", cloneOf("src"))}, nil},
		{"deleted, clone Bound: released", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting), claim("a", "copy", cloneOf("src"))}, []string{"a/src"}},
		{"deleted, no clone: released", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting)}, []string{"a/src"}},
		{"deleted, clone Pending: kept", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting), claim("a", "copy", cloneOf("src"), pending)}, nil},
		{"deleted, clone Pending and being deleted: kept", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting), claim("a", "copy", cloneOf("src"), pending, deleting)}, nil},
		{"deleted, Pending clone of a namesake elsewhere: released", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting), claim("b", "copy", cloneOf("src"), pending)}, []string{"a/src"}},
		{"deleted, Pending clone of another claim: released", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting), claim("a", "copy", cloneOf("other"), pending)}, []string{"a/src"}},
		{"deleted, Pending restore of a snapshot of that name: released", []*corev1.PersistentVolumeClaim{claim("a", "src", protected, deleting), claim("a", "copy", pending, func(c *corev1.PersistentVolumeClaim) {
			g := snapshotGroup
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &g, Kind: "VolumeSnapshot", Name: "src"}
		})}, []string{"a/src"}},
		{"deleted without the finalizer: nothing to do", []*corev1.PersistentVolumeClaim{claim("a", "src", deleting)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range releaseCloneSources(tc.all) {
				got = append(got, c.Namespace+"/"+c.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("released %v, want %v", got, tc.want)
			}
		})
	}
}
