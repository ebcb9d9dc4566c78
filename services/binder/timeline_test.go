package binder

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/timeline"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

type fakeTimeline struct {
	resp *provisionerv1.GetClaimTimelineResponse
	err  error
	uid  string
}

func (f *fakeTimeline) Timeline(_ context.Context, uid string) (*provisionerv1.GetClaimTimelineResponse, error) {
	f.uid = uid
	return f.resp, f.err
}

// TestGetClaimTimeline: a claim's sync is recorded (a bound claim's is
// not), the provisioner's spans are merged by start time, and a
// provisioner that does not answer is named in missing, not an error.
func TestGetClaimTimeline(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset()
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, record.NewFakeRecorder(100))
	c.timeline = timeline.New(100, 16, nil)
	c.Reset()
	waiting := testClaim("waiting")
	waiting.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Second))
	bound := testClaim("bound")
	bound.Status.Phase = "Bound"
	bound.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
	for _, cl := range []string{"waiting", "bound"} {
		obj := waiting
		if cl == "bound" {
			obj = bound
		}
		if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Event(event(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/"+cl, obj)); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	for _, key := range []string{"ns/waiting", "ns/bound"} {
		if err := c.syncClaimKey(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	provStart := time.Now().Add(time.Hour)
	ptl := &fakeTimeline{resp: &provisionerv1.GetClaimTimelineResponse{Dropped: 2, Spans: []*provisionerv1.TimelineSpan{
		{Service: "provisioner", Name: "CreateVolume", StartTime: timestamppb.New(provStart), EndTime: timestamppb.New(provStart.Add(time.Second)), Code: "OK"},
	}}}
	a := &api{c: c, memberID: "m", members: func() []string { return []string{"m"} }, workers: 1, ptl: ptl}

	resp, err := a.GetClaimTimeline(ctx, &binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "waiting"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetSpans() {
		names = append(names, s.GetService()+"/"+s.GetName())
	}
	want := []string{"binder/seen", "binder/queued", "binder/sync", "provisioner/CreateVolume"}
	if len(names) != len(want) {
		t.Fatalf("spans %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("spans %v, want %v", names, want)
		}
	}
	if ptl.uid != "uid-waiting" || resp.GetDropped() != 2 || len(resp.GetMissing()) != 0 || resp.GetMemberId() != "m" {
		t.Errorf("asked for %q; dropped %d, missing %v", ptl.uid, resp.GetDropped(), resp.GetMissing())
	}
	if sync := resp.GetSpans()[2]; sync.GetCode() == "" || sync.GetMemberId() != "m" {
		t.Errorf("sync span %v", sync)
	}

	resp, err = a.GetClaimTimeline(ctx, &binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "bound"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range resp.GetSpans() {
		if s.GetService() == "binder" {
			t.Errorf("a bound claim's sync was recorded: %v", s)
		}
	}

	ptl.err = status.Error(codes.Unavailable, "provisioner down")
	resp, err = a.GetClaimTimeline(ctx, &binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "waiting"})
	if err != nil || len(resp.GetMissing()) != 1 || len(resp.GetSpans()) != 3 {
		t.Errorf("provisioner down: %v, missing %v, %d spans", err, resp.GetMissing(), len(resp.GetSpans()))
	}

	off := &api{c: newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, record.NewFakeRecorder(1)), memberID: "m",
		members: func() []string { return []string{"m"} }, workers: 1, ptl: ptl}
	off.c.Reset()
	if err := off.c.Event(event(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/waiting", waiting)); err != nil {
		t.Fatal(err)
	}
	off.c.Synced()
	if _, err := off.GetClaimTimeline(ctx, &binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "waiting"}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "--timeline=false") {
		t.Errorf("timeline off: %v, want FailedPrecondition naming --timeline=false", err)
	}

	for name, tc := range map[string]struct {
		req  *binderv1.GetClaimTimelineRequest
		code codes.Code
	}{
		"unknown claim":  {&binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "nope"}, codes.NotFound},
		"bad name":       {&binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "No_Such"}, codes.InvalidArgument},
		"bad namespace":  {&binderv1.GetClaimTimelineRequest{Namespace: "../x", Name: "waiting"}, codes.InvalidArgument},
		"no name at all": {&binderv1.GetClaimTimelineRequest{}, codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := a.GetClaimTimeline(ctx, tc.req); status.Code(err) != tc.code {
				t.Errorf("%v, want %v", err, tc.code)
			}
		})
	}
}

