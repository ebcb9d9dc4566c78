package provisioner

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// event is a watcher event of obj.
func event(t *testing.T, typ watcherv1.EventType, obj kube.Object) *watcherv1.WatchResponse {
	t.Helper()
	b, err := kube.EncodeProto(obj)
	if err != nil {
		t.Fatal(err)
	}
	ev := &watcherv1.WatchResponse{Type: typ, Object: b}
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		ev.Kind, ev.Key = watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, o.Namespace+"/"+o.Name
	case *storagev1.StorageClass:
		ev.Kind, ev.Key = watcherv1.Kind_KIND_STORAGE_CLASS, o.Name
	default:
		t.Fatalf("no watcher kind for %T", obj)
	}
	return ev
}

func feed(t *testing.T, c *streamFeed, evs ...*watcherv1.WatchResponse) {
	t.Helper()
	for _, ev := range evs {
		if err := c.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
}

func streamClaim(ns, name, uid, rv, volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: rv,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume},
	}
}

// claimsNaming lists the cached claims the guard's index names for volume.
func claimsNaming(t *testing.T, c *objectCache, volume string) []string {
	t.Helper()
	objs, err := c.claims.ByIndex(guard.ByVolumeName, volume)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range objs {
		cl := o.(*corev1.PersistentVolumeClaim)
		out = append(out, cl.Namespace+"/"+cl.Name)
	}
	return out
}

// The stream-fed cache: a full list (RESET, ADDED..., SYNCED) replaces
// what it held, objects the list does not mention are gone; updates and
// deletions follow (a deletion of an older UID leaves the object recreated
// under its name); the ByVolumeName index follows every change; objects
// are kept without managedFields. It is current only after a full list,
// outside a relist, and while the stream is fresh.
func TestStreamCacheAppliesTheStream(t *testing.T) {
	c, f := newStreamFed(DefaultStaleAfter)
	stale := false
	c.stale = func() bool { return stale }
	claimChanges, classChanges := 0, 0
	c.onClaim = func(any) { claimChanges++ }
	c.onClass = func() { classChanges++ }
	claims := corelisters.NewPersistentVolumeClaimLister(c.claims)
	classes := storagelisters.NewStorageClassLister(c.classes)
	if c.current() || c.hasSynced() {
		t.Fatal("current before any list")
	}

	added := watcherv1.EventType_EVENT_TYPE_ADDED
	f.Reset()
	a, b := streamClaim("ns", "a", "ua", "1", "v1"), streamClaim("ns", "b", "ub", "2", "")
	fast := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "uf", ResourceVersion: "3"}, Provisioner: "x"}
	feed(t, f, event(t, added, a), event(t, added, b), event(t, added, fast))
	if c.current() {
		t.Fatal("current in the middle of the first list")
	}
	f.Synced()
	if !c.current() || !c.hasSynced() {
		t.Fatal("not current after a full list")
	}
	got, err := claims.PersistentVolumeClaims("ns").Get("a")
	if err != nil || got.UID != "ua" || got.ResourceVersion != "1" || got.ManagedFields != nil {
		t.Fatalf("claim a: %+v, %v; want uid ua, rv 1, no managedFields", got, err)
	}
	if sc, err := classes.Get("fast"); err != nil || sc.UID != "uf" {
		t.Fatalf("class fast: %v, %v", sc, err)
	}
	if n := claimsNaming(t, c, "v1"); len(n) != 1 || n[0] != "ns/a" {
		t.Fatalf("index v1: %v", n)
	}

	// An update moves b into the index; a deletion takes a out.
	b2 := streamClaim("ns", "b", "ub", "4", "v1")
	feed(t, f, event(t, watcherv1.EventType_EVENT_TYPE_UPDATED, b2), event(t, watcherv1.EventType_EVENT_TYPE_DELETED, a))
	if n := claimsNaming(t, c, "v1"); len(n) != 1 || n[0] != "ns/b" {
		t.Fatalf("index v1 after update and delete: %v", n)
	}
	if _, err := claims.PersistentVolumeClaims("ns").Get("a"); err == nil {
		t.Fatal("deleted claim a still cached")
	}
	// a recreated; a late deletion of its old UID leaves the new one.
	a2 := streamClaim("ns", "a", "ua2", "5", "")
	feed(t, f, event(t, added, a2), event(t, watcherv1.EventType_EVENT_TYPE_DELETED, a))
	if got, err := claims.PersistentVolumeClaims("ns").Get("a"); err != nil || got.UID != "ua2" {
		t.Fatalf("recreated claim a: %v, %v", got, err)
	}

	// A relist that mentions only b: a and the class were deleted while
	// the stream was down. Until its SYNCED the cache is not current, and
	// nothing is dropped yet.
	claimChanges, classChanges = 0, 0
	f.Reset()
	feed(t, f, event(t, added, b2))
	if c.current() {
		t.Fatal("current during a relist")
	}
	if _, err := claims.PersistentVolumeClaims("ns").Get("a"); err != nil {
		t.Fatal("claim a dropped before the list ended")
	}
	f.Synced()
	if _, err := claims.PersistentVolumeClaims("ns").Get("a"); err == nil {
		t.Fatal("claim a, absent from the full list, still cached")
	}
	if _, err := classes.Get("fast"); err == nil {
		t.Fatal("class fast, absent from the full list, still cached")
	}
	if _, err := claims.PersistentVolumeClaims("ns").Get("b"); err != nil {
		t.Fatal("claim b, in the full list, dropped")
	}
	if claimChanges != 2 || classChanges != 1 {
		t.Errorf("%d claim and %d class changes reported, want 2 (b listed, a dropped) and 1", claimChanges, classChanges)
	}
	if !c.current() {
		t.Fatal("not current after the relist")
	}
	stale = true
	if c.current() {
		t.Fatal("current while the stream is stale")
	}
}

