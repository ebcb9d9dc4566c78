package watcher

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

const kindPod = watcherv1.Kind_KIND_POD

// pod builds a pod in ns with the given volumes: "claim:<name>" for a
// persistentVolumeClaim volume, "ephemeral:<volume>" for a generic
// ephemeral volume, anything else for an emptyDir.
func pod(ns, name, rv string, volumes ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv}}
	for i, v := range volumes {
		kind, arg, _ := strings.Cut(v, ":")
		vol := corev1.Volume{Name: "v" + string(rune('a'+i))}
		switch kind {
		case "claim":
			vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: arg}
		case "ephemeral":
			vol.Name = arg
			vol.Ephemeral = &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{}}
		default:
			vol.EmptyDir = &corev1.EmptyDirVolumeSource{}
		}
		p.Spec.Volumes = append(p.Spec.Volumes, vol)
	}
	return p
}

func TestSlimPodClaims(t *testing.T) {
	for _, tc := range []struct {
		name    string
		volumes []string
		want    []string
	}{
		{"no volumes", nil, nil},
		{"no claim", []string{"scratch"}, nil},
		{"claims in volume order", []string{"claim:b", "scratch", "claim:a"}, []string{"b", "a"}},
		{"a claim used twice counts once", []string{"claim:a", "claim:a"}, []string{"a"}},
		{"generic ephemeral volume: <pod>-<volume>", []string{"ephemeral:cache", "claim:data"}, []string{"web-cache", "data"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := slimPod(pod("ns", "web", "1", tc.volumes...))
			if err != nil {
				t.Fatal(err)
			}
			if got := v.(*podView).claims; !slices.Equal(got, tc.want) {
				t.Fatalf("claims %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSlimPodTerminated(t *testing.T) {
	now := metav1.Now()
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	waiting := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}}
	done := corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}}
	for _, tc := range []struct {
		name string
		edit func(*corev1.Pod)
		want bool
	}{
		{"pending", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }, false},
		{"no phase yet", func(*corev1.Pod) {}, false},
		{"running", func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }, false},
		{"succeeded", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
		{"failed", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, true},
		{"deleted, no container status", func(p *corev1.Pod) { p.DeletionTimestamp = &now }, true},
		{"deleted, containers waiting or done", func(p *corev1.Pod) {
			p.DeletionTimestamp = &now
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{done}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting, done}
		}, true},
		{"deleted, a container running", func(p *corev1.Pod) {
			p.DeletionTimestamp = &now
			p.Status.ContainerStatuses = []corev1.ContainerStatus{done, running}
		}, false},
		{"deleted, an ephemeral container in no known state", func(p *corev1.Pod) {
			p.DeletionTimestamp = &now
			p.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{}}
		}, false},
		{"running containers, not deleted", func(p *corev1.Pod) { p.Status.ContainerStatuses = []corev1.ContainerStatus{running} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("ns", "web", "1", "claim:data")
			tc.edit(p)
			v, _ := slimPod(p)
			if got := v.(*podView).terminated; got != tc.want {
				t.Fatalf("terminated %v, want %v", got, tc.want)
			}
		})
	}
}

// The transform must be idempotent (client-go may hand it a cached
// object again) and pass tombstones through.
func TestSlimPodIdempotent(t *testing.T) {
	v, _ := slimPod(pod("ns", "web", "1", "claim:data"))
	again, _ := slimPod(v)
	if again != v {
		t.Fatal("a view was transformed again")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: v}
	if got, _ := slimPod(tomb); got != tomb {
		t.Fatalf("tombstone became %T", got)
	}
}

