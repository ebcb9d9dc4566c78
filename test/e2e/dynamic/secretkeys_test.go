package dynamic

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// Every secret key external-provisioner v6.3.0 takes, as it applies them
// (getSecretReference, Provision): each operation's own keys with their
// templates, the deprecated unprefixed keys (passed to the driver too),
// the controller-modify secret in the PV's annotations for
// external-resizer, and the deprecated csi.storage.k8s.io/secret-name and
// -namespace for every operation that names none. A template that does
// not resolve fails in upstream's words.
func TestSecretKeysAsExternalProvisionerDoes(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	for _, name := range []string{"prov", "fallback"} {
		if _, err := cluster.client.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: map[string]string{"password": e2e.Secret("keys-Secret-" + name)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const p = "csi.storage.k8s.io/"
	every := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			p + "provisioner-secret-name": "prov", p + "provisioner-secret-namespace": "${pvc.namespace}",
			"csiControllerPublishSecretName": "cp-${pvc.name}", "csiControllerPublishSecretNamespace": "${pvc.namespace}",
			p + "node-stage-secret-name": "${pvc.annotations['example.com/stage']}", p + "node-stage-secret-namespace": "${pvc.namespace}",
			p + "controller-expand-secret-name": "ce-${pv.name}", p + "controller-expand-secret-namespace": "${pvc.namespace}",
			p + "controller-modify-secret-name": "cm", p + "controller-modify-secret-namespace": "${pvc.namespace}",
			// node-publish and node-expand fall back to these.
			p + "secret-name": "fallback", p + "secret-namespace": "${pvc.namespace}",
		}
	})
	c := createClaim(t, ns, "every", "1Gi", every.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Annotations = map[string]string{"example.com/stage": "staged"}
	})
	_, pv := bound(t, ns, c.Name)
	src := pv.Spec.CSI
	for _, r := range []struct {
		op   string
		got  *corev1.SecretReference
		want string
	}{
		{"controller-publish", src.ControllerPublishSecretRef, "cp-every"}, {"node-stage", src.NodeStageSecretRef, "staged"},
		{"node-publish", src.NodePublishSecretRef, "fallback"}, {"controller-expand", src.ControllerExpandSecretRef, "ce-" + pv.Name},
		{"node-expand", src.NodeExpandSecretRef, "fallback"},
	} {
		if r.got == nil || r.got.Namespace != ns || r.got.Name != r.want {
			t.Errorf("%s secret ref %v, want %s/%s", r.op, r.got, ns, r.want)
		}
	}
	for k, want := range map[string]string{
		"volume.kubernetes.io/provisioner-deletion-secret-name": "prov", "volume.kubernetes.io/provisioner-deletion-secret-namespace": ns,
		"volume.kubernetes.io/controller-modify-secret-name": "cm", "volume.kubernetes.io/controller-modify-secret-namespace": ns,
	} {
		if pv.Annotations[k] != want {
			t.Errorf("PV annotation %s=%q, want %q", k, pv.Annotations[k], want)
		}
	}
	req := cluster.requests.createsFor(pv.Name)[0]
	if req.GetSecrets()["password"] != e2e.Secret("keys-Secret-prov") {
		t.Error("CreateVolume did not get the provisioner secret")
	}
	if req.GetParameters()["csiControllerPublishSecretName"] != "cp-${pvc.name}" {
		t.Errorf("parameters %v: upstream passes the deprecated unprefixed keys to the driver", req.GetParameters())
	}

	// Only the deprecated default: it is every operation's, the
	// provisioner's included.
	fallback := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{p + "secret-name": "fallback", p + "secret-namespace": "${pvc.namespace}"}
	})
	f := createClaim(t, ns, "fallback", "1Gi", fallback.Name)
	_, fpv := bound(t, ns, f.Name)
	if cluster.requests.createsFor(fpv.Name)[0].GetSecrets()["password"] != e2e.Secret("keys-Secret-fallback") {
		t.Error("CreateVolume did not get the deprecated default secret")
	}
	if fpv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"] != "fallback" || fpv.Annotations["volume.kubernetes.io/controller-modify-secret-name"] != "fallback" ||
		fpv.Spec.CSI.NodePublishSecretRef == nil || fpv.Spec.CSI.NodePublishSecretRef.Name != "fallback" {
		t.Errorf("PV annotations %v, node-publish %v: want the default secret everywhere", fpv.Annotations, fpv.Spec.CSI.NodePublishSecretRef)
	}

	bad := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{p + "node-stage-secret-name": "${pvc.annotations['nope']}", p + "node-stage-secret-namespace": "x"}
	})
	b := createClaim(t, ns, "bad", "1Gi", bad.Name)
	hasEventFrom(t, b, kube.EventProvisioningFailed, `error resolving value "${pvc.annotations['nope']}": invalid tokens: ["pvc.annotations['nope']"]`, driverName)
}
