package watcher

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// The tests in this file drive the hub and server.Watch directly, through a
// stream whose Send blocks until the test has looked at the event: the test
// decides exactly how far behind a subscriber is.

const (
	typeAdded   = watcherv1.EventType_EVENT_TYPE_ADDED
	typeUpdated = watcherv1.EventType_EVENT_TYPE_UPDATED
	typeDeleted = watcherv1.EventType_EVENT_TYPE_DELETED
	typeSynced  = watcherv1.EventType_EVENT_TYPE_SYNCED
	typeReset   = watcherv1.EventType_EVENT_TYPE_RESET
	kindPV      = watcherv1.Kind_KIND_PERSISTENT_VOLUME
	kindPVC     = watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
	kindClass   = watcherv1.Kind_KIND_STORAGE_CLASS
)

// lockstep is a Watch stream that hands each event to the test and waits
// until the test asks for the next one.
type lockstep struct {
	grpc.ServerStream // nil: only Context and Send are used
	ctx               context.Context
	out               chan *watcherv1.WatchResponse
	ack               chan struct{}
}

func (l *lockstep) Context() context.Context { return l.ctx }

func (l *lockstep) Send(ev *watcherv1.WatchResponse) error {
	select {
	case l.out <- ev:
	case <-l.ctx.Done():
		return status.FromContextError(l.ctx.Err()).Err()
	}
	select {
	case <-l.ack:
		return nil
	case <-l.ctx.Done():
		// What gRPC returns when the client has gone.
		return status.FromContextError(l.ctx.Err()).Err()
	}
}

// release lets a Send blocked on the event the test holds return.
func (s *subscriber) release() {
	if s.pending {
		select {
		case s.st.ack <- struct{}{}:
		case <-s.st.ctx.Done():
		}
		s.pending = false
	}
}

// subscriber is one Watch call running against a server.
type subscriber struct {
	t       *testing.T
	st      *lockstep
	pending bool // the stream is blocked in Send until the next recv
	done    chan error
	cancel  context.CancelFunc
}

func newTestServer(history int, synced bool) (*hub, *server, chan struct{}) {
	h := newHub(history)
	if synced {
		h.markSynced()
	}
	stopping := make(chan struct{})
	return h, &server{hub: h, log: slog.New(slog.DiscardHandler), stopping: stopping}, stopping
}

func watch(t *testing.T, s *server, req *watcherv1.WatchRequest) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	st := &lockstep{ctx: ctx, out: make(chan *watcherv1.WatchResponse), ack: make(chan struct{})}
	sub := &subscriber{t: t, st: st, done: make(chan error, 1), cancel: cancel}
	go func() { sub.done <- s.Watch(req, st) }()
	t.Cleanup(func() {
		cancel()
		<-sub.done
	})
	return sub
}

// recv returns the next event; the stream stays blocked in Send until the
// next recv or end.
func (s *subscriber) recv() *watcherv1.WatchResponse {
	s.t.Helper()
	s.release()
	select {
	case ev := <-s.st.out:
		s.pending = true
		return ev
	case err := <-s.done:
		s.done <- err
		s.t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		s.t.Fatal("no event within 10s")
	}
	return nil
}

// end returns Watch's error once it has returned.
func (s *subscriber) end() error {
	s.t.Helper()
	s.release()
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case ev := <-s.st.out:
		s.t.Fatalf("unexpected event %v", ev)
	case <-time.After(10 * time.Second):
		s.t.Fatal("Watch did not return within 10s")
	}
	return nil
}

// expectEvent checks an event's type, key and cursor sequence.
func expectEvent(t *testing.T, h *hub, ev *watcherv1.WatchResponse, typ watcherv1.EventType, key string, seq uint64) {
	t.Helper()
	if ev.GetType() != typ || ev.GetKey() != key || ev.GetCursor().GetSequence() != seq || ev.GetCursor().GetEpoch() != h.epoch {
		t.Fatalf("got %v %q at %s/%d, want %v %q at %s/%d", ev.GetType(), ev.GetKey(),
			ev.GetCursor().GetEpoch(), ev.GetCursor().GetSequence(), typ, key, h.epoch, seq)
	}
}

