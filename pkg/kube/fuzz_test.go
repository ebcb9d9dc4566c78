package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The decoders of request bytes never panic, whatever they are given, and
// what they decode encodes again.
func FuzzDecode(f *testing.F) {
	pv, _ := EncodeProto(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", UID: "u"},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h"}}}})
	pvc, _ := EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}})
	sc, _ := EncodeProto(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Parameters: map[string]string{"a": "b"}})
	for _, b := range [][]byte{pv, pvc, sc, nil, {0xff}, {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, pv[:len(pv)/2]} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := DecodeVolume(b); err == nil {
			if _, err := EncodeProto(v); err != nil {
				t.Fatalf("a decoded volume does not encode: %v", err)
			}
		}
		if c, err := DecodeClaim(b); err == nil {
			if _, err := EncodeProto(c); err != nil {
				t.Fatalf("a decoded claim does not encode: %v", err)
			}
		}
		if s, err := DecodeStorageClass(b); err == nil {
			if _, err := EncodeProto(s); err != nil {
				t.Fatalf("a decoded class does not encode: %v", err)
			}
		}
	})
}
