package guard_test

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/pkg/guard"
)

// A Released volume whose claim was recreated under its old name and asks
// for it again must keep its data.
func Example() {
	api := fake.NewClientset(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "new"},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: "pv1"},
	})
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv1"},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "old"}},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
	}
	err := guard.Volume(v, corev1.PersistentVolumeReclaimDelete)
	if err == nil {
		err = guard.LiveClaim(context.Background(), guard.APIClaims{Client: api}, v)
	}
	var r *guard.Refusal
	fmt.Println(errors.As(err, &r), err)
	// Output: true claim ns/data (uid new) asks for this volume, "pv1", by spec.volumeName
}