// TestTimelineWaitForFirstConsumer: a claim of a WaitForFirstConsumer
// class shows its wait for a pod as one span: open (WAITING, ending at
// the answer) while it waits, however many syncs it takes, then closed by
// the sync that sees the selected node, naming it. A deleted claim's wait
// is forgotten.
func TestTimelineWaitForFirstConsumer(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset()
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, record.NewFakeRecorder(100))
	c.timeline = timeline.New(100, 32, nil)
	c.Reset()
	add, mod := watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.EventType_EVENT_TYPE_UPDATED
	pvc := watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
	if err := c.Event(event(add, watcherv1.Kind_KIND_STORAGE_CLASS, "c", class("c", "p", storagev1.VolumeBindingWaitForFirstConsumer, false))); err != nil {
		t.Fatal(err)
	}
	cl := testClaim("data")
	cl.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Second))
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, cl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Event(event(add, pvc, "ns/data", cl)); err != nil {
		t.Fatal(err)
	}
	c.Synced()
	a := &api{c: c, memberID: "m", members: func() []string { return []string{"m"} }, workers: 1}
	waits := func() (open, closed []*provisionerv1.TimelineSpan) {
		t.Helper()
		resp, err := a.GetClaimTimeline(ctx, &binderv1.GetClaimTimelineRequest{Namespace: "ns", Name: "data"})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetSpans() {
			if s.GetName() != waitSpan {
				continue
			}
			if s.GetCode() == waitingCode {
				open = append(open, s)
			} else {
				closed = append(closed, s)
			}
		}
		return open, closed
	}
	for range 3 { // the first sync, then resyncs: one wait
		if err := c.syncClaimKey(ctx, "ns/data"); err != nil {
			t.Fatal(err)
		}
	}
	began, ok := c.waits.waiting(cl.UID)
	if !ok {
		t.Fatal("no wait noted after a WAIT_FOR_FIRST_CONSUMER sync")
	}
	open, closed := waits()
	if len(open) != 1 || len(closed) != 0 || !open[0].GetStartTime().AsTime().Equal(began) || open[0].GetEndTime().AsTime().Before(began) {
		t.Fatalf("while waiting: open %v, closed %v (began %s)", open, closed, began)
	}

	// The scheduler selects a node: the next sync ends the wait.
	cl = cl.DeepCopy()
	cl.ResourceVersion = "2"
	cl.Annotations = map[string]string{kube.AnnSelectedNode: "node-1"}
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, cl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Event(event(mod, pvc, "ns/data", cl)); err != nil {
		t.Fatal(err)
	}
	if err := c.syncClaimKey(ctx, "ns/data"); err != nil {
		t.Fatal(err)
	}
	open, closed = waits()
	if len(open) != 0 || len(closed) != 1 || !closed[0].GetStartTime().AsTime().Equal(began) || !strings.Contains(closed[0].GetDetail(), `"node-1"`) {
		t.Fatalf("after the node was selected: open %v, closed %v", open, closed)
	}
	if _, ok := c.waits.waiting(cl.UID); ok {
		t.Error("the wait is still noted after it ended")
	}

	// A claim deleted while it waits: its wait is forgotten.
	other := testClaim("other")
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Event(event(add, pvc, "ns/other", other)); err != nil {
		t.Fatal(err)
	}
	if err := c.syncClaimKey(ctx, "ns/other"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.waits.waiting(other.UID); !ok {
		t.Fatal("no wait noted for the second claim")
	}
	if err := c.Event(event(watcherv1.EventType_EVENT_TYPE_DELETED, pvc, "ns/other", other)); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.waits.waiting(other.UID); ok {
		t.Error("a deleted claim's wait is still noted")
	}
	// A sync that was running when the claim was deleted starts no wait
	// that nothing would end.
	c.noteWait(ctx, other, binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER)
	if _, ok := c.waits.waiting(other.UID); ok || c.waits.n.Load() != 0 {
		t.Errorf("a wait was started for a claim gone from the cache (%d noted)", c.waits.n.Load())
	}
}

