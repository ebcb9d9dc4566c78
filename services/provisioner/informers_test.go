package provisioner

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// waitFor polls cond until it holds, or fails the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Without a watcher the provisioner's own informers feed the same cache
// the stream does: it is not current before their first full list and is
// after it; claims and classes are kept without managedFields, indexed by
// spec.volumeName; a deletion drops the claim (onClaim gets the
// tombstone) and wakes whoever waits for it, as a new version does.
func TestInformersFeedTheCache(t *testing.T) {
	a := streamClaim("ns", "a", "ua", "", "v1")
	fast := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "uf",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}, Provisioner: "x"}
	api := fake.NewClientset(a, fast)
	factory := informers.NewSharedInformerFactory(api, 0)
	c := newObjectCache()
	var tombstones, classChanges atomic.Int32
	c.onClaim = func(obj any) {
		if _, ok := obj.(*corev1.PersistentVolumeClaim); !ok {
			tombstones.Add(1)
		}
	}
	c.onClass = func() { classChanges.Add(1) }
	f, err := newInformerFeed(c, factory)
	if err != nil {
		t.Fatal(err)
	}
	if c.current() {
		t.Fatal("current before the informers listed")
	}
	if _, err := c.Claim("ns", "a"); !errors.Is(err, errNotCurrent) {
		t.Fatalf("hint before the informers listed: %v, want errNotCurrent", err)
	}
	ctx := t.Context()
	factory.Start(ctx.Done())
	t.Cleanup(factory.Shutdown)
	done := make(chan error, 1)
	go func() { done <- f.run(ctx) }()
	waitFor(t, "the cache is current", c.current)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	got, err := c.Claim("ns", "a")
	if err != nil || got.UID != "ua" || got.ManagedFields != nil {
		t.Fatalf("claim a: %+v, %v; want uid ua without managedFields", got, err)
	}
	if sc, err := c.StorageClass("fast"); err != nil || sc.UID != "uf" || sc.ManagedFields != nil || classChanges.Load() == 0 {
		t.Fatalf("class fast: %+v, %v (%d class changes told); want uid uf without managedFields", sc, err, classChanges.Load())
	}
	if n := claimsNaming(t, c, "v1"); len(n) != 1 || n[0] != "ns/a" {
		t.Fatalf("index v1: %v", n)
	}

	// A new version wakes whoever waits for the claim.
	stored := c.claimStored("ns", "a")
	a2 := a.DeepCopy()
	a2.Annotations = map[string]string{"k": "v"}
	if _, err := api.CoreV1().PersistentVolumeClaims("ns").Update(ctx, a2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stored:
	case <-time.After(10 * time.Second):
		t.Fatal("the update did not wake the waiter")
	}

	// A deletion drops it, and wakes a waiter too.
	stored = c.claimStored("ns", "a")
	if err := api.CoreV1().PersistentVolumeClaims("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stored:
	case <-time.After(10 * time.Second):
		t.Fatal("the deletion did not wake the waiter")
	}
	if _, err := c.Claim("ns", "a"); err == nil {
		t.Fatal("deleted claim a still cached")
	}
	if n := claimsNaming(t, c, "v1"); len(n) != 0 {
		t.Fatalf("index v1 after the deletion: %v", n)
	}
	if n := tombstones.Load(); n != 1 {
		t.Errorf("%d tombstones told, want 1", n)
	}
	if !c.current() {
		t.Fatal("the informers' cache stopped being current")
	}
}
