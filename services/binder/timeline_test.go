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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

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