func decodePod(t *testing.T, b []byte) *watcherv1.Pod {
	t.Helper()
	p := &watcherv1.Pod{}
	if err := proto.Unmarshal(b, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// Pods without claims, and updates that change nothing of the view, make
// no event; the rest do, with the view as the object.
func TestPodHandler(t *testing.T) {
	h := newHub(100)
	log := slog.New(slog.DiscardHandler)
	pods := handler(h, kindPod, log)
	add := func(p *corev1.Pod) {
		v, _ := slimPod(p)
		pods.OnAdd(v, false)
	}
	update := func(old, cur *corev1.Pod) {
		o, _ := slimPod(old)
		n, _ := slimPod(cur)
		pods.OnUpdate(o, n)
	}
	add(pod("ns", "plain", "1", "scratch"))
	base := pod("ns", "web", "2", "claim:data", "scratch", "ephemeral:cache")
	add(base)
	// Labels, conditions, IPs: not in the view.
	relabeled := base.DeepCopy()
	relabeled.ResourceVersion, relabeled.Labels = "3", map[string]string{"a": "b"}
	relabeled.Status.PodIP = "10.0.0.1"
	update(base, relabeled)
	scheduled := relabeled.DeepCopy()
	scheduled.ResourceVersion, scheduled.Spec.NodeName = "4", "node-1"
	update(relabeled, scheduled)
	running := scheduled.DeepCopy()
	running.ResourceVersion, running.Status.Phase = "5", corev1.PodRunning
	update(scheduled, running)
	plainGone, _ := slimPod(pod("ns", "plain", "6", "scratch"))
	pods.OnDelete(plainGone)
	last, _ := slimPod(running)
	pods.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: last})

	h.mu.Lock()
	evs, _, _ := h.since(0, 100)
	h.mu.Unlock()
	var got []string
	for _, e := range evs {
		got = append(got, e.typ.String()+" "+e.key+" "+e.rv)
	}
	want := []string{"EVENT_TYPE_ADDED ns/web 2", "EVENT_TYPE_UPDATED ns/web 4", "EVENT_TYPE_UPDATED ns/web 5", "EVENT_TYPE_DELETED ns/web 5"}
	if !slices.Equal(got, want) {
		t.Fatalf("events\n%q\nwant\n%q", got, want)
	}
	b, err := evs[1].encode(watcherv1.Encoding_ENCODING_PROTOBUF)
	if err != nil {
		t.Fatal(err)
	}
	wantView := &watcherv1.Pod{Namespace: "ns", Name: "web", Uid: "uid-web", ClaimNames: []string{"data", "web-cache"}, NodeName: "node-1"}
	if p := decodePod(t, b); !proto.Equal(p, wantView) {
		t.Fatalf("view %v, want %v", p, wantView)
	}
	j, err := evs[2].encode(watcherv1.Encoding_ENCODING_JSON)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil || m["phase"] != "Running" || m["nodeName"] != "node-1" || m["name"] != "web" {
		t.Fatalf("JSON %s (%v)", j, err)
	}
	if _, _, _, n := h.counts(); n != 0 {
		t.Fatalf("%d pods in the state after both were deleted", n)
	}
}

// Pods go only to subscribers that ask for them; a full list sends them
// after the claims.
func TestWatchPodsOnlyWhenAsked(t *testing.T) {
	h, s, _ := newTestServer(100, true)
	v, _ := slimPod(pod("ns", "web", "1", "claim:c"))
	h.append(typeAdded, kindPod, "ns/web", v.(*podView), "1")
	h.append(typeAdded, kindPVC, "ns/c", claim("ns", "c", "2"), "2")
	h.append(typeAdded, kindClass, "fast", class("fast", "3"), "3")

	all := watch(t, s, &watcherv1.WatchRequest{})
	if got := expectList(t, h, all, 3); strings.Join(got, ",") != "fast,ns/c" {
		t.Fatalf("default list %v: want the storage kinds only", got)
	}
	withPods := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPod, kindPVC, kindClass}})
	if got := expectList(t, h, withPods, 3); strings.Join(got, ",") != "fast,ns/c,ns/web" {
		t.Fatalf("list with pods %v", got)
	}
	v2, _ := slimPod(pod("ns", "other", "4", "claim:c"))
	h.append(typeAdded, kindPod, "ns/other", v2.(*podView), "4")
	h.append(typeUpdated, kindPVC, "ns/c", claim("ns", "c", "5"), "5")
	expectEvent(t, h, withPods.recv(), typeAdded, "ns/other", 4)
	expectEvent(t, h, withPods.recv(), typeUpdated, "ns/c", 5)
	expectEvent(t, h, all.recv(), typeUpdated, "ns/c", 5)
	if st, _ := s.GetStatus(t.Context(), nil); st.GetPods() != 2 {
		t.Fatalf("status counts %d pods, want 2", st.GetPods())
	}
}

// Through serve and a real informer (on a fake clientset): the pod
// informer's cache holds views, and the stream carries them.
func TestServePodsFromTheInformer(t *testing.T) {
	client, c := start(t, 0)
	next, _ := stream(t, c, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPod}})
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_RESET, "")
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_SYNCED, "")
	ctx := context.Background()
	if _, err := client.CoreV1().Pods("ns").Create(ctx, pod("ns", "plain", "", "scratch"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := pod("ns", "web", "", "claim:data")
	if _, err := client.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := next()
	expect(t, ev, watcherv1.EventType_EVENT_TYPE_ADDED, "ns/web")
	if v := decodePod(t, ev.Object); !slices.Equal(v.ClaimNames, []string{"data"}) || v.NodeName != "" {
		t.Fatalf("view %v", v)
	}
	p.Spec.NodeName = "node-1"
	if _, err := client.CoreV1().Pods("ns").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev = next()
	expect(t, ev, watcherv1.EventType_EVENT_TYPE_UPDATED, "ns/web")
	if v := decodePod(t, ev.Object); v.NodeName != "node-1" {
		t.Fatalf("view %v", v)
	}
	if err := client.CoreV1().Pods("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_DELETED, "ns/web")
	if st := waitFor(t, c, 3); st.Pods != 0 {
		t.Fatalf("status %v", st)
	}
}
