package kube_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// Objects a caller sends are decoded only once every quantity in them
// passed ParseQuantity's bounds: each quantity of a claim and of a volume,
// made absurd in the wire format, is refused, named, in no time.
func TestDecodeChecksEveryQuantity(t *testing.T) {
	q := resource.MustParse("12345") // the same length as the absurd text
	rl := corev1.ResourceList{corev1.ResourceStorage: q}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"},
		Spec:   corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: rl, Limits: rl}},
		Status: corev1.PersistentVolumeClaimStatus{Capacity: rl, AllocatedResources: rl}}
	volume := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "v"}, Spec: corev1.PersistentVolumeSpec{Capacity: rl}}
	for _, tc := range []struct {
		name   string
		obj    kube.Object
		decode func([]byte) error
		paths  []string
	}{
		{"claim", claim, func(b []byte) error { _, err := kube.DecodeClaim(b); return err },
			[]string{"spec.resources.limits[storage]", "spec.resources.requests[storage]", "status.allocatedResources[storage]", "status.capacity[storage]"}},
		{"volume", volume, func(b []byte) error { _, err := kube.DecodeVolume(b); return err },
			[]string{"spec.capacity[storage]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := kube.EncodeProto(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.decode(b); err != nil {
				t.Fatalf("the object itself: %v", err)
			}
			good := []byte("\x0a\x0512345")
			var got []string
			for i := 0; ; {
				at := bytes.Index(b[i:], good)
				if at < 0 {
					break
				}
				bad := slices.Clone(b)
				copy(bad[i+at:], "\x0a\x051e-99")
				start := time.Now()
				err := tc.decode(bad)
				if took := time.Since(start); took > 100*time.Millisecond {
					t.Errorf("took %v", took)
				}
				if err == nil || !strings.Contains(err.Error(), "out of range") {
					t.Fatalf("quantity %d: %v, want it refused", len(got), err)
				}
				msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "decode PersistentVolumeClaim: "), "decode PersistentVolume: ")
				got = append(got, strings.SplitN(msg, ":", 2)[0])
				i += at + len(good)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.paths) {
				t.Fatalf("refused at %v, want %v", got, tc.paths)
			}
		})
	}
}