// expectList reads RESET, a full list and SYNCED, all at cursor seq, and
// returns the listed keys in order.
func expectList(t *testing.T, h *hub, s *subscriber, seq uint64) []string {
	t.Helper()
	expectEvent(t, h, s.recv(), typeReset, "", seq)
	var keys []string
	for {
		ev := s.recv()
		if ev.GetType() == typeSynced {
			expectEvent(t, h, ev, typeSynced, "", seq)
			return keys
		}
		expectEvent(t, h, ev, typeAdded, ev.GetKey(), seq)
		if len(ev.GetObject()) == 0 || ev.GetResourceVersion() == "" {
			t.Fatalf("listed %q without object or resourceVersion", ev.GetKey())
		}
		keys = append(keys, ev.GetKey())
	}
}

func volume(name, rv string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
}

func claim(ns, name, rv string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}}
}

func class(name, rv string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}, Provisioner: "csi.example.com"}
}

// addPVs appends ADDED events for volumes named prefix0, prefix1, ...
func addPVs(h *hub, prefix string, n int) {
	for i := range n {
		name := fmt.Sprintf("%s%d", prefix, i)
		h.append(typeAdded, kindPV, name, volume(name, "1"), "1")
	}
}

func sorted(keys []string) string {
	s := append([]string(nil), keys...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return strings.Join(s, ",")
}

func TestHandlerFeedsTheHub(t *testing.T) {
	h := newHub(10)
	log := slog.New(slog.DiscardHandler)
	claims := handler(h, kindPVC, log)
	claims.OnAdd(claim("ns", "c", "1"), true)
	claims.OnUpdate(claim("ns", "c", "1"), claim("ns", "c", "1")) // a resync: skipped
	claims.OnUpdate(claim("ns", "c", "1"), claim("ns", "c", "2"))
	claims.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/c", Obj: claim("ns", "c", "3")})
	volumes := handler(h, kindPV, log)
	volumes.OnAdd(volume("v", "4"), false)
	volumes.OnDelete(volume("v", "5"))
	handler(h, kindClass, log).OnAdd(class("fast", "6"), false)

	want := []struct {
		typ  watcherv1.EventType
		kind watcherv1.Kind
		key  string
		rv   string
	}{
		{typeAdded, kindPVC, "ns/c", "1"},
		{typeUpdated, kindPVC, "ns/c", "2"},
		{typeDeleted, kindPVC, "ns/c", "3"},
		{typeAdded, kindPV, "v", "4"},
		{typeDeleted, kindPV, "v", "5"},
		{typeAdded, kindClass, "fast", "6"},
	}
	h.mu.Lock()
	evs, ok, _ := h.since(0, 100)
	h.mu.Unlock()
	if !ok || len(evs) != len(want) {
		t.Fatalf("since(0): %d events, ok %v; want %d", len(evs), ok, len(want))
	}
	for i, w := range want {
		e := evs[i]
		if e.seq != uint64(i+1) || e.typ != w.typ || e.kind != w.kind || e.key != w.key || e.rv != w.rv {
			t.Errorf("event %d: got seq %d %v %v %q rv %q, want %v %v %q rv %q", i, e.seq, e.typ, e.kind, e.key, e.rv, w.typ, w.kind, w.key, w.rv)
		}
	}
	// The tombstone's object, not the tombstone, is what a DELETED carries.
	b, err := evs[2].encode(watcherv1.Encoding_ENCODING_PROTOBUF)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := kube.DecodeClaim(b); err != nil || c.Name != "c" || c.ResourceVersion != "3" {
		t.Fatalf("DELETED object: %v, %v", c, err)
	}
	if pv, pvc, sc, _ := h.counts(); pv != 0 || pvc != 0 || sc != 1 {
		t.Fatalf("state holds %d volumes, %d claims, %d classes; want 0, 0, 1", pv, pvc, sc)
	}
}

func TestEncodeOncePerEncoding(t *testing.T) {
	h := newHub(10)
	h.append(typeAdded, kindClass, "fast", class("fast", "7"), "7")
	e := h.ring[1]
	p1, _ := e.encode(watcherv1.Encoding_ENCODING_UNSPECIFIED)
	p2, _ := e.encode(watcherv1.Encoding_ENCODING_PROTOBUF)
	j1, _ := e.encode(watcherv1.Encoding_ENCODING_JSON)
	j2, err := e.encode(watcherv1.Encoding_ENCODING_JSON)
	if err != nil {
		t.Fatal(err)
	}
	if &p1[0] != &p2[0] || &j1[0] != &j2[0] {
		t.Fatal("an event was encoded more than once in one encoding")
	}
	if sc, err := kube.DecodeStorageClass(p1); err != nil || sc.Provisioner != "csi.example.com" {
		t.Fatalf("protobuf: %v, %v", sc, err)
	}
	if !strings.Contains(string(j1), `"kind":"StorageClass"`) || !strings.Contains(string(j1), `"apiVersion":"storage.k8s.io/v1"`) {
		t.Fatalf("JSON lacks kind and apiVersion: %s", j1)
	}
}

func TestWatchListsThenStreamsInOrder(t *testing.T) {
	h, s, _ := newTestServer(100, true)
	h.append(typeAdded, kindPVC, "ns/c", claim("ns", "c", "1"), "1")
	h.append(typeAdded, kindPV, "a", volume("a", "2"), "2")
	h.append(typeAdded, kindClass, "fast", class("fast", "3"), "3")
	h.append(typeAdded, kindPV, "b", volume("b", "4"), "4")
	h.append(typeUpdated, kindPV, "a", volume("a", "5"), "5")
	h.append(typeDeleted, kindPV, "b", volume("b", "6"), "6")

	sub := watch(t, s, &watcherv1.WatchRequest{})
	// Classes, then volumes, then claims; b is gone.
	if got := expectList(t, h, sub, 6); strings.Join(got, ",") != "fast,a,ns/c" {
		t.Fatalf("list %v, want fast,a,ns/c", got)
	}
	h.append(typeAdded, kindPV, "d", volume("d", "7"), "7")
	h.append(typeUpdated, kindPVC, "ns/c", claim("ns", "c", "8"), "8")
	h.append(typeDeleted, kindPV, "a", volume("a", "9"), "9")
	expectEvent(t, h, sub.recv(), typeAdded, "d", 7)
	up := sub.recv()
	expectEvent(t, h, up, typeUpdated, "ns/c", 8)
	if up.GetKind() != kindPVC || up.GetResourceVersion() != "8" {
		t.Fatalf("update: kind %v rv %q", up.GetKind(), up.GetResourceVersion())
	}
	del := sub.recv()
	expectEvent(t, h, del, typeDeleted, "a", 9)
	if v, err := kube.DecodeVolume(del.GetObject()); err != nil || v.ResourceVersion != "9" {
		t.Fatalf("DELETED object: %v, %v", v, err)
	}
}

func TestWatchResume(t *testing.T) {
	const history = 4
	for _, tc := range []struct {
		name   string
		cursor func(h *hub) *watcherv1.Cursor
		// first is the sequence of the first replayed event; 0 means a
		// full list is expected instead.
		first uint64
	}{
		{"within the ring", func(h *hub) *watcherv1.Cursor { return &watcherv1.Cursor{Epoch: h.epoch, Sequence: 7} }, 8},
		{"just before the oldest kept event", func(h *hub) *watcherv1.Cursor { return &watcherv1.Cursor{Epoch: h.epoch, Sequence: 6} }, 7},
		{"at the newest event", func(h *hub) *watcherv1.Cursor { return &watcherv1.Cursor{Epoch: h.epoch, Sequence: 10} }, 11},
		{"events dropped from the ring", func(h *hub) *watcherv1.Cursor { return &watcherv1.Cursor{Epoch: h.epoch, Sequence: 5} }, 0},
		{"another epoch", func(h *hub) *watcherv1.Cursor { return &watcherv1.Cursor{Epoch: "0123456789abcdef", Sequence: 9} }, 0},
		{"no epoch", func(h *hub) *watcherv1.Cursor { return &watcherv1.Cursor{Sequence: 9} }, 0},
		{"no cursor", func(h *hub) *watcherv1.Cursor { return nil }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, s, _ := newTestServer(history, true)
			addPVs(h, "pv", 10) // the ring holds 7..10
			sub := watch(t, s, &watcherv1.WatchRequest{ResumeAfter: tc.cursor(h)})
			if tc.first == 0 {
				if got := sorted(expectList(t, h, sub, 10)); got != "pv0,pv1,pv2,pv3,pv4,pv5,pv6,pv7,pv8,pv9" {
					t.Fatalf("list %v", got)
				}
				h.append(typeDeleted, kindPV, "pv0", volume("pv0", "2"), "2")
				expectEvent(t, h, sub.recv(), typeDeleted, "pv0", 11)
				return
			}
			for seq := tc.first; seq <= 10; seq++ {
				expectEvent(t, h, sub.recv(), typeAdded, fmt.Sprintf("pv%d", seq-1), seq)
			}
			h.append(typeDeleted, kindPV, "pv0", volume("pv0", "2"), "2")
			expectEvent(t, h, sub.recv(), typeDeleted, "pv0", 11)
		})
	}
}

