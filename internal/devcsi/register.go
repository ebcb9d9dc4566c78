package devcsi

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// RegisterNode does for a local setup without a kubelet what the kubelet's
// CSI plugin registration does on a real node: a Node named nodeID,
// labelled with the driver's topology key, and a CSINode listing the
// driver with that key. Provisioners (volplane's as external-provisioner)
// refuse to provision for a topology-aware driver no CSINode lists. It is
// idempotent.
func RegisterNode(ctx context.Context, c kubernetes.Interface, driver, nodeID string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeID,
		Labels: map[string]string{TopologyKey: nodeID, corev1.LabelHostname: nodeID}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", nodeID, err)
	}
	cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeID}, Spec: storagev1.CSINodeSpec{
		Drivers: []storagev1.CSINodeDriver{{Name: driver, NodeID: nodeID, TopologyKeys: []string{TopologyKey}}}}}
	if _, err := c.StorageV1().CSINodes().Create(ctx, cn, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register CSINode %s: %w", nodeID, err)
	}
	return nil
}
