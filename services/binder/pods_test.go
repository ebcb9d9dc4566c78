package binder

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// The wording is kube-controller-manager's
// (emitEventForUnboundDelayBindingClaim), byte for byte.
func TestWaitEvent(t *testing.T) {
	for _, tc := range []struct {
		name            string
		pods            []string
		reason, message string
	}{
		{"no pod", nil, "WaitForFirstConsumer", "waiting for first consumer to be created before binding"},
		{"one pod", []string{"web-0"}, "WaitForPodScheduled", "waiting for pod web-0 to be scheduled"},
		{"pods", []string{"a", "b", "c"}, "WaitForPodScheduled", "waiting for pods a,b,c to be scheduled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r, m := waitEvent(tc.pods); r != tc.reason || m != tc.message {
				t.Fatalf("got %q %q, want %q %q", r, m, tc.reason, tc.message)
			}
		})
	}
}

func podEv(typ watcherv1.EventType, rv string, p *watcherv1.Pod) *watcherv1.WatchResponse {
	b, _ := proto.Marshal(p)
	return &watcherv1.WatchResponse{Type: typ, Kind: watcherv1.Kind_KIND_POD, Key: p.Namespace + "/" + p.Name, ResourceVersion: rv, Object: b}
}

func testPod(name string, claims ...string) *watcherv1.Pod {
	return &watcherv1.Pod{Namespace: "ns", Name: name, Uid: "uid-" + name, ClaimNames: claims, Phase: "Pending"}
}

// Which pods count, as findNonScheduledPodsByPVC counts them: not
// scheduled (no nodeName) and not terminated, each pod once per claim.
func TestPodIndex(t *testing.T) {
	const (
		add = watcherv1.EventType_EVENT_TYPE_ADDED
		upd = watcherv1.EventType_EVENT_TYPE_UPDATED
		del = watcherv1.EventType_EVENT_TYPE_DELETED
	)
	scheduled := testPod("web", "data")
	scheduled.NodeName = "node-1"
	done := testPod("job", "data")
	done.Phase, done.Terminated = "Succeeded", true
	steps := []struct {
		name    string
		ev      *watcherv1.WatchResponse
		data    []string // unscheduled pods of ns/data after the event
		logs    []string // ... of ns/logs
		changed []string // claims whose pods changed (queued when unbound)
	}{
		{"an unscheduled pod", podEv(add, "2", testPod("web", "data", "logs")), []string{"web"}, []string{"web"}, []string{"ns/data", "ns/logs"}},
		{"a second one", podEv(add, "3", testPod("api", "data")), []string{"api", "web"}, []string{"web"}, []string{"ns/data"}},
		{"an update that changes nothing", podEv(upd, "4", testPod("api", "data")), []string{"api", "web"}, []string{"web"}, nil},
		{"scheduled", podEv(upd, "5", scheduled), []string{"api"}, nil, []string{"ns/data", "ns/logs"}},
		{"an older version is ignored", podEv(upd, "1", testPod("web", "data", "logs")), []string{"api"}, nil, nil},
		{"a terminated pod does not count", podEv(add, "6", done), []string{"api"}, nil, nil},
		{"deleted", podEv(del, "7", testPod("api", "data")), nil, nil, []string{"ns/data"}},
		{"a scheduled pod deleted", podEv(del, "8", scheduled), nil, nil, nil},
		{"created again under the same name", podEv(add, "9", testPod("web", "logs")), nil, []string{"web"}, []string{"ns/logs"}},
	}
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	// ns/data is unbound, ns/logs bound: only unbound claims are queued.
	c.store.putClaim(testClaim("data"))
	logs := testClaim("logs")
	logs.Spec.VolumeName, logs.Annotations = "pv-1", map[string]string{kube.AnnBindCompleted: "yes"}
	c.store.putClaim(logs)
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			for c.claimQueue.Len() > 0 {
				k, _ := c.claimQueue.get()
				c.claimQueue.Done(k)
			}
			if err := c.Event(s.ev); err != nil {
				t.Fatal(err)
			}
			if got := c.pods.unscheduled("ns/data"); !slices.Equal(got, s.data) {
				t.Errorf("ns/data waits for %q, want %q", got, s.data)
			}
			if got := c.pods.unscheduled("ns/logs"); !slices.Equal(got, s.logs) {
				t.Errorf("ns/logs waits for %q, want %q", got, s.logs)
			}
			wantQueued := 0
			if slices.Contains(s.changed, "ns/data") {
				wantQueued = 1
			}
			if n := c.claimQueue.Len(); n != wantQueued {
				t.Errorf("%d claims queued, want %d (ns/data changed: %v)", n, wantQueued, wantQueued == 1)
			}
		})
	}
}

