package binder

import (
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// shardedSetUp is a replica whose cache and fake API server hold a Bound
// volume pv1 and its Bound claim ns/c, fed through the watcher stream.
func shardedSetUp(t *testing.T) (*controller, *fake.Clientset, *recordingReclaimer) {
	t.Helper()
	ctx := t.Context()
	client := fake.NewClientset()
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, record.NewFakeRecorder(100))
	rec := &recordingReclaimer{}
	c.reclaimer = rec
	pv := pvT("pv1", "1Gi", refTo("c", "uid-c"), pvPhase(corev1.VolumeBound), policy(corev1.PersistentVolumeReclaimDelete))
	pvc := pvcT("c", "1Gi", volumeName("pv1"), claimPhase(corev1.ClaimBound), claimAnn(kube.AnnBindCompleted, "yes"))
	var err error
	if pv, err = client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if pvc, err = client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	add := watcherv1.EventType_EVENT_TYPE_ADDED
	c.Reset()
	for _, ev := range []*watcherv1.WatchResponse{
		event(add, watcherv1.Kind_KIND_PERSISTENT_VOLUME, "pv1", pv),
		event(add, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/c", pvc),
	} {
		if err := c.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	drain(c)
	client.ClearActions()
	return c, client, rec
}

// drain empties both queues without syncing.
func drain(c *controller) {
	for _, q := range []*queue{c.claimQueue, c.volumeQueue} {
		for q.Len() > 0 {
			k, _ := q.get()
			q.forget(k)
			q.Done(k)
		}
	}
}

// relistWithout applies a full list that mentions the volume only.
func relistWithout(t *testing.T, c *controller, client *fake.Clientset) {
	t.Helper()
	pv, err := client.CoreV1().PersistentVolumes().Get(t.Context(), "pv1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Reset()
	if err := c.Event(event(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME, "pv1", pv)); err != nil {
		t.Fatal(err)
	}
	drain(c) // what the volume's own event queued
	c.Synced()
	client.ClearActions()
}

// A claim that leaves the replica's shard (a ring change: the new stream's
// list does not carry it) is not a deleted claim: it is forgotten without
// queuing its volume, and the volume, owned by the claim's owner, is never
// released, failed or handed to the reclaimer here, even by a sync asked
// for by name, and even when ownership were wrong (the live read finds the
// claim). When the shard gives the claim back, it enters the cache again.
func TestClaimLeavingTheShardReleasesNoVolume(t *testing.T) {
	c, client, rec := shardedSetUp(t)
	c.streams = func(string) bool { return false } // the new shard has not ns/c
	relistWithout(t, c, client)
	if c.store.claim("ns/c") != nil {
		t.Fatal("a claim of another shard is still cached")
	}
	if n := c.volumeQueue.Len() + c.claimQueue.Len(); n != 0 {
		t.Fatalf("%d keys queued for a claim that only left the shard", n)
	}

	// Attack: the replica owns the volume's old key, pv/pv1, but not the
	// claim; the volume's key is its claim's.
	c.owns = func(key string) bool { return key != "pvc/ns/c" }
	if err := c.syncVolumeKey(t.Context(), "pv1"); err != nil {
		t.Fatal(err)
	}
	if got := requests(client); len(got) != 0 {
		t.Fatalf("a replica not holding the claim made requests %v", got)
	}
	// Attack: ownership wrongly says yes to everything. The live read
	// finds the claim: no release.
	c.owns = func(string) bool { return true }
	if err := c.syncVolumeKey(t.Context(), "pv1"); err != nil {
		t.Fatal(err)
	}
	if got := requests(client); !slices.Equal(got, []string{"get persistentvolumeclaims"}) {
		t.Fatalf("requests %v, want only the live read of the claim", got)
	}
	if st := stateOf(t.Context(), t, client, "pv/pv1"); st.phase != string(corev1.VolumeBound) {
		t.Fatalf("volume is %+v, want Bound", st)
	}
	if len(rec.got) != 0 {
		t.Fatalf("handed %v to the reclaimer", rec.got)
	}

	// The ring gives the claim back: the new list brings it, and nothing
	// marked it gone.
	c.streams = func(string) bool { return true }
	c.Reset()
	pvc, _ := client.CoreV1().PersistentVolumeClaims("ns").Get(t.Context(), "c", metav1.GetOptions{})
	if err := c.Event(event(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/c", pvc)); err != nil {
		t.Fatal(err)
	}
	c.Synced()
	if c.store.claim("ns/c") == nil {
		t.Fatal("the claim given back is not cached")
	}
}

// The happy path beside it: a claim of the replica's own shard that a list
// no longer mentions was deleted: its volume is queued, the live read
// confirms the claim is gone, and the volume is Released and handed to
// the reclaimer.
func TestClaimDeletedInTheShardReleasesItsVolume(t *testing.T) {
	c, client, rec := shardedSetUp(t)
	c.streams = func(string) bool { return true }
	if err := client.CoreV1().PersistentVolumeClaims("ns").Delete(t.Context(), "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	relistWithout(t, c, client)
	if c.volumeQueue.Len() != 1 {
		t.Fatalf("volume queue holds %d keys, want pv1", c.volumeQueue.Len())
	}
	if err := c.syncVolumeKey(t.Context(), "pv1"); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(t.Context(), t, client, "pv/pv1"); st.phase != string(corev1.VolumeReleased) {
		t.Fatalf("volume is %+v, want Released", st)
	}
	if !slices.Equal(rec.got, []string{"pv1"}) {
		t.Fatalf("handed %v to the reclaimer, want pv1", rec.got)
	}
}

// A bound or pre-bound volume belongs to its claim's owner; a volume no
// claim names to its own key.
func TestVolumeOwnerKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    *corev1.PersistentVolume
		want string
	}{
		{"free", pvT("pv1", "1Gi"), "pv/pv1"},
		{"bound", pvT("pv1", "1Gi", refTo("c", "uid-c")), "pvc/ns/c"},
		{"pre-bound without UID", pvT("pv1", "1Gi", refTo("c", "")), "pvc/ns/c"},
		{"claimRef without a name", pvT("pv1", "1Gi", func(v *corev1.PersistentVolume) { v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns"} }), "pv/pv1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := volumeOwnerKey(tc.v); got != tc.want {
				t.Fatalf("volumeOwnerKey = %q, want %q", got, tc.want)
			}
		})
	}
}

// A replica that gains claims does nothing for them (or the volumes they
// name) until the stream's full list of a shard holding them is in, even
// once the ring has settled; other keys are not held back.
func TestOwnershipWaitsForTheShardsList(t *testing.T) {
	o := newOwnership("a", 20*time.Millisecond)
	held := false
	o.holds = func(key string) bool { return held && key == "ns/c" }
	o.set([]string{"a"})
	waitFor(t, func() bool { return o.owns("pv/x") })
	if o.owns("pvc/ns/c") {
		t.Fatal("owns a claim whose shard list is not in")
	}
	held = true
	if !o.owns("pvc/ns/c") {
		t.Fatal("does not own a claim whose shard list is in")
	}
	if o.owns("pvc/ns/other") {
		t.Fatal("owns a claim the list did not hold")
	}
}
