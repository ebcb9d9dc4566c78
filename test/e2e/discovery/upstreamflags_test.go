package discovery

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// TestSidecarFlagsApplyToItsDriver: a sidecar run with
// --volume-name-uuid-length=8, --immediate-topology=false,
// --controller-publish-readonly and VolumeAttributesClass=false leaves its
// driver ready (they used to make it not ready), and its claims' PVs are
// named, and marked read-only, by its flags, not the provisioner's.
func TestSidecarFlagsApplyToItsDriver(t *testing.T) {
	const driver = "flags.csi.example.com"
	ns := e2e.Namespace(t, cluster.client)
	port, hash := sidecarStandIn(t, driver)
	sidecarPod(t, ns, "ctrl-0", "flags-csi", true)
	off := false
	registerWith(t, ns, "ctrl-0", driver, port, hash, sidecar.Settings{VolumeNamePrefix: "pvc", VolumeNameUUIDLength: 8,
		ImmediateTopology: &off, ControllerPublishReadOnly: true, FeatureGates: map[string]bool{sidecar.GateVolumeAttributesClass: false}})
	e2e.Eventually(t, 30*time.Second, func() string {
		if d := driverInfo(t, driver); d == nil || !d.GetReady() {
			return fmt.Sprintf("driver %v, want ready", d)
		}
		return ""
	})
	del := corev1.PersistentVolumeReclaimDelete
	cls := ns + "-rox"
	e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: cls}, Provisioner: driver, ReclaimPolicy: &del})
	claim, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, "data", "1Mi", cls, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}
		gold := "gold"
		c.Spec.VolumeAttributesClassName = &gold
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resp := provision(t, claim)
	want := "pvc-" + strings.ReplaceAll(string(claim.UID), "-", "")[:8]
	if resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED || resp.GetVolumeName() != want {
		t.Fatalf("Provision through the sidecar: %v, want FINISHED, volume %s", resp, want)
	}
	pv, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), want, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !pv.Spec.CSI.ReadOnly || pv.Spec.VolumeAttributesClassName != nil {
		t.Errorf("PV %s: readOnly %v, volumeAttributesClassName %v; want read-only, no class", pv.Name, pv.Spec.CSI.ReadOnly, pv.Spec.VolumeAttributesClassName)
	}
}
