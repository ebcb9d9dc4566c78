package binder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

var (
	evAdded   = watcherv1.EventType_EVENT_TYPE_ADDED
	evUpdated = watcherv1.EventType_EVENT_TYPE_UPDATED
	evDeleted = watcherv1.EventType_EVENT_TYPE_DELETED
	kindPV    = watcherv1.Kind_KIND_PERSISTENT_VOLUME
	kindPVC   = watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
)

// fedController is a controller whose cache the watch has filled with objs,
// each also in the fake API.
func fedController(t *testing.T, objs ...runtime.Object) (*controller, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, record.NewFakeRecorder(1000))
	c.Reset()
	for _, o := range objs {
		deliver(t, c, evAdded, o)
	}
	c.Synced()
	return c, client
}

// deliver hands c one watch event for o.
func deliver(t *testing.T, c *controller, typ watcherv1.EventType, o runtime.Object) {
	t.Helper()
	var ev *watcherv1.WatchResponse
	switch o := o.(type) {
	case *corev1.PersistentVolume:
		ev = event(typ, kindPV, o.Name, o)
	case *corev1.PersistentVolumeClaim:
		ev = event(typ, kindPVC, claimKey(o), o)
	default:
		t.Fatalf("no watch event for %T", o)
	}
	if err := c.Event(ev); err != nil {
		t.Fatal(err)
	}
}

// apiCounts is how many claims and volumes the (fake) API holds.
func apiCounts(t *testing.T, client *fake.Clientset) (claims, volumes int) {
	t.Helper()
	cl, err := client.CoreV1().PersistentVolumeClaims("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vl, err := client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(cl.Items), len(vl.Items)
}

// The claim is deleted while the binder's update of it is in flight: the
// watch delivers the deletion before the update's response comes back.
// The response must not bring the claim back into the cache, and the
// volume it was being bound to must end Released, not stay Bound to a
// claim that no longer exists.
func TestADeleteRacingAnUpdateLeavesNoZombie(t *testing.T) {
	ctx := t.Context()
	claim, volume := testClaim("data"), testVolume("pv")
	volume.UID = "pv-uid"
	volume.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	c, client := fedController(t, claim.DeepCopy(), volume.DeepCopy())
	pvcs := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	client.PrependReactor("update", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "" {
			return false, nil, nil
		}
		// The API applies the update (bind-completed, volumeName), then
		// the user deletes the claim; the watch is quicker than the
		// response.
		updated := a.(k8stesting.UpdateAction).GetObject().(*corev1.PersistentVolumeClaim).DeepCopy()
		updated.ResourceVersion = "5"
		if err := client.Tracker().Delete(pvcs, claim.Namespace, claim.Name); err != nil {
			t.Error(err)
		}
		gone := updated.DeepCopy()
		gone.ResourceVersion = "6"
		deliver(t, c, evDeleted, gone)
		return true, updated, nil
	})
	_ = c.syncClaim(ctx, c.store.claim(claimKey(claim))) // ends in NotFound or gone: either is fine

	if c.store.claim(claimKey(claim)) != nil {
		t.Error("the update's response re-created a claim whose deletion the watch delivered")
	}
	cacheClaims, _ := c.store.counts()
	apiClaims, _ := apiCounts(t, client)
	if cacheClaims > apiClaims {
		t.Errorf("cache holds %d claims, the API %d", cacheClaims, apiClaims)
	}

	// The volume was bound to the claim before it went: its sync releases
	// it.
	for range 3 {
		v := c.store.volume("pv")
		if v == nil {
			t.Fatal("volume left the cache")
		}
		if err := c.syncVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	got, err := client.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.ClaimRef == nil || got.Spec.ClaimRef.UID != claim.UID {
		t.Fatalf("the volume's claimRef is %v; the bind's first step should have set it", got.Spec.ClaimRef)
	}
	if got.Status.Phase != corev1.VolumeReleased {
		t.Fatalf("the deleted claim's volume is %s, want Released", got.Status.Phase)
	}
}

// An update answered NotFound means the claim is gone: it leaves the cache
// at once, nothing is retried, and a late watch event of the same claim
// (sent before its deletion) does not bring it back. The deletion event,
// when it comes, still queues the claim's volume.
func TestNotFoundOnUpdateDropsTheClaim(t *testing.T) {
	ctx := t.Context()
	claim := testClaim("data")
	claim.Spec.StorageClassName = nil
	claim.Spec.VolumeName = "pv"
	claim.Status.Phase = ""
	c, client := fedController(t, claim.DeepCopy())
	pvcs := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	if err := client.Tracker().Delete(pvcs, claim.Namespace, claim.Name); err != nil {
		t.Fatal(err)
	}
	_ = c.syncClaim(ctx, c.store.claim(claimKey(claim))) // the claim is gone: an error says so
	if c.store.claim(claimKey(claim)) != nil {
		t.Fatal("a claim the API answered NotFound for is still cached")
	}
	late := claim.DeepCopy()
	late.ResourceVersion = "2"
	late.Labels = map[string]string{"changed": "before-the-delete"}
	deliver(t, c, evUpdated, late)
	if c.store.claim(claimKey(claim)) != nil {
		t.Fatal("a late watch event re-created a claim known to be gone")
	}
	for c.volumeQueue.Len() > 0 {
		k, _ := c.volumeQueue.Get()
		c.volumeQueue.Done(k)
	}
	gone := claim.DeepCopy()
	gone.ResourceVersion = "3"
	deliver(t, c, evDeleted, gone)
	if c.volumeQueue.Len() != 1 {
		t.Fatalf("the deletion queued %d volumes, want the claim's volume", c.volumeQueue.Len())
	}
	// A claim created again under the same name (a new UID) is cached.
	again := testClaim("data")
	again.UID = "uid-data-2"
	again.ResourceVersion = "4"
	deliver(t, c, evAdded, again)
	if got := c.store.claim(claimKey(claim)); got == nil || got.UID != again.UID {
		t.Fatalf("the new claim under the old name: %v", got)
	}
}

// A volume that was Released (its claim confirmed gone) is never made Bound
// again, even when a stale cache still shows the claim, by the volume's
// sync or by the claim's ("bind again").
func TestAReleasedVolumeIsNeverBoundAgain(t *testing.T) {
	ctx := t.Context()
	for _, phase := range []corev1.PersistentVolumePhase{corev1.VolumeReleased, corev1.VolumeFailed} {
		t.Run(string(phase), func(t *testing.T) {
			claim := testClaim("data")
			claim.Spec.VolumeName = "pv"
			claim.Annotations = map[string]string{kube.AnnBindCompleted: "yes", kube.AnnBoundByController: "yes"}
			claim.Status.Phase = corev1.ClaimBound
			volume := testVolume("pv")
			volume.UID = "pv-uid"
			volume.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: claim.UID}
			volume.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
			volume.Status.Phase = phase
			// The cache still has the claim; the API does not.
			c, client := fedController(t, claim.DeepCopy(), volume.DeepCopy())
			pvcs := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
			if err := client.Tracker().Delete(pvcs, claim.Namespace, claim.Name); err != nil {
				t.Fatal(err)
			}
			_ = c.syncVolume(ctx, c.store.volume("pv"))
			if cl := c.store.claim(claimKey(claim)); cl != nil {
				_ = c.syncClaim(ctx, cl)
			}
			got, err := client.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase != phase {
				t.Fatalf("a %s volume became %s", phase, got.Status.Phase)
			}
		})
	}
}

