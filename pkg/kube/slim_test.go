package kube_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// Slim leaves an object without managedFields as it is and otherwise
// returns a copy without them, never writing into what it was given.
func TestSlim(t *testing.T) {
	bare := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}}
	if kube.Slim(bare) != bare {
		t.Error("an object without managedFields was copied")
	}
	full := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "x", UID: "u",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	got := kube.Slim(full)
	if got == full || got.ManagedFields != nil || got.Name != "x" || got.UID != "u" {
		t.Errorf("Slim = %+v, want a copy of x without managedFields", got.ObjectMeta)
	}
	if full.ManagedFields == nil {
		t.Error("Slim wrote into the object it was given")
	}
}

func ExampleSlim() {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	slim := kube.Slim(pv)
	fmt.Println(slim.Name, len(slim.ManagedFields), len(pv.ManagedFields))
	// Output: pv-1 0 1
}
