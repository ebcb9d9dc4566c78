package provisioner

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// secretRefs resolves every secret the class names (provisioner secrets
// and those the PV refers to), in external-provisioner's order: the first
// error is the one it reports.
func (p *provisioner) secretRefs(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim, pvName string) (map[string]*secretRef, error) {
	out := map[string]*secretRef{}
	for _, s := range secretParams {
		r, err := resolveSecretRef(class, s, pvName, claim)
		if err != nil {
			return nil, err
		}
		if r != nil {
			out[s.kind] = r
		}
	}
	return out, nil
}

// secrets reads a Secret's data for a CSI call; nil ref means none.
func (p *provisioner) secrets(ctx context.Context, ref *secretRef) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	s, err := p.client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("error getting secret %s in namespace %s: %w", ref.Name, ref.Namespace, err) // upstream's words
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}

// deletionSecret is the secret DeleteVolume needs, as external-provisioner
// finds it (handleSecretsForDeletion): the one the PV's two deletion-secret
// annotations name, none when they are empty, and only when the PV has no
// such annotations (made before they existed) the one its class names now.
func (p *provisioner) deletionSecret(ctx context.Context, pv *corev1.PersistentVolume) *secretRef {
	n, hasName := pv.Annotations[annDeletionSecretName]
	ns, hasNamespace := pv.Annotations[annDeletionSecretNamespace]
	if hasName && hasNamespace {
		if n != "" && ns != "" {
			return &secretRef{Namespace: ns, Name: n}
		}
		return nil
	}
	if pv.Spec.StorageClassName == "" {
		return nil
	}
	class, err := p.client.StorageV1().StorageClasses().Get(ctx, pv.Spec.StorageClassName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var claim *corev1.PersistentVolumeClaim
	if ref := pv.Spec.ClaimRef; ref != nil {
		claim = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	}
	// Only the provisioner's secret, as upstream: a template of another
	// secret that no longer resolves does not matter here.
	ref, err := resolveSecretRef(class, secretParams[0], pv.Name, claim)
	if err != nil {
		return nil
	}
	return ref
}
