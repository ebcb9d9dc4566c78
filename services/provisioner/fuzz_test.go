package provisioner

import (
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Whatever a ProvisionRequest holds, validateProvision answers without
// panicking, and what it accepts names a valid claim that the objects sent
// (if any) agree with.
func FuzzValidateProvision(f *testing.F) {
	fast := "fast"
	claim, _ := kube.EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "u1", ResourceVersion: "3"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast}})
	class, _ := kube.EncodeProto(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "p",
		Parameters: map[string]string{paramProvisionerSecretName: "s", paramProvisionerSecretNamespace: "kube-system"}})
	f.Add("ns", "data", "u1", claim, class)
	f.Add("ns", "data", "", claim, []byte(nil))
	f.Add("", "", "", []byte(nil), []byte(nil))
	f.Add("NS", "../x", "\xff", []byte{0xff, 0x01}, []byte{0x0a, 0x80})
	f.Add("ns", strings.Repeat("a", 300), "u", claim[:len(claim)/2], class[:3])
	f.Fuzz(func(t *testing.T, ns, name, uid string, claimBytes, classBytes []byte) {
		req := &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: name, ClaimUid: uid, Claim: claimBytes, StorageClass: classBytes}
		c, _, err := validateProvision(req)
		if err != nil {
			return
		}
		if ns == "" || name == "" || !utf8.ValidString(ns+name+uid) || len(name) > 253 || len(ns) > 63 {
			t.Fatalf("accepted %q/%q uid %q", ns, name, uid)
		}
		if c != nil && (c.Namespace != ns || c.Name != name || string(c.UID) != uid) {
			t.Fatalf("accepted a claim of %s/%s (%s) for %s/%s (%s)", c.Namespace, c.Name, c.UID, ns, name, uid)
		}
	})
}

func FuzzValidateDeleteVolume(f *testing.F) {
	pv, _ := kube.EncodeProto(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1", UID: "u"}})
	f.Add("pvc-1", pv)
	f.Add("pvc-1", []byte(nil))
	f.Add("other", pv)
	f.Add("", []byte{0xff})
	f.Add("a/../b", pv[:4])
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		v, err := validateDeleteVolume(&provisionerv1.DeleteVolumeRequest{VolumeName: name, Volume: b})
		if err != nil {
			return
		}
		if name == "" || strings.ContainsAny(name, "/ ") || !utf8.ValidString(name) {
			t.Fatalf("accepted volume_name %q", name)
		}
		if v != nil && v.Name != name {
			t.Fatalf("accepted a volume named %q for %q", v.Name, name)
		}
	})
}
