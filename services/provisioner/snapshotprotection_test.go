package provisioner

import (
	"errors"

	"io"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

func snapshotObj(ns, name string, finalizers ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": "uid-" + name},
	}}
	if len(finalizers) > 0 {
		u.SetFinalizers(finalizers)
	}
	return u
}

func newDynamic(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		snapshotsResource:        "VolumeSnapshotList",
		snapshotContentsResource: "VolumeSnapshotContentList",
		referenceGrantsResource:  "ReferenceGrantList",
	}, objs...)
}

func snapshotFinalizers(t *testing.T, dyn *dynamicfake.FakeDynamicClient, ns, name string) []string {
	t.Helper()
	u, err := dyn.Resource(snapshotsResource).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return u.GetFinalizers()
}

func restoreClaim(ns, name, snap string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
	g := snapshotGroup
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{APIGroup: &g, Kind: "VolumeSnapshot", Name: snap}},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: phase},
	}
}

// The finalizer is put on once (an existing one, and another's, kept), not
// by PlanVolume, and removed after the restore of a claim whose
// spec.dataSource names the snapshot; without the RBAC the restore goes on.
func TestSnapshotSourceProtection(t *testing.T) {
	dyn := newDynamic(snapshotObj("ns", "snap", "other.io/keep"))
	s := sources{dynamic: dyn}
	snap, _ := dyn.Resource(snapshotsResource).Namespace("ns").Get(t.Context(), "snap", metav1.GetOptions{})

	if err := s.protectSnapshot(forPlan(t.Context()), snap); err != nil {
		t.Fatal(err)
	}
	if got := snapshotFinalizers(t, dyn, "ns", "snap"); slices.Contains(got, finalizerSnapshotSource) {
		t.Fatalf("PlanVolume protected the snapshot: %v", got)
	}
	if err := s.protectSnapshot(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	want := []string{"other.io/keep", finalizerSnapshotSource}
	if got := snapshotFinalizers(t, dyn, "ns", "snap"); !slices.Equal(got, want) {
		t.Fatalf("finalizers %v, want %v", got, want)
	}
	snap, _ = dyn.Resource(snapshotsResource).Namespace("ns").Get(t.Context(), "snap", metav1.GetOptions{})
	if err := s.protectSnapshot(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	if got := snapshotFinalizers(t, dyn, "ns", "snap"); !slices.Equal(got, want) {
		t.Fatalf("protected twice: %v", got)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// A claim of another namespace, or restoring through dataSourceRef
	// only, does not release it (the sweeper does).
	other := restoreClaim("elsewhere", "c", "snap", corev1.ClaimPending)
	s.releaseSnapshot(t.Context(), log, other)
	ref := restoreClaim("ns", "c", "snap", corev1.ClaimPending)
	ref.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ref.Spec.DataSource.APIGroup, Kind: "VolumeSnapshot", Name: "snap"}
	ref.Spec.DataSource = nil
	s.releaseSnapshot(t.Context(), log, ref)
	if got := snapshotFinalizers(t, dyn, "ns", "snap"); !slices.Equal(got, want) {
		t.Fatalf("released by a claim that does not name it in spec.dataSource: %v", got)
	}
	s.releaseSnapshot(t.Context(), log, restoreClaim("ns", "c", "snap", corev1.ClaimPending))
	if got := snapshotFinalizers(t, dyn, "ns", "snap"); !slices.Equal(got, []string{"other.io/keep"}) {
		t.Fatalf("finalizers after the restore %v, want only other.io/keep", got)
	}
	// Gone: nothing to do.
	s.releaseSnapshot(t.Context(), log, restoreClaim("ns", "c", "missing", corev1.ClaimPending))

	// Without update rights the restore is not refused.
	denied := newDynamic(snapshotObj("ns", "snap"))
	denied.PrependReactor("update", "volumesnapshots", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errForbidden()
	})
	snap, _ = denied.Resource(snapshotsResource).Namespace("ns").Get(t.Context(), "snap", metav1.GetOptions{})
	if err := (sources{dynamic: denied}).protectSnapshot(t.Context(), snap); err != nil {
		t.Errorf("without RBAC to update VolumeSnapshots: %v, want the restore to go on", err)
	}
}

// The snapshots a claim still restores from: Pending or phaseless claims,
// through spec.dataSource or spec.dataSourceRef (in its namespace, when it
// names one).
func TestRestoringSnapshots(t *testing.T) {
	g, other := snapshotGroup, "example.io"
	ns2 := "b"
	withRef := func(c *corev1.PersistentVolumeClaim, group *string, ns *string) *corev1.PersistentVolumeClaim {
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: group, Kind: "VolumeSnapshot", Name: c.Spec.DataSource.Name, Namespace: ns}
		c.Spec.DataSource = nil
		return c
	}
	got := restoring([]*corev1.PersistentVolumeClaim{
		restoreClaim("a", "pending", "s1", corev1.ClaimPending),
		restoreClaim("a", "new", "s2", ""),
		restoreClaim("a", "bound", "s3", corev1.ClaimBound),
		restoreClaim("a", "lost", "s4", corev1.ClaimLost),
		withRef(restoreClaim("a", "ref", "s5", corev1.ClaimPending), &g, nil),
		withRef(restoreClaim("a", "crossns", "s6", corev1.ClaimPending), &g, &ns2),
		withRef(restoreClaim("a", "foreign", "s7", corev1.ClaimPending), &other, nil),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "plain"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}},
	})
	want := map[string]bool{"a/s1": true, "a/s2": true, "a/s5": true, "b/s6": true}
	if len(got) != len(want) {
		t.Errorf("restoring %v, want %v", got, want)
	}
	for k := range want {
		if !got[k] {
			t.Errorf("restoring %v misses %s", got, k)
		}
	}
}

