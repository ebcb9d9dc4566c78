package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// warnings counts the services' warning lines that mention name.
func warnings(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(cluster.logs)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for l := range strings.Lines(string(b)) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, name) {
			n++
		}
	}
	return n
}

// The in-tree case kube-controller-manager is checked on too
// (test/harness/e2e, `make compare-kcm`): a volume the host-path plugin
// provisioned, policy Delete, whose claim is bound to another volume, ends
// Failed with kube-controller-manager's VolumeFailedDelete, nothing
// deleted; and no service warns about it again and again.
func TestHostPathVolumeOfAClaimBoundElsewhereFails(t *testing.T) {
	n := ns(t)
	pv := e2e.HostPathVolumeOfAClaimBoundElsewhere(t, cluster.client, n)
	r := waitReclaim(t, reclaimerClient(t, cluster.reclaimerAddr), pv, reclaimerv1.State_STATE_FAILED)
	if r.Method != reclaimerv1.Method_METHOD_UNSUPPORTED || !strings.Contains(r.Message, "host_path deleter only supports") {
		t.Errorf("record %v", r)
	}
	if w := warnings(t, pv); w != 0 {
		t.Errorf("%d warnings about %s in the services' log", w, pv)
	}
}

// A hand-off the reclaimer refuses (a claim recreated under the released
// claim's name asks for the volume) is not retried in a loop: no service
// warns about it, the volume stays Released with its data, and the
// claim's deletion, not a timer (this binder resyncs every 10 minutes),
// hands the volume over again.
func TestARefusedHandOffWaitsForTheClaim(t *testing.T) {
	n, cls, dir := ns(t), "handoff-refused", t.TempDir()
	vol := filepath.Join(dir, "vol")
	writeTree(t, vol, filepath.Join(dir, "outside"))
	pv := n + "-pv"
	createPVC(t, n, "data", "1Gi", cls, wantVolume(pv))
	createPV(t, pv, "1Gi", cls, withHostPath(vol), withPolicy(corev1.PersistentVolumeReclaimRecycle),
		withClaimRef(n, "data", "uid-of-the-deleted-claim"), withAnnotation(kube.AnnBoundByController, "yes"))
	pvPhase(t, pv, corev1.VolumeReleased)
	client := reclaimerClient(t, cluster.reclaimerAddr)
	eventually(t, 30*time.Second, func() string {
		resp, err := client.GetReclaim(t.Context(), &reclaimerv1.GetReclaimRequest{VolumeName: pv})
		if err != nil || !strings.Contains(resp.Reclaim.Message, "asks for this volume") {
			return "not refused yet"
		}
		return ""
	})
	consistently(t, 3*time.Second, func() string {
		if v := getPV(t, pv); v.Status.Phase != corev1.VolumeReleased {
			return "the volume changed: " + string(v.Status.Phase)
		}
		if w := warnings(t, pv); w != 0 {
			return "warnings about the refused volume in the services' log"
		}
		return ""
	})
	if got := entries(t, vol); len(got) == 0 {
		t.Fatal("scrubbed while a claim asked for the volume")
	}

	if err := cluster.client.CoreV1().PersistentVolumeClaims(n).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pvPhase(t, pv, corev1.VolumeAvailable)
	if got := entries(t, vol); len(got) != 0 {
		t.Errorf("left after the scrub: %q", got)
	}
}