// TestTimelineSeenSplit: a claim's first watch event records its way to
// the binder as two spans, watch (created → the watcher's informer) and
// stream (the informer → the binder), in order and never negative, also
// when the watcher's clock is skewed either way (clamped, and said so); a
// watcher that sends no observed time gives the one span seen, as before.
// Only the first event of a tracked claim records them.
func TestTimelineSeenSplit(t *testing.T) {
	created := time.Now().Add(-10 * time.Second).Truncate(time.Second)
	for name, tc := range map[string]struct {
		observed time.Time // zero: an older watcher
		names    []string
		skewed   bool
		// watch: how long the watch span takes at least and at most.
		watchMin, watchMax time.Duration
	}{
		"watcher's time":            {observed: created.Add(3 * time.Second), names: []string{watchSpan, streamSpan}, watchMin: 3 * time.Second, watchMax: 3 * time.Second},
		"watcher's clock ahead":     {observed: time.Now().Add(time.Hour), names: []string{watchSpan, streamSpan}, skewed: true, watchMin: 10 * time.Second, watchMax: time.Minute},
		"watcher's clock behind":    {observed: created.Add(-time.Hour), names: []string{watchSpan, streamSpan}, skewed: true, watchMin: 0, watchMax: 0},
		"watcher sends no time":     {names: []string{seenSpan}},
		"watcher at the same clock": {observed: created, names: []string{watchSpan, streamSpan}, watchMin: 0, watchMax: 0},
	} {
		t.Run(name, func(t *testing.T) {
			c := newController(slog.New(slog.DiscardHandler), fake.NewClientset(), record.NewFakeRecorder(100))
			c.timeline = timeline.New(100, 16, nil)
			c.Reset()
			claim := testClaim("c")
			claim.CreationTimestamp = metav1.NewTime(created)
			ev := event(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/c", claim)
			if !tc.observed.IsZero() {
				ev.ObservedUnixNano = tc.observed.UnixNano()
			}
			before := time.Now()
			if err := c.Event(ev); err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			// A later event of the same claim records nothing more.
			ev.ObservedUnixNano = time.Now().UnixNano()
			if err := c.Event(ev); err != nil {
				t.Fatal(err)
			}
			spans, _ := c.timeline.Spans(string(claim.UID))
			var names []string
			for _, s := range spans {
				names = append(names, s.Name)
				if s.Duration() < 0 {
					t.Errorf("span %s is negative: %s", s.Name, s.Duration())
				}
				if s.StartTime().Before(created) || s.EndTime().After(after) {
					t.Errorf("span %s from %s to %s: outside [created %s, received %s]", s.Name, s.StartTime(), s.EndTime(), created, after)
				}
				if !strings.Contains(s.Detail, "whole seconds") && s.Name != streamSpan {
					t.Errorf("span %s detail %q does not say the creationTimestamp has whole seconds", s.Name, s.Detail)
				}
				if strings.Contains(s.Detail, "clamped") != tc.skewed {
					t.Errorf("span %s detail %q: says clamped %v, want %v", s.Name, s.Detail, !tc.skewed, tc.skewed)
				}
			}
			if strings.Join(names, ",") != strings.Join(tc.names, ",") {
				t.Fatalf("spans %v, want %v", names, tc.names)
			}
			if len(spans) == 2 {
				w, s := spans[0], spans[1]
				if !w.StartTime().Equal(created) || w.End != s.Start || s.EndTime().Before(before) {
					t.Errorf("watch %s..%s, stream %s..%s: not created → observed → received (%s)", w.StartTime(), w.EndTime(), s.StartTime(), s.EndTime(), before)
				}
				if d := w.Duration(); d < tc.watchMin || d > tc.watchMax {
					t.Errorf("watch took %s, want %s to %s", d, tc.watchMin, tc.watchMax)
				}
			}
		})
	}
}

// TestSeenTimesClamps: skew between the API server's, the watcher's and
// the binder's clocks never makes a span negative, and the binder's now is
// never moved.
func TestSeenTimesClamps(t *testing.T) {
	now := time.Now()
	s := time.Second
	for name, tc := range map[string]struct {
		created, observed time.Time
		wantC, wantO      time.Time
		skewed            bool
	}{
		"in order":                     {now.Add(-3 * s), now.Add(-s), now.Add(-3 * s), now.Add(-s), false},
		"watcher ahead of the binder":  {now.Add(-3 * s), now.Add(s), now.Add(-3 * s), now, true},
		"watcher behind the server":    {now.Add(-3 * s), now.Add(-4 * s), now.Add(-3 * s), now.Add(-3 * s), true},
		"binder behind the server":     {now.Add(2 * s), now.Add(3 * s), now, now, true},
		"binder behind, no watch time": {now.Add(2 * s), time.Time{}, now, time.Time{}, true},
		"no watch time":                {now.Add(-2 * s), time.Time{}, now.Add(-2 * s), time.Time{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			c, o, n, skewed := seenTimes(tc.created, tc.observed, now)
			if !c.Equal(tc.wantC) || !o.Equal(tc.wantO) || !n.Equal(now) || skewed != tc.skewed {
				t.Errorf("got %s, %s, %s, skewed %v; want %s, %s, %s, %v", c, o, n, skewed, tc.wantC, tc.wantO, now, tc.skewed)
			}
			if c.After(n) || (!o.IsZero() && (o.Before(c) || o.After(n))) {
				t.Errorf("not ordered: %s, %s, %s", c, o, n)
			}
		})
	}
}
