package cluster

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// claimForDeadNode makes, in ns, a claim of the WaitForFirstConsumer class
// whose selected node is the dead node, as the scheduler leaves a claim it
// sent there just before the node died, and waits until the claim says why
// it waits: a ProvisioningFailed Event that names the node (no sidecar of
// the node-local driver is registered there). It returns the claim's name
// and that Event.
func claimForDeadNode(t *testing.T, ns, node string, since time.Time) (string, string) {
	const name = "selected-dead-node" // its name must not hold the node's, which the Event must
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kube.AnnSelectedNode: node}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptrTo(classWFFC),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Mi")}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var events string
	waitFor(t, 2*time.Minute, func() string {
		events = eventsSince(t, ns, name, since)
		for line := range strings.SplitSeq(events, "\n") {
			if strings.Contains(line, "ProvisioningFailed") && strings.Contains(line, node) {
				events = line
				return ""
			}
		}
		return "no ProvisioningFailed Event of claim " + name + " names node " + node + ": " + events
	})
	return name, events
}