// The binder fails over from one watcher replica to another that lags
// behind it: the first delivered a claim's and a volume's deletion, the
// second's relist still shows both. They must not come back into the
// cache, neither from the relist nor from the lagging replica's later
// events. A claim the lagging replica does not know yet (newer than its
// view) leaves the cache at the relist, as any relist would have it, and
// comes back when that replica catches up: only a confirmed deletion
// keeps an object out.
func TestFailoverToALaggingWatcherBringsNothingDeletedBack(t *testing.T) {
	deleted, volume := testClaim("deleted"), testVolume("pv")
	volume.UID = "pv-uid"
	deleted.Spec.VolumeName = volume.Name
	c, _ := fedController(t, deleted.DeepCopy(), volume.DeepCopy())

	// The first watcher: a newer claim appears, then both deletions.
	newer := testClaim("newer")
	newer.UID = "uid-newer"
	newer.ResourceVersion = "7"
	deliver(t, c, evAdded, newer.DeepCopy())
	goneClaim, goneVolume := deleted.DeepCopy(), volume.DeepCopy()
	goneClaim.ResourceVersion, goneVolume.ResourceVersion = "8", "9"
	deliver(t, c, evDeleted, goneClaim)
	deliver(t, c, evDeleted, goneVolume)

	// Failover: the second watcher's relist is from before all three.
	c.Reset()
	deliver(t, c, evAdded, deleted.DeepCopy())
	deliver(t, c, evAdded, volume.DeepCopy())
	c.Synced()
	if got := c.store.claim(claimKey(deleted)); got != nil {
		t.Fatal("a lagging watcher's relist brought back a claim whose deletion was seen")
	}
	if got := c.store.volume(volume.Name); got != nil {
		t.Fatal("a lagging watcher's relist brought back a volume whose deletion was seen")
	}
	if got := c.store.claim(claimKey(newer)); got != nil {
		t.Fatal("a claim the relist did not mention is still cached")
	}

	// The lagging watcher's later events, in its own order: an update of
	// the deleted claim it had not seen yet, then the newer claim, then
	// the deletions.
	late := deleted.DeepCopy()
	late.ResourceVersion = "6"
	deliver(t, c, evUpdated, late)
	if c.store.claim(claimKey(deleted)) != nil {
		t.Fatal("a lagging watcher's update brought back a deleted claim")
	}
	deliver(t, c, evAdded, newer.DeepCopy())
	if got := c.store.claim(claimKey(newer)); got == nil || got.UID != newer.UID {
		t.Fatalf("the newer claim did not come back when the lagging watcher caught up: %v", got)
	}
	deliver(t, c, evDeleted, goneClaim.DeepCopy())
	deliver(t, c, evDeleted, goneVolume.DeepCopy())
	if c.store.claim(claimKey(newer)) == nil {
		t.Fatal("a repeated deletion of another claim removed the newer one")
	}

	// The same names with new UIDs are new objects: cached.
	again := testClaim("deleted")
	again.UID = "uid-deleted-2"
	again.ResourceVersion = "10"
	deliver(t, c, evAdded, again)
	if got := c.store.claim(claimKey(again)); got == nil || got.UID != again.UID {
		t.Fatalf("a new claim under a deleted one's name: %v", got)
	}
	// And a stale deletion of the old UID does not remove the new one.
	deliver(t, c, evDeleted, goneClaim.DeepCopy())
	if got := c.store.claim(claimKey(again)); got == nil || got.UID != again.UID {
		t.Fatal("a late deletion of the old claim removed the new one under its name")
	}
}

