package dynamic

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// A claim whose dataSourceRef names a volume populator's kind is its
// populator's, as external-provisioner v6.3.0 has it (prepareProvision's
// IgnoredError): two Normal Provisioning events, then nothing: no
// ProvisioningFailed, no CreateVolume, no retry.
func TestPopulatorClaimIsLeftToItsPopulator(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	group := "hello.example.com"
	c := createClaim(t, ns, "populated", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "Hello", Name: "greeting"}
	})
	const assuming = "Assuming an external populator will provision the volume"
	// From external-provisioner's own recorder, as upstream's (not the
	// library's "<driver>_<host>_<uuid>").
	hasEventFrom(t, c, kube.EventProvisioning, assuming, "external-provisioner")
	hasEventFrom(t, c, kube.EventProvisioning, fmt.Sprintf("External provisioner is provisioning volume for claim %q", ns+"/populated"), driverName)
	// The binder's first retry would come after a second, and the next
	// two after that.
	e2e.Consistently(t, 4*time.Second, func() string {
		if n := e2e.EventCount(t, cluster.client, ns, c.Name, kube.EventProvisioning, assuming); n != 1 {
			return fmt.Sprintf("%d %q events, want 1: the claim was tried again", n, assuming)
		}
		evs, err := e2e.Events(cluster.client, ns, "PersistentVolumeClaim", c.Name)
		if err != nil {
			return err.Error()
		}
		for _, e := range evs {
			if e.Reason == kube.EventProvisioningFailed {
				return "ProvisioningFailed: " + e.Message
			}
		}
		if reqs := cluster.requests.createsFor(pvName(c)); len(reqs) != 0 {
			return fmt.Sprintf("CreateVolume called %d times", len(reqs))
		}
		return ""
	})
	got, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
		t.Errorf("claim %s, volume %q; want Pending with none", got.Status.Phase, got.Spec.VolumeName)
	}
}