func TestWatchInvalidRequests(t *testing.T) {
	h, s, _ := newTestServer(10, true)
	addPVs(h, "pv", 3)
	for _, tc := range []struct {
		name string
		req  *watcherv1.WatchRequest
		msg  string
	}{
		{"unknown kind", &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPV, 42}}, "kinds"},
		{"unspecified kind", &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_UNSPECIFIED}}, "kinds"},
		{"unknown encoding", &watcherv1.WatchRequest{Encoding: 9}, "encoding"},
		{"cursor ahead of the newest event", &watcherv1.WatchRequest{ResumeAfter: &watcherv1.Cursor{Epoch: h.epoch, Sequence: 4}}, "resume_after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := watch(t, s, tc.req).end()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want InvalidArgument about %s", err, tc.msg)
			}
		})
	}
	if st, _ := s.GetStatus(t.Context(), nil); st.GetSubscribers() != 0 {
		t.Fatalf("%d subscribers after rejected requests", st.GetSubscribers())
	}
}

func TestWatchKinds(t *testing.T) {
	h, s, _ := newTestServer(100, true)
	h.append(typeAdded, kindPV, "a", volume("a", "1"), "1")
	h.append(typeAdded, kindPVC, "ns/c", claim("ns", "c", "2"), "2")
	h.append(typeAdded, kindClass, "fast", class("fast", "3"), "3")

	claims := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPVC}})
	if got := expectList(t, h, claims, 3); strings.Join(got, ",") != "ns/c" {
		t.Fatalf("claims list %v", got)
	}
	others := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindClass, kindPV, kindClass}, Encoding: watcherv1.Encoding_ENCODING_JSON})
	if got := expectList(t, h, others, 3); strings.Join(got, ",") != "fast,a" {
		t.Fatalf("volumes and classes list %v", got)
	}
	h.append(typeUpdated, kindPV, "a", volume("a", "4"), "4")
	h.append(typeUpdated, kindPVC, "ns/c", claim("ns", "c", "5"), "5")
	h.append(typeDeleted, kindClass, "fast", class("fast", "6"), "6")
	expectEvent(t, h, claims.recv(), typeUpdated, "ns/c", 5)
	expectEvent(t, h, others.recv(), typeUpdated, "a", 4)
	del := others.recv()
	expectEvent(t, h, del, typeDeleted, "fast", 6)
	if !strings.Contains(string(del.GetObject()), `"kind":"StorageClass"`) {
		t.Fatalf("JSON requested, got %q", del.GetObject())
	}

	// Resuming a filtered stream skips the other kinds' events too.
	resumed := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPV}, ResumeAfter: &watcherv1.Cursor{Epoch: h.epoch, Sequence: 1}})
	expectEvent(t, h, resumed.recv(), typeUpdated, "a", 4)
	h.append(typeAdded, kindPVC, "ns/d", claim("ns", "d", "7"), "7")
	h.append(typeAdded, kindPV, "b", volume("b", "8"), "8")
	expectEvent(t, h, resumed.recv(), typeAdded, "b", 8)
}