// newStreamFed is a claim and class cache and its stream feed, which no
// watcher feeds: the test calls its handler.
func newStreamFed(staleAfter time.Duration) (*objectCache, *streamFeed) {
	c := newObjectCache()
	return c, newStreamFeed(c, nil, grpcutil.TLSFiles{}, discard, staleAfter)
}

// streamGuarded is newGuarded with the server over a stream-fed cache.
func streamGuarded(t *testing.T) (*guarded, *streamFeed, *bool) {
	t.Helper()
	g := newGuarded(t)
	c, f := newStreamFed(DefaultStaleAfter)
	stale := new(bool)
	c.stale = func() bool { return *stale }
	g.s = newServer(g.s.p, c)
	return g, f, stale
}

// apiReads counts the fake API server's reads of claims and classes by
// verb.
func apiReads(g *guarded) map[string]int {
	n := map[string]int{}
	for _, a := range g.api.Actions() {
		if r := a.GetResource().Resource; r == "persistentvolumeclaims" || r == "storageclasses" {
			n[a.GetVerb()+" "+r]++
		}
	}
	return n
}

// A claim or class sent by a caller is taken from the stream-fed cache
// only while it is current; before the first full list and while the
// stream is stale it is read from the API server, as on a cache miss.
func TestStreamHintsMissUnlessCurrent(t *testing.T) {
	for _, tc := range []struct {
		name         string
		synced       bool
		stale        bool
		wantAPIReads int
	}{
		{name: "current", synced: true, wantAPIReads: 0},
		{name: "not synced yet", synced: false, wantAPIReads: 1},
		{name: "stale", synced: true, stale: true, wantAPIReads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, c, stale := streamGuarded(t)
			claim := g.addClaim(t, streamClaim("ns", "data", "u1", "", ""))
			claim.ResourceVersion = "7"
			class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "uf", ResourceVersion: "8"}, Provisioner: "x"}
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), class, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			c.Reset()
			feed(t, c, event(t, watcherv1.EventType_EVENT_TYPE_ADDED, claim), event(t, watcherv1.EventType_EVENT_TYPE_ADDED, class))
			if tc.synced {
				c.Synced()
			}
			*stale = tc.stale
			g.api.ClearActions()
			if _, err := g.s.readClaim(t.Context(), "ns", "data", claim); err != nil {
				t.Fatal(err)
			}
			if _, err := g.s.readClass(t.Context(), "fast", class); err != nil {
				t.Fatal(err)
			}
			reads := apiReads(g)
			if reads["get persistentvolumeclaims"] != tc.wantAPIReads || reads["get storageclasses"] != tc.wantAPIReads {
				t.Errorf("API reads %v, want %d of each", reads, tc.wantAPIReads)
			}
		})
	}
}

