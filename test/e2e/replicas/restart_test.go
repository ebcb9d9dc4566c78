package replicas

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The watcher restarts (a new epoch: its history is gone) while a claim is
// deleted: the binder gets a full list, learns the claim is gone (its
// volume becomes Released) and goes on binding new claims.
func TestBinderSurvivesAWatcherRestart(t *testing.T) {
	b := startBinder(t, "binder-restart")
	ns := newNamespace(t, "restart")
	createPairs(t, ns, "before", 20)
	allBound(t, ns, 20)
	gone, err := client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "before-claim-000", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if err := stopWatcher(); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := startWatcher(); err != nil {
		t.Fatal(err)
	}

	eventually(t, time.Minute, func() string {
		v, err := client.CoreV1().PersistentVolumes().Get(context.Background(), gone.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v.Status.Phase != corev1.VolumeReleased {
			return fmt.Sprintf("volume %s of the claim deleted during the restart is %s, want Released", v.Name, v.Status.Phase)
		}
		return ""
	})
	createPairs(t, ns, "after", 20)
	allBound(t, ns, 39)
	if st := b.status(t); !st.Synced {
		t.Fatalf("binder status after the restart: %v", st)
	}
}