// A subscriber that reads so slowly that the ring drops events it has not
// been sent gets RESET, a fresh list and SYNCED in the same stream, then
// the live events after that list.
func TestSlowSubscriberGetsAFullListInline(t *testing.T) {
	h, s, _ := newTestServer(4, true)
	addPVs(h, "old", 2)
	sub := watch(t, s, &watcherv1.WatchRequest{})
	expectList(t, h, sub, 2)

	h.append(typeAdded, kindPV, "slow", volume("slow", "1"), "1")
	expectEvent(t, h, sub.recv(), typeAdded, "slow", 3)
	// While the subscriber holds event 3, six more arrive: the ring of
	// four keeps 6..9, and 4 and 5 are lost to it.
	addPVs(h, "new", 5)
	h.append(typeDeleted, kindPV, "old0", volume("old0", "1"), "1")
	if got := sorted(expectList(t, h, sub, 9)); got != "new0,new1,new2,new3,new4,old1,slow" {
		t.Fatalf("inline list %v", got)
	}
	h.append(typeDeleted, kindPV, "slow", volume("slow", "1"), "1")
	expectEvent(t, h, sub.recv(), typeDeleted, "slow", 10)
}

// Many subscribers read the one ring at their own pace and all see the
// same events in the same order.
func TestManySubscribers(t *testing.T) {
	h, s, _ := newTestServer(1000, true)
	subs := make([]*subscriber, 50)
	for i := range subs {
		subs[i] = watch(t, s, &watcherv1.WatchRequest{})
		expectList(t, h, subs[i], 0)
	}
	addPVs(h, "pv", 200)
	for _, sub := range subs {
		for seq := uint64(1); seq <= 200; seq++ {
			expectEvent(t, h, sub.recv(), typeAdded, fmt.Sprintf("pv%d", seq-1), seq)
		}
	}
	st, err := s.GetStatus(t.Context(), &watcherv1.GetStatusRequest{})
	if err != nil || st.GetSubscribers() != 50 {
		t.Fatalf("status %v, %v; want 50 subscribers", st, err)
	}
	for _, sub := range subs {
		sub.cancel()
		if err := sub.end(); status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled stream ended with %v", err)
		}
	}
	if st, _ := s.GetStatus(t.Context(), &watcherv1.GetStatusRequest{}); st.GetSubscribers() != 0 {
		t.Fatalf("%d subscribers after all left", st.GetSubscribers())
	}
}