// DeleteVolume's guard asks the stream-fed index which claims to read only
// while the cache is current; before the first full list and while the
// stream is stale it lists the claims from the API server, so a claim the
// cache has not seen still keeps the volume.
func TestStreamGuardListsFromTheAPIUnlessCurrent(t *testing.T) {
	ref := &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "claim-uid"}
	for _, tc := range []struct {
		name      string
		synced    bool
		stale     bool
		cached    bool // the claim naming the volume is in the cache
		wantLists int
	}{
		{name: "current, found through the index", synced: true, cached: true, wantLists: 0},
		{name: "not synced yet", synced: false, wantLists: 1},
		{name: "stale, the claim not seen", synced: true, stale: true, wantLists: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, c, stale := streamGuarded(t)
			handle := g.volume(t, "backing")
			if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), provisionedPV("v", handle, corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, ref), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			mine, err := g.api.CoreV1().PersistentVolumeClaims("other").Create(t.Context(), streamClaim("other", "mine", "m", "", "v"), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c.Reset()
			if tc.cached {
				feed(t, c, event(t, watcherv1.EventType_EVENT_TYPE_ADDED, mine))
			}
			if tc.synced {
				c.Synced()
			}
			*stale = tc.stale
			g.api.ClearActions()
			resp, err := g.s.DeleteVolume(t.Context(), &provisionerv1.DeleteVolumeRequest{VolumeName: "v"})
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "claim other/mine (uid m) asks for this volume") {
				t.Fatalf("got %v %v, want FailedPrecondition naming other/mine", resp, err)
			}
			if !g.intact(handle) {
				t.Fatal("the backing volume's data is gone")
			}
			if n := apiReads(g)["list persistentvolumeclaims"]; n != tc.wantLists {
				t.Errorf("%d lists of claims from the API server, want %d", n, tc.wantLists)
			}
		})
	}
}

// The binder sends the claim its own write returned, a version the stream
// brings a little later: readClaim waits for it (no API read) up to
// hintWait, then reads the API server.
func TestReadClaimWaitsForTheSentVersion(t *testing.T) {
	for _, tc := range []struct {
		name         string
		arrives      bool
		wantAPIReads int
	}{{"arrives", true, 0}, {"never arrives", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			g, c, _ := streamGuarded(t)
			claim := g.addClaim(t, streamClaim("ns", "data", "u1", "", ""))
			claim.ResourceVersion = "7"
			c.Reset()
			feed(t, c, event(t, watcherv1.EventType_EVENT_TYPE_ADDED, claim))
			c.Synced()
			sent := claim.DeepCopy()
			sent.ResourceVersion = "8"
			sent.Annotations = map[string]string{"volume.kubernetes.io/storage-provisioner": "x"}
			if tc.arrives {
				ev := event(t, watcherv1.EventType_EVENT_TYPE_UPDATED, sent)
				go func() {
					time.Sleep(20 * time.Millisecond)
					if err := c.Event(ev); err != nil {
						t.Error(err)
					}
				}()
			}
			g.api.ClearActions()
			start := time.Now()
			got, err := g.s.readClaim(t.Context(), "ns", "data", sent)
			if err != nil {
				t.Fatal(err)
			}
			if reads := apiReads(g)["get persistentvolumeclaims"]; reads != tc.wantAPIReads {
				t.Errorf("%d API reads of the claim, want %d", reads, tc.wantAPIReads)
			}
			if tc.arrives && (got.ResourceVersion != "8" || got.Annotations["volume.kubernetes.io/storage-provisioner"] != "x") {
				t.Errorf("got version %s %v, want the sent version from the cache", got.ResourceVersion, got.Annotations)
			}
			if !tc.arrives && time.Since(start) < hintWait {
				t.Errorf("read the API server after %s, before hintWait", time.Since(start))
			}
			c.cache.waitMu.Lock()
			waiting := len(c.cache.waiting)
			c.cache.waitMu.Unlock()
			if tc.arrives && waiting != 0 {
				t.Errorf("%d claims still waited for after the claim was stored", waiting)
			}
		})
	}
}
