package binder

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volplane/volplane/test/harness/memstat"
)

// check reports a shared map or slice whose contents no longer match the
// key it was interned under: someone wrote into a cached object.
func (in *interner) check() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	for k, l := range in.lists {
		if got, _ := listKey(nil, l); string(got) != k {
			return fmt.Errorf("shared resource list %q now %v", k, l)
		}
	}
	for k, m := range in.maps {
		if got, _ := mapKey(nil, m); string(got) != k {
			return fmt.Errorf("shared map %q now %v", k, m)
		}
	}
	for k, s := range in.strs {
		if got, _ := key(nil, s...); string(got) != k || cap(s) != len(s) {
			return fmt.Errorf("shared slice %q now %q (cap %d)", k, s, cap(s))
		}
	}
	for k, s := range in.modes {
		if got, _ := modesKey(nil, s); string(got) != k || cap(s) != len(s) {
			return fmt.Errorf("shared access modes %q now %q (cap %d)", k, s, cap(s))
		}
	}
	return nil
}

func same[T any](a, b T) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// Two Bound pairs that differ only in names share their capacity,
// annotations, finalizers and access modes, and each still reads as it
// was decoded.
func TestInternSharesWhatObjectsHaveInCommon(t *testing.T) {
	in := newInterner()
	pv1, pvc1 := memstat.BoundPair(1)
	pv2, pvc2 := memstat.BoundPair(51) // the same namespace as 1
	want := []any{pv1.DeepCopy(), pvc1.DeepCopy(), pv2.DeepCopy(), pvc2.DeepCopy()}
	in.volume(pv1)
	in.claim(pvc1)
	in.volume(pv2)
	in.claim(pvc2)
	for i, got := range []any{pv1, pvc1, pv2, pvc2} {
		if d := cmp.Diff(want[i], got); d != "" {
			t.Errorf("object %d changed (-want +got):\n%s", i, d)
		}
	}
	for name, ok := range map[string]bool{
		"volume capacity":       same(pv1.Spec.Capacity, pv2.Spec.Capacity),
		"volume annotations":    same(pv1.Annotations, pv2.Annotations),
		"volume finalizers":     same(pv1.Finalizers, pv2.Finalizers),
		"volume access modes":   same(pv1.Spec.AccessModes, pv2.Spec.AccessModes),
		"volume attributes":     same(pv1.Spec.CSI.VolumeAttributes, pv2.Spec.CSI.VolumeAttributes),
		"claim requests":        same(pvc1.Spec.Resources.Requests, pvc2.Spec.Resources.Requests),
		"claim status capacity": same(pvc1.Status.Capacity, pvc2.Status.Capacity),
		"claim annotations":     same(pvc1.Annotations, pvc2.Annotations),
		"claim access modes":    same(pvc1.Spec.AccessModes, pvc2.Status.AccessModes),
		"capacity and requests": same(pv1.Spec.Capacity, pvc1.Spec.Resources.Requests),
	} {
		if !ok {
			t.Errorf("%s not shared", name)
		}
	}
	if err := in.check(); err != nil {
		t.Fatal(err)
	}

	// What differs is not shared.
	pv3, _ := memstat.BoundPair(3)
	q := resource.MustParse("20Gi")
	pv3.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: q}
	pv3.Annotations = map[string]string{"other": "yes"}
	in.volume(pv3)
	if same(pv3.Spec.Capacity, pv1.Spec.Capacity) || same(pv3.Annotations, pv1.Annotations) {
		t.Error("different capacity or annotations shared")
	}
	if got := pv3.Spec.Capacity[corev1.ResourceStorage]; got.String() != "20Gi" {
		t.Errorf("capacity %s, want 20Gi", got.String())
	}

	// A copy, as every change makes, owns its parts; an append to a shared
	// slice makes a new array.
	c := pv1.DeepCopy()
	c.Annotations["changed"] = "yes"
	c.Spec.Capacity[corev1.ResourceStorage] = q
	_ = append(pv1.Finalizers, "appended")
	_ = append(pvc1.Spec.AccessModes, corev1.ReadOnlyMany)
	if err := in.check(); err != nil {
		t.Fatal(err)
	}
}

// A table of maps that are all different stays bounded.
func TestInternTablesAreBounded(t *testing.T) {
	in := newInterner()
	for i := range 3 * maxInterned {
		in.stringMap(map[string]string{"selected-node": fmt.Sprintf("node-%d", i)})
	}
	if n := len(in.maps); n > maxInterned {
		t.Fatalf("%d maps interned, at most %d", n, maxInterned)
	}
	in = newInterner()
	big := map[string]string{}
	for i := range 9 {
		big[fmt.Sprint(i)] = "x"
	}
	if got := in.stringMap(big); !same(got, big) || len(in.maps) != 0 {
		t.Fatal("a map of 9 entries was interned")
	}
}