func TestWatchWaitsForSync(t *testing.T) {
	h, s, _ := newTestServer(10, false)
	addPVs(h, "pv", 2)
	sub := watch(t, s, &watcherv1.WatchRequest{})
	gone := watch(t, s, &watcherv1.WatchRequest{})
	gone.cancel()
	if err := gone.end(); status.Code(err) != codes.Canceled {
		t.Fatalf("a stream cancelled before sync ended with %v", err)
	}
	select {
	case ev := <-sub.st.out:
		t.Fatalf("event %v before the informers synced", ev)
	case <-time.After(50 * time.Millisecond):
	}
	addPVs(h, "late", 1)
	h.markSynced()
	if got := sorted(expectList(t, h, sub, 3)); got != "late0,pv0,pv1" {
		t.Fatalf("list %v", got)
	}
}

func TestStoppingEndsStreams(t *testing.T) {
	h, s, stopping := newTestServer(10, true)
	sub := watch(t, s, &watcherv1.WatchRequest{})
	expectList(t, h, sub, 0)
	close(stopping)
	if err := sub.end(); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream ended with %v, want Unavailable", err)
	}
}

func TestGetStatus(t *testing.T) {
	h, s, _ := newTestServer(3, false)
	st, _ := s.GetStatus(t.Context(), &watcherv1.GetStatusRequest{})
	if st.GetSynced() || st.GetSequence() != 0 || st.GetOldestSequence() != 1 || len(st.GetEpoch()) != 16 {
		t.Fatalf("empty status %v", st)
	}
	addPVs(h, "pv", 4)
	h.append(typeAdded, kindPVC, "ns/c", claim("ns", "c", "1"), "1")
	h.append(typeAdded, kindClass, "fast", class("fast", "1"), "1")
	h.markSynced()
	sub := watch(t, s, &watcherv1.WatchRequest{})
	expectList(t, h, sub, 6)
	st, _ = s.GetStatus(t.Context(), &watcherv1.GetStatusRequest{})
	if !st.GetSynced() || st.GetSequence() != 6 || st.GetOldestSequence() != 4 || st.GetEpoch() != h.epoch ||
		st.GetPersistentVolumes() != 4 || st.GetPersistentVolumeClaims() != 1 || st.GetStorageClasses() != 1 || st.GetSubscribers() != 1 {
		t.Fatalf("status %v", st)
	}
}