// The memory of deleted UIDs is bounded and expires.
func TestGoneUIDsAreBounded(t *testing.T) {
	var g goneUIDs
	for i := range maxGone + 10 {
		g.add(types.UID(fmt.Sprint("uid-", i)))
	}
	if len(g.at) != maxGone || len(g.order)-g.head != maxGone {
		t.Fatalf("%d UIDs remembered (%d in order), want at most %d", len(g.at), len(g.order), maxGone)
	}
	if g.has("uid-0") || !g.has(types.UID(fmt.Sprint("uid-", maxGone+9))) {
		t.Fatal("the oldest UID should go first, the newest stay")
	}
	g.expire(time.Now().Add(goneTTL))
	if len(g.at) != 0 || len(g.order)-g.head != 0 {
		t.Fatalf("%d UIDs left after their TTL", len(g.at))
	}
}

// A volume the provisioner just created is bound at once with the
// provisioner's copy; its watch event (sent before the bind) arrives after.
// The cache must keep the bound version, so that the volume's own sync has
// nothing to write. It used to keep the watch's older copy (Pending), and
// the volume's sync wrote the phase again against it: against the real API
// a conflict, retried for as long as the stream lagged (4 to 9 PV status
// writes per claim in a saturated dynamic bench).
func TestAProvisionedVolumeStaysCachedAsBound(t *testing.T) {
	ctx := t.Context()
	claim := testClaim("data")
	c, client := fedController(t, claim.DeepCopy())
	pv := testVolume("pvc-data")
	pv.UID = "pv-uid"
	pv.Annotations = map[string]string{kube.AnnDynamicallyProvisioned: "dev.volplane.io"}
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	pv.Status.Phase = corev1.VolumePending
	if err := client.Tracker().Add(pv.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	// The fake API keeps resourceVersions as they are sent: count them up
	// as the real one does.
	rv := 1
	client.PrependReactor("update", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv++
		a.(k8stesting.UpdateAction).GetObject().(metav1.Object).SetResourceVersion(fmt.Sprint(rv))
		return false, nil, nil
	})

	out := provisionOutcome{uid: claim.UID, res: provisionResult{outcome: provisionerv1.Outcome_OUTCOME_FINISHED, volume: pv.DeepCopy()}}
	if err := c.provisioned(ctx, c.store.claim(claimKey(claim)), out); err != nil {
		t.Fatal(err)
	}
	deliver(t, c, evAdded, pv.DeepCopy()) // the create, late
	if got := c.store.volume(pv.Name); got == nil || got.Status.Phase != corev1.VolumeBound {
		t.Fatalf("cached volume after its late create event: %v, want the Bound version", got)
	}
	if err := c.syncVolume(ctx, c.store.volume(pv.Name)); err != nil {
		t.Fatal(err)
	}
	writes := 0
	for _, a := range client.Actions() {
		if a.Matches("update", "persistentvolumes") && a.GetSubresource() == "status" {
			writes++
		}
	}
	if writes != 1 {
		t.Errorf("the volume's status was written %d times, want once (by the bind)", writes)
	}
}