// A full list drops the pods it does not mention, and the claims they
// waited for are synced again.
func TestPodsRelist(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	add := watcherv1.EventType_EVENT_TYPE_ADDED
	c.Reset()
	for _, ev := range []*watcherv1.WatchResponse{
		event(add, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/data", testClaim("data")),
		podEv(add, "2", testPod("gone", "data")), podEv(add, "3", testPod("stays", "data")),
	} {
		if err := c.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	if got := c.pods.unscheduled("ns/data"); !slices.Equal(got, []string{"gone", "stays"}) {
		t.Fatalf("before the relist: %q", got)
	}
	c.Reset()
	for _, ev := range []*watcherv1.WatchResponse{
		event(add, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, "ns/data", testClaim("data")),
		podEv(add, "3", testPod("stays", "data")),
	} {
		if err := c.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	if got := c.pods.unscheduled("ns/data"); !slices.Equal(got, []string{"stays"}) {
		t.Fatalf("after the relist: %q", got)
	}
	if got := c.pods.keys(); !slices.Equal(got, []string{"ns/stays"}) {
		t.Fatalf("pods known %q", got)
	}
}

// The claim's sync gives the event that fits its pods now.
func TestWaitForFirstConsumerClaimEvents(t *testing.T) {
	recorder := record.NewFakeRecorder(100)
	claim := testClaim("data")
	client := fake.NewClientset(claim)
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorder)
	wait := storagev1.VolumeBindingWaitForFirstConsumer
	c.store.putClass(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &wait})
	c.store.putClaim(claim.DeepCopy())
	add := watcherv1.EventType_EVENT_TYPE_ADDED
	sync := func(want string) {
		t.Helper()
		if err := c.syncClaim(t.Context(), c.store.claim("ns/data")); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-recorder.Events:
			if got != want {
				t.Fatalf("event %q, want %q", got, want)
			}
		default:
			t.Fatalf("no event, want %q", want)
		}
	}
	sync("Normal WaitForFirstConsumer waiting for first consumer to be created before binding")
	if err := c.Event(podEv(add, "2", testPod("web-1", "data"))); err != nil {
		t.Fatal(err)
	}
	sync("Normal WaitForPodScheduled waiting for pod web-1 to be scheduled")
	if err := c.Event(podEv(add, "3", testPod("web-0", "data", "other"))); err != nil {
		t.Fatal(err)
	}
	sync("Normal WaitForPodScheduled waiting for pods web-0,web-1 to be scheduled")
	for _, name := range []string{"web-0", "web-1"} {
		if err := c.Event(podEv(watcherv1.EventType_EVENT_TYPE_DELETED, "4", testPod(name, "data"))); err != nil {
			t.Fatal(err)
		}
	}
	sync("Normal WaitForFirstConsumer waiting for first consumer to be created before binding")

	// Once the scheduler selected a node, the claim is provisioned
	// instead: no waiting event.
	if err := c.Event(podEv(add, "5", testPod("web-2", "data"))); err != nil {
		t.Fatal(err)
	}
	selected := claim.DeepCopy()
	selected.ResourceVersion, selected.Annotations = "2", map[string]string{kube.AnnSelectedNode: "node-1"}
	c.store.putClaim(selected)
	_ = c.syncClaim(t.Context(), c.store.claim("ns/data"))
	for len(recorder.Events) > 0 {
		if got := <-recorder.Events; strings.Contains(got, "WaitForPodScheduled") || strings.Contains(got, "WaitForFirstConsumer") {
			t.Fatalf("claim with a selected node got %q", got)
		}
	}
}