// TestEventsCarryObservedTime: every event carries when the informer
// delivered it (observed_unix_nano, the watcher's clock), live or in a
// full list, where an object's entry carries the time of its current
// state (not the list's); RESET and SYNCED carry none.
func TestEventsCarryObservedTime(t *testing.T) {
	h, s, _ := newTestServer(100, true)
	appendAt := func(typ watcherv1.EventType, kind watcherv1.Kind, key string, obj kube.Object, rv string) (lo, hi int64) {
		lo = time.Now().UnixNano()
		h.append(typ, kind, key, obj, rv)
		return lo, time.Now().UnixNano()
	}
	within := func(what string, ev *watcherv1.WatchResponse, lo, hi int64) {
		t.Helper()
		if got := ev.GetObservedUnixNano(); got < lo || got > hi {
			t.Errorf("%s %s: observed %d, want within [%d, %d]", what, ev.GetKey(), got, lo, hi)
		}
	}
	appendAt(typeAdded, kindPVC, "ns/c", claim("ns", "c", "1"), "1")
	upLo, upHi := appendAt(typeUpdated, kindPVC, "ns/c", claim("ns", "c", "2"), "2")
	volLo, volHi := appendAt(typeAdded, kindPV, "a", volume("a", "3"), "3")

	sub := watch(t, s, &watcherv1.WatchRequest{})
	if ev := sub.recv(); ev.GetType() != typeReset || ev.GetObservedUnixNano() != 0 {
		t.Fatalf("RESET %v: observed %d, want 0", ev.GetType(), ev.GetObservedUnixNano())
	}
	for range 2 {
		ev := sub.recv()
		switch ev.GetKey() {
		case "a":
			within("listed", ev, volLo, volHi)
		case "ns/c":
			within("listed (its update's time)", ev, upLo, upHi)
		default:
			t.Fatalf("listed %v %q", ev.GetType(), ev.GetKey())
		}
	}
	if ev := sub.recv(); ev.GetType() != typeSynced || ev.GetObservedUnixNano() != 0 {
		t.Fatalf("SYNCED %v: observed %d, want 0", ev.GetType(), ev.GetObservedUnixNano())
	}
	for _, tc := range []struct {
		typ watcherv1.EventType
		rv  string
	}{{typeAdded, "4"}, {typeUpdated, "5"}, {typeDeleted, "6"}} {
		lo, hi := appendAt(tc.typ, kindPVC, "ns/d", claim("ns", "d", tc.rv), tc.rv)
		ev := sub.recv()
		expectEvent(t, h, ev, tc.typ, "ns/d", ev.GetCursor().GetSequence())
		within("live "+tc.typ.String(), ev, lo, hi)
	}
}

// Appending an event of an informer's object (already encoded by the
// transform) allocates the event and the next notify channel, nothing
// more: its observed time is a field of the event.
func TestAppendAllocations(t *testing.T) {
	h := newHub(16)
	obj, err := transform(volume("a", "1"))
	if err != nil {
		t.Fatal(err)
	}
	enc := obj.(kube.Object)
	if n := testing.AllocsPerRun(100, func() { h.append(typeUpdated, kindPV, "a", enc, "1") }); n > 2 {
		t.Errorf("%v allocations per append, want at most 2 (the event, the notify channel)", n)
	}
}
