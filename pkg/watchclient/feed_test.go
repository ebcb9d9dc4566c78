package watchclient_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

var (
	pvKind    = watcherv1.Kind_KIND_PERSISTENT_VOLUME
	pvcKind   = watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
	classKind = watcherv1.Kind_KIND_STORAGE_CLASS
	podKind   = watcherv1.Kind_KIND_POD
	added     = watcherv1.EventType_EVENT_TYPE_ADDED
	updated   = watcherv1.EventType_EVENT_TYPE_UPDATED
	deleted   = watcherv1.EventType_EVENT_TYPE_DELETED
)

// view is a Subscriber that holds what it is given, per kind, and logs
// every event and Relisted call.
type view struct {
	objs     map[watcherv1.Kind]map[string]any
	observed map[string]time.Time // by key, the last event's Observed
	log      []string
	relisted []watchclient.Listed
}

func newView() *view { return &view{objs: map[watcherv1.Kind]map[string]any{}} }

func (v *view) Apply(ev watchclient.Event) error {
	m := v.objs[ev.Kind]
	if m == nil {
		m = map[string]any{}
		v.objs[ev.Kind] = m
	}
	line := fmt.Sprintf("%s %s %s", ev.Type, strings.TrimPrefix(ev.Kind.String(), "KIND_"), ev.Key)
	if ev.Vanished {
		line += " vanished"
	}
	if uid := ev.UID(); uid != "" {
		line += " uid=" + string(uid)
	}
	v.log = append(v.log, line)
	if v.observed != nil {
		v.observed[ev.Key] = ev.Observed
	}
	if ev.Type == watchclient.Deleted {
		delete(m, ev.Key)
	} else {
		m[ev.Key] = ev.Object
	}
	return nil
}

func (v *view) Keys(kind watcherv1.Kind) []string {
	var keys []string
	for k := range v.objs[kind] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (v *view) Relisted(l watchclient.Listed) { v.relisted = append(v.relisted, l) }

func (v *view) keys() []string {
	var out []string
	for _, kind := range []watcherv1.Kind{pvcKind, pvKind, classKind, podKind} {
		for _, k := range v.Keys(kind) {
			out = append(out, strings.TrimPrefix(kind.String(), "KIND_")+" "+k)
		}
	}
	return out
}

// wire is the watcher's event of obj.
func wire(t *testing.T, typ watcherv1.EventType, kind watcherv1.Kind, key string, obj any) *watcherv1.WatchResponse {
	t.Helper()
	var b []byte
	var err error
	switch o := obj.(type) {
	case nil:
	case *watcherv1.Pod:
		b, err = proto.Marshal(o)
	case kube.Object:
		b, err = kube.EncodeProto(o)
	default:
		t.Fatalf("cannot encode %T", obj)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &watcherv1.WatchResponse{Type: typ, Kind: kind, Key: key, Object: b, ResourceVersion: "1"}
}

var managed = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}

func pv(name, uid string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid), ManagedFields: managed}}
}

func pvc(name, uid string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid), ManagedFields: managed}}
}

func class(name string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("u-" + name)}, Provisioner: "p"}
}

