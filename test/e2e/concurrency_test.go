package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConcurrentBinds creates 100 claims and 100 volumes at once: every
// claim must end Bound, each to its own volume, and every volume's claimRef
// must point back to the claim bound to it.
func TestConcurrentBinds(t *testing.T) {
	const count = 100
	n, cls := ns(t), "concurrent"
	// Create everything at once, from many goroutines, with plain client
	// calls (t.Fatal may not be called off the test goroutine).
	var wg sync.WaitGroup
	errs := make(chan error, 2*count)
	for i := range count {
		wg.Add(2)
		go func() {
			defer wg.Done()
			pv := newPV(fmt.Sprintf("cc-%03d", i), "1Gi", cls)
			if _, err := cluster.client.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			pvc := newPVC(n, fmt.Sprintf("c-%03d", i), "1Gi", cls)
			if _, err := cluster.client.CoreV1().PersistentVolumeClaims(n).Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := range count {
			_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), fmt.Sprintf("cc-%03d", i), metav1.DeleteOptions{})
		}
	})
	eventually(t, 2*time.Minute, func() string {
		list, err := cluster.client.CoreV1().PersistentVolumeClaims(n).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		bound := 0
		for _, c := range list.Items {
			if c.Status.Phase == corev1.ClaimBound {
				bound++
			}
		}
		if bound != count {
			return fmt.Sprintf("%d of %d claims Bound", bound, count)
		}
		return ""
	})
	claims, err := cluster.client.CoreV1().PersistentVolumeClaims(n).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, c := range claims.Items {
		if prev, dup := owner[c.Spec.VolumeName]; dup {
			t.Fatalf("volume %s bound to both %s and %s", c.Spec.VolumeName, prev, c.Name)
		}
		owner[c.Spec.VolumeName] = c.Name
		v := getPV(t, c.Spec.VolumeName)
		if v == nil || v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID || v.Status.Phase != corev1.VolumeBound {
			t.Fatalf("volume %s does not point back to claim %s: %+v", c.Spec.VolumeName, c.Name, v)
		}
	}
}
