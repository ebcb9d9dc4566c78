package watcher

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/memstat"
)

// The informers keep each volume, claim and class as its protobuf: what a
// subscriber decodes is the object without its managedFields, and the
// cache still finds it by key and resourceVersion.
func TestTransformKeepsTheObjectAsProtobuf(t *testing.T) {
	pv, pvc := memstat.BoundPair(7)
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "standard", ResourceVersion: "12",
		ManagedFields: pv.ManagedFields}, Provisioner: "csi.example.com"}
	for _, tc := range []struct {
		obj    kube.Object
		key    string
		decode func([]byte) (kube.Object, error)
	}{
		{pv, pv.Name, func(b []byte) (kube.Object, error) { return kube.DecodeVolume(b) }},
		{pvc, pvc.Namespace + "/" + pvc.Name, func(b []byte) (kube.Object, error) { return kube.DecodeClaim(b) }},
		{class, "standard", func(b []byte) (kube.Object, error) { return kube.DecodeStorageClass(b) }},
	} {
		want := tc.obj.DeepCopyObject().(kube.Object)
		want.(metav1.Object).SetManagedFields(nil)
		v, err := transform(tc.obj)
		if err != nil {
			t.Fatal(err)
		}
		if tc.obj.(metav1.Object).GetManagedFields() == nil {
			t.Errorf("%T: the transform wrote into the object it was given (informers may share it)", tc.obj)
		}
		e, ok := v.(*encoded)
		if !ok {
			t.Fatalf("%T kept as %T", tc.obj, v)
		}
		if key, _ := cache.MetaNamespaceKeyFunc(e); key != tc.key {
			t.Errorf("key %q, want %q", key, tc.key)
		}
		if got, want := rv(e), want.(metav1.Object).GetResourceVersion(); got != want {
			t.Errorf("resourceVersion %q, want %q", got, want)
		}
		b, _ := e.Marshal()
		got, err := tc.decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%T decoded (-want +got):\n%s", want, d)
		}
		if again, _ := transform(e); again != e {
			t.Errorf("%T transformed again", tc.obj)
		}
		if c := e.DeepCopyObject().(*encoded); c == e || c.name != e.name || c.resourceVersion != e.resourceVersion || string(c.pb) != string(e.pb) {
			t.Errorf("copy %p of %p: %+v", c, e, c)
		}
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: &encoded{name: "web"}}
	if got, _ := transform(tomb); got != tomb {
		t.Fatalf("tombstone became %T", got)
	}
	var other any = &corev1.Pod{}
	if got, _ := transform(other); got != other {
		t.Fatalf("a %T became %T", other, got)
	}
}