func feed(t *testing.T, f *watchclient.Feed, evs ...*watcherv1.WatchResponse) {
	t.Helper()
	for _, ev := range evs {
		if err := f.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
}

// A full list is applied as a replace: nothing is dropped while it comes
// in; at its SYNCED every key the subscriber holds that the list did not
// mention gets a Vanished Deleted (no tombstone, no UID), kind by kind in
// the feed's order, and then Relisted tells what the list mentioned.
func TestRelistIsAReplace(t *testing.T) {
	v := newView()
	f := watchclient.NewFeed(v, pvcKind, pvKind, classKind, podKind)
	f.Reset()
	feed(t, f,
		wire(t, added, pvKind, "a", pv("a", "ua")), wire(t, added, pvKind, "b", pv("b", "ub")),
		wire(t, added, pvcKind, "ns/x", pvc("x", "ux")), wire(t, added, pvcKind, "ns/y", pvc("y", "uy")),
		wire(t, added, classKind, "fast", class("fast")),
		wire(t, added, podKind, "ns/p", &watcherv1.Pod{Namespace: "ns", Name: "p", Uid: "up"}))
	f.Synced()
	if got, want := v.keys(), []string{"PERSISTENT_VOLUME_CLAIM ns/x", "PERSISTENT_VOLUME_CLAIM ns/y", "PERSISTENT_VOLUME a", "PERSISTENT_VOLUME b", "STORAGE_CLASS fast", "POD ns/p"}; !slices.Equal(got, want) {
		t.Fatalf("after the first list the view holds %q, want %q", got, want)
	}

	// The stream was down: a, ns/x, the class and the pod were deleted
	// meanwhile; b was updated.
	v.log = nil
	f.Reset()
	feed(t, f, wire(t, added, pvKind, "b", pv("b", "ub")), wire(t, added, pvcKind, "ns/y", pvc("y", "uy")))
	if len(v.keys()) != 6 {
		t.Fatalf("objects dropped before the list ended: the view holds %q", v.keys())
	}
	f.Synced()
	want := []string{
		"added PERSISTENT_VOLUME b uid=ub", "added PERSISTENT_VOLUME_CLAIM ns/y uid=uy",
		"deleted PERSISTENT_VOLUME_CLAIM ns/x vanished", "deleted PERSISTENT_VOLUME a vanished",
		"deleted STORAGE_CLASS fast vanished", "deleted POD ns/p vanished",
	}
	if !slices.Equal(v.log, want) {
		t.Fatalf("relist applied as\n%q\nwant\n%q", v.log, want)
	}
	if got := v.keys(); !slices.Equal(got, []string{"PERSISTENT_VOLUME_CLAIM ns/y", "PERSISTENT_VOLUME b"}) {
		t.Fatalf("after the relist the view holds %q", got)
	}
	last := v.relisted[len(v.relisted)-1]
	if !last[pvKind]["b"] || last[pvKind]["a"] || !last[pvcKind]["ns/y"] || len(last[classKind]) != 0 || last[podKind] == nil {
		t.Errorf("Relisted got %v, want b and ns/y listed, an empty set for the other kinds", last)
	}

	// A SYNCED without a RESET (a watcher sends none) deletes nothing.
	v.log = nil
	f.Synced()
	if len(v.log) != 0 || v.relisted[len(v.relisted)-1] != nil {
		t.Errorf("a SYNCED without a RESET applied %q, Relisted(%v)", v.log, v.relisted[len(v.relisted)-1])
	}
}

// A DELETED carries its tombstone: the deleted object's last state, whose
// UID says which object is gone; it is not Vanished. A deletion without an
// object has no UID. ADDED and UPDATED arrive as Added and Updated.
func TestDeletedCarriesTheTombstone(t *testing.T) {
	v := newView()
	f := watchclient.NewFeed(v, pvKind, pvcKind, classKind, podKind)
	feed(t, f,
		wire(t, added, pvKind, "a", pv("a", "u1")),
		wire(t, updated, pvKind, "a", pv("a", "u1")),
		wire(t, deleted, pvKind, "a", pv("a", "u1")),
		wire(t, deleted, pvcKind, "ns/x", pvc("x", "ux")),
		wire(t, deleted, classKind, "fast", class("fast")),
		wire(t, deleted, podKind, "ns/p", &watcherv1.Pod{Namespace: "ns", Name: "p", Uid: "up"}),
		wire(t, deleted, pvKind, "b", nil))
	want := []string{
		"added PERSISTENT_VOLUME a uid=u1", "updated PERSISTENT_VOLUME a uid=u1", "deleted PERSISTENT_VOLUME a uid=u1",
		"deleted PERSISTENT_VOLUME_CLAIM ns/x uid=ux", "deleted STORAGE_CLASS fast uid=u-fast", "deleted POD ns/p uid=up",
		"deleted PERSISTENT_VOLUME b",
	}
	if !slices.Equal(v.log, want) {
		t.Fatalf("events\n%q\nwant\n%q", v.log, want)
	}
}

// Objects arrive decoded and slim; an object that does not decode is an
// error and is not applied, but a list that mentioned its key does not
// delete it. Kinds the feed was not made for are ignored.
func TestFeedDecodesAndSlims(t *testing.T) {
	v := newView()
	f := watchclient.NewFeed(v, pvKind, pvcKind)
	feed(t, f, wire(t, added, pvKind, "a", pv("a", "ua")), wire(t, added, pvcKind, "ns/x", pvc("x", "ux")))
	got, ok := v.objs[pvKind]["a"].(*corev1.PersistentVolume)
	if !ok || got.Name != "a" || got.UID != "ua" || got.ManagedFields != nil {
		t.Fatalf("volume a delivered as %#v, want decoded without managedFields", v.objs[pvKind]["a"])
	}
	if c, ok := v.objs[pvcKind]["ns/x"].(*corev1.PersistentVolumeClaim); !ok || c.ManagedFields != nil {
		t.Fatalf("claim ns/x delivered as %#v", v.objs[pvcKind]["ns/x"])
	}

	v.log = nil
	f.Reset()
	broken := &watcherv1.WatchResponse{Type: added, Kind: pvKind, Key: "a", Object: []byte{0xff, 0x01}}
	if err := f.Event(broken); err == nil {
		t.Fatal("an undecodable object was no error")
	}
	feed(t, f, wire(t, added, pvcKind, "ns/x", pvc("x", "ux")), wire(t, added, classKind, "fast", class("fast")))
	f.Synced()
	if want := []string{"added PERSISTENT_VOLUME_CLAIM ns/x uid=ux"}; !slices.Equal(v.log, want) {
		t.Fatalf("events %q, want %q (the broken a kept, the class ignored)", v.log, want)
	}
}

// The view is stale until its first full list and whenever the stream was
// not caught up with a serving watcher within maxAge; it is complete once
// listed, except while a relist comes in.
func TestStaleAndCompleteTransitions(t *testing.T) {
	const maxAge = 300 * time.Millisecond
	f := watchclient.NewFeed(newView(), pvKind)
	if !f.Stale(maxAge) || f.HasSynced() || f.Complete() || f.Relisting() {
		t.Fatal("a new feed is not stale, or is synced")
	}
	if err := f.StaleReason(maxAge); err == nil || err.Error() != "no watcher stream yet" {
		t.Fatalf("StaleReason before any stream: %v", err)
	}

	// A stream that keeps up (progress marks up to the head): fresh.
	m := &marking{every: 10 * time.Millisecond}
	cc := serveWatcher(t, m)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- f.Run(ctx, []watchclient.Watcher{{Name: "w", Conn: cc}}, watchclient.Options{ProbeInterval: 50 * time.Millisecond, StallTimeout: 5 * time.Second, MinBackoff: time.Millisecond})
	}()
	poll(t, "the stream to turn fresh", func() bool { return !f.Stale(maxAge) })
	if !f.HasSynced() || !f.Complete() || f.StaleReason(maxAge) != nil {
		t.Fatalf("fresh but synced %v, complete %v, reason %v", f.HasSynced(), f.Complete(), f.StaleReason(maxAge))
	}

	// The stream ends: the view turns stale after maxAge, and says why.
	cancel()
	<-done
	poll(t, "the view to turn stale", func() bool { return f.Stale(maxAge) })
	if err := f.StaleReason(maxAge); err == nil || !strings.Contains(err.Error(), "not caught up with a serving watcher since") {
		t.Fatalf("StaleReason after the stream ended: %v", err)
	}
	if !f.HasSynced() || !f.Complete() {
		t.Fatal("a stale view forgot its list")
	}

	// A relist: not complete until its SYNCED.
	f.Reset()
	if !f.Relisting() || f.Complete() || !f.HasSynced() {
		t.Fatalf("during a relist: relisting %v, complete %v, synced %v", f.Relisting(), f.Complete(), f.HasSynced())
	}
	f.Synced()
	if f.Relisting() || !f.Complete() {
		t.Fatal("not complete after the relist")
	}
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An event carries when the watcher's informer delivered it
// (observed_unix_nano) as Observed, at the nanosecond; an event from a
// watcher that predates the field carries the zero time, not 1970.
func TestEventObserved(t *testing.T) {
	v := newView()
	v.observed = map[string]time.Time{}
	f := watchclient.NewFeed(v, pvKind, pvcKind)
	at := time.Date(2026, 11, 27, 18, 0, 0, 123456789, time.UTC)
	with := wire(t, added, pvcKind, "ns/x", pvc("x", "ux"))
	with.ObservedUnixNano = at.UnixNano()
	feed(t, f, with, wire(t, added, pvKind, "a", pv("a", "ua")))
	if got := v.observed["ns/x"]; !got.Equal(at) {
		t.Errorf("Observed %v, want %v", got, at)
	}
	if got, ok := v.observed["a"]; !ok || !got.IsZero() {
		t.Errorf("no observed time sent: Observed %v (present %v), want the zero time", got, ok)
	}
}
