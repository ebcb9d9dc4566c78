package reclaimer

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func claimNaming(ns, name, volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
}

// The index says which claims to read; the API server says what they are.
func TestClaimsNamingReadsTheIndexedClaimsFromTheAPI(t *testing.T) {
	api := fake.NewClientset(
		claimNaming("a", "wants-pv1", "pv1"),
		claimNaming("b", "moved", "pv2"), // the cache still says pv1
		claimNaming("c", "other", "pv3"),
	)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byVolumeName: indexByVolumeName})
	for _, c := range []*corev1.PersistentVolumeClaim{
		claimNaming("a", "wants-pv1", "pv1"),
		claimNaming("b", "moved", "pv1"),
		claimNaming("d", "deleted", "pv1"), // gone from the API
		claimNaming("c", "other", "pv3"),
	} {
		if err := idx.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	for name, k := range map[string]kubeCluster{"indexed": {c: api, claims: idx}, "listed": {c: api}} {
		t.Run(name, func(t *testing.T) {
			got, err := k.ClaimsNaming(t.Context(), "pv1")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Namespace != "a" || got[0].Name != "wants-pv1" {
				t.Fatalf("claims naming pv1: %v", got)
			}
		})
	}
}