// The sweeper removes the finalizer from snapshots no Pending claim
// restores from, and keeps it where one does, even a claim its cache has
// not seen yet (the API server is asked before a finalizer goes).
func TestSnapshotSweeper(t *testing.T) {
	dyn := newDynamic(
		snapshotObj("a", "orphan", finalizerSnapshotSource),
		snapshotObj("a", "in-use", finalizerSnapshotSource),
		snapshotObj("a", "unseen", finalizerSnapshotSource),
		snapshotObj("a", "plain", "other.io/keep"),
		snapshotObj("b", "crossns", finalizerSnapshotSource),
	)
	inUse := restoreClaim("a", "c1", "in-use", corev1.ClaimPending)
	done := restoreClaim("a", "c2", "orphan", corev1.ClaimBound)
	g, b := snapshotGroup, "b"
	cross := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "c3"},
		Spec:   corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{APIGroup: &g, Kind: "VolumeSnapshot", Name: "crossns", Namespace: &b}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
	unseen := restoreClaim("a", "c4", "unseen", corev1.ClaimPending)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range []*corev1.PersistentVolumeClaim{inUse, done, cross} {
		_ = idx.Add(c)
	}
	client := fake.NewClientset(inUse, done, cross, unseen)
	s := &snapshotSweeper{log: slog.New(slog.NewTextHandler(io.Discard, nil)), client: client, dynamic: dyn, claims: corelisters.NewPersistentVolumeClaimLister(idx)}
	s.sweep(t.Context())
	for _, tc := range []struct {
		ns, name string
		want     []string
	}{
		{"a", "orphan", nil},
		{"a", "in-use", []string{finalizerSnapshotSource}},
		{"a", "unseen", []string{finalizerSnapshotSource}},
		{"a", "plain", []string{"other.io/keep"}},
		{"b", "crossns", []string{finalizerSnapshotSource}},
	} {
		if got := snapshotFinalizers(t, dyn, tc.ns, tc.name); !slices.Equal(got, tc.want) {
			t.Errorf("%s/%s: finalizers %v, want %v", tc.ns, tc.name, got, tc.want)
		}
	}
	// Once the claims are done, every finalizer goes.
	for _, c := range []*corev1.PersistentVolumeClaim{inUse, cross, unseen} {
		if err := client.CoreV1().PersistentVolumeClaims(c.Namespace).Delete(t.Context(), c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		_ = idx.Delete(c)
	}
	s.sweep(t.Context())
	for _, k := range [][2]string{{"a", "in-use"}, {"a", "unseen"}, {"b", "crossns"}} {
		if got := snapshotFinalizers(t, dyn, k[0], k[1]); slices.Contains(got, finalizerSnapshotSource) {
			t.Errorf("%s/%s keeps an orphaned finalizer: %v", k[0], k[1], got)
		}
	}
}

func errForbidden() error {
	return apierrors.NewForbidden(schema.GroupResource{Group: snapshotGroup, Resource: "volumesnapshots"}, "snap", errors.New("no RBAC"))
}
