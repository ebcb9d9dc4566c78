package watcher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// start runs the watcher on a fake clientset and returns a client.
func start(t *testing.T, history int) (*fake.Clientset, watcherv1.WatcherServiceClient) {
	t.Helper()
	client := fake.NewClientset()
	c, _ := startWith(t, client, history)
	return client, c
}

// startWith runs the watcher on client and returns a connection to it.
func startWith(t *testing.T, client *fake.Clientset, history int) (watcherv1.WatcherServiceClient, *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	// Plaintext: the unit tests are about the stream; TLS is grpcutil's.
	o := Options{Listen: "unused", HistorySize: history, TLS: grpcutil.TLSFiles{InsecurePlaintext: true}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- serve(ctx, o, client, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return watcherv1.NewWatcherServiceClient(cc), cc
}

func pv(name string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func pvc(ns, name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// stream opens a Watch and returns a function reading the next event.
func stream(t *testing.T, c watcherv1.WatcherServiceClient, req *watcherv1.WatchRequest) (func() *watcherv1.WatchResponse, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := c.Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return func() *watcherv1.WatchResponse {
		t.Helper()
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		return ev
	}, cancel
}

func expect(t *testing.T, ev *watcherv1.WatchResponse, typ watcherv1.EventType, key string) {
	t.Helper()
	if ev.Type != typ || ev.Key != key {
		t.Fatalf("got %v %q, want %v %q", ev.Type, ev.Key, typ, key)
	}
}

func create(t *testing.T, client *fake.Clientset, obj any) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch o := obj.(type) {
	case *corev1.PersistentVolume:
		_, err = client.CoreV1().PersistentVolumes().Create(ctx, o, metav1.CreateOptions{})
	case *corev1.PersistentVolumeClaim:
		_, err = client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *storagev1.StorageClass:
		_, err = client.StorageV1().StorageClasses().Create(ctx, o, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestListThenLiveEventsThenResume(t *testing.T) {
	client, c := start(t, 0)
	create(t, client, pv("pv-1"))
	create(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "x"})

	next, cancel := stream(t, c, &watcherv1.WatchRequest{})
	reset := next()
	if reset.Type != watcherv1.EventType_EVENT_TYPE_RESET {
		t.Fatalf("first event %v, want RESET", reset.Type)
	}
	// The list holds what existed when the stream started (informers
	// started before the objects may or may not have seen them yet, so
	// read until SYNCED and count).
	seen := map[string]bool{}
	for ev := next(); ev.Type != watcherv1.EventType_EVENT_TYPE_SYNCED; ev = next() {
		expect(t, ev, watcherv1.EventType_EVENT_TYPE_ADDED, ev.Key)
		seen[ev.Key] = true
	}
	create(t, client, pvc("ns", "claim"))
	var last *watcherv1.WatchResponse
	for !seen["ns/claim"] {
		last = next()
		seen[last.Key] = true
	}
	expect(t, last, watcherv1.EventType_EVENT_TYPE_ADDED, "ns/claim")
	claim, err := kube.DecodeClaim(last.Object)
	if err != nil || claim.Name != "claim" { // (the fake clientset sets no resourceVersion)
		t.Fatalf("object %v, rv %q, err %v", claim, last.ResourceVersion, err)
	}
	if !seen["pv-1"] || !seen["fast"] {
		t.Fatalf("missing objects: %v", seen)
	}
	cancel()

	// Changes while nobody listens are delivered on resume, in order.
	if err := client.CoreV1().PersistentVolumes().Delete(context.Background(), "pv-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	create(t, client, pv("pv-2"))
	next, _ = stream(t, c, &watcherv1.WatchRequest{ResumeAfter: last.Cursor})
	del := next()
	expect(t, del, watcherv1.EventType_EVENT_TYPE_DELETED, "pv-1")
	if v, err := kube.DecodeVolume(del.Object); err != nil || v.Name != "pv-1" {
		t.Fatalf("DELETED must carry the last known object: %v %v", v, err)
	}
	add := next()
	expect(t, add, watcherv1.EventType_EVENT_TYPE_ADDED, "pv-2")
	if add.Cursor.Sequence != del.Cursor.Sequence+1 || del.Cursor.Sequence != last.Cursor.Sequence+1 {
		t.Fatalf("sequences %d, %d after %d: not consecutive", del.Cursor.Sequence, add.Cursor.Sequence, last.Cursor.Sequence)
	}
}

func TestCannotResumeMeansAFullList(t *testing.T) {
	client, c := start(t, 2)
	next, _ := stream(t, c, &watcherv1.WatchRequest{})
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_RESET, "")
	synced := next()
	expect(t, synced, watcherv1.EventType_EVENT_TYPE_SYNCED, "")

	// Another epoch (the watcher restarted).
	next, _ = stream(t, c, &watcherv1.WatchRequest{ResumeAfter: &watcherv1.Cursor{Epoch: "old", Sequence: 1}})
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_RESET, "")

	// Events dropped from a history of 2.
	for _, n := range []string{"a", "b", "c", "d"} {
		create(t, client, pv(n))
	}
	waitFor(t, c, 4)
	next, _ = stream(t, c, &watcherv1.WatchRequest{ResumeAfter: synced.Cursor})
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_RESET, "")
	n := 0
	for ev := next(); ev.Type != watcherv1.EventType_EVENT_TYPE_SYNCED; ev = next() {
		n++
	}
	if n != 4 {
		t.Fatalf("full list had %d objects, want 4", n)
	}
}

func waitFor(t *testing.T, c watcherv1.WatcherServiceClient, seq uint64) *watcherv1.GetStatusResponse {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.GetStatus(context.Background(), &watcherv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Sequence >= seq {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %v: never reached sequence %d", st, seq)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKindsFilterAndStatus(t *testing.T) {
	client, c := start(t, 0)
	next, _ := stream(t, c, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM}, Encoding: watcherv1.Encoding_ENCODING_JSON})
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_RESET, "")
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_SYNCED, "")
	create(t, client, pv("ignored"))
	create(t, client, pvc("ns", "wanted"))
	ev := next()
	expect(t, ev, watcherv1.EventType_EVENT_TYPE_ADDED, "ns/wanted")
	if want := `"kind":"PersistentVolumeClaim"`; !contains(string(ev.Object), want) {
		t.Fatalf("JSON object %s lacks %s", ev.Object, want)
	}
	st := waitFor(t, c, 2)
	if !st.Synced || st.PersistentVolumes != 1 || st.PersistentVolumeClaims != 1 || st.Subscribers != 1 || st.OldestSequence != 1 {
		t.Fatalf("status %v", st)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestInvalidRequests(t *testing.T) {
	_, c := start(t, 0)
	st := waitFor(t, c, 0)
	for name, req := range map[string]*watcherv1.WatchRequest{
		"unknown kind":     {Kinds: []watcherv1.Kind{watcherv1.Kind(42)}},
		"unknown encoding": {Encoding: watcherv1.Encoding(9)},
		"future cursor":    {ResumeAfter: &watcherv1.Cursor{Epoch: st.Epoch, Sequence: st.Sequence + 100}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := c.Watch(ctx, req)
		if err == nil {
			_, err = s.Recv()
		}
		cancel()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
}

// A subscriber that falls behind the history gets a full list inline.
func TestHubSubscriberBehindTheRing(t *testing.T) {
	h := newHub(3)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		h.append(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME, n, pv(n), "1")
	}
	h.append(watcherv1.EventType_EVENT_TYPE_DELETED, watcherv1.Kind_KIND_PERSISTENT_VOLUME, "a", pv("a"), "2")
	if h.oldest() != 4 || h.head != 6 {
		t.Fatalf("oldest %d head %d", h.oldest(), h.head)
	}
	if _, ok, _ := h.since(2, 10); ok {
		t.Fatal("since(2) with events 3.. dropped must report the subscriber behind")
	}
	evs, ok, _ := h.since(3, 10)
	if !ok || len(evs) != 3 || evs[0].key != "d" || evs[2].typ != watcherv1.EventType_EVENT_TYPE_DELETED {
		t.Fatalf("since(3): %v %v", evs, ok)
	}
	all := kindSet{}
	all[watcherv1.Kind_KIND_PERSISTENT_VOLUME] = true
	objs, seq := h.snapshot(all)
	if len(objs) != 4 || seq != 6 {
		t.Fatalf("snapshot %d objects at %d, want 4 at 6", len(objs), seq)
	}
}

// Health turns SERVING, and streams start, only once every informer has
// listed its objects.
func TestServingOnlyAfterSync(t *testing.T) {
	client := fake.NewClientset(pv("listed"))
	release := make(chan struct{})
	client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil // on to the tracker
	})
	c, cc := startWith(t, client, 0)
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // runs before the watcher stops

	health := healthpb.NewHealthClient(cc)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health check %q: %v", service, err)
		}
		return resp.GetStatus()
	}
	watcherService := watcherv1.WatcherService_ServiceDesc.ServiceName
	for _, svc := range []string{"", watcherService} {
		if got := check(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health %q before sync: %v", svc, got)
		}
	}
	if st, err := c.GetStatus(t.Context(), &watcherv1.GetStatusRequest{}); err != nil || st.Synced {
		t.Fatalf("status before sync: %v, %v", st, err)
	}
	next, _ := stream(t, c, &watcherv1.WatchRequest{})
	open()
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_RESET, "")
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_ADDED, "listed")
	expect(t, next(), watcherv1.EventType_EVENT_TYPE_SYNCED, "")
	deadline := time.Now().Add(10 * time.Second)
	for check("") != healthpb.HealthCheckResponse_SERVING || check(watcherService) != healthpb.HealthCheckResponse_SERVING {
		if time.Now().After(deadline) {
			t.Fatal("health never turned SERVING after sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Several gRPC subscribers see the same events in the same order.
func TestSubscribersOverGRPC(t *testing.T) {
	client, c := start(t, 0)
	const subscribers, volumes = 8, 30
	nexts := make([]func() *watcherv1.WatchResponse, subscribers)
	for i := range nexts {
		nexts[i], _ = stream(t, c, &watcherv1.WatchRequest{})
		expect(t, nexts[i](), watcherv1.EventType_EVENT_TYPE_RESET, "")
		expect(t, nexts[i](), watcherv1.EventType_EVENT_TYPE_SYNCED, "")
	}
	for i := range volumes {
		create(t, client, pv(fmt.Sprintf("pv-%d", i)))
	}
	var want []string
	for _, next := range nexts {
		var got []string
		prev := uint64(0)
		for range volumes {
			ev := next()
			if prev != 0 && ev.Cursor.Sequence != prev+1 {
				t.Fatalf("sequence %d after %d", ev.Cursor.Sequence, prev)
			}
			prev = ev.Cursor.Sequence
			got = append(got, ev.Key)
		}
		if want == nil {
			want = got
		} else if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("subscribers disagree on the order:\n%v\n%v", got, want)
		}
	}
	if st := waitFor(t, c, volumes); st.Subscribers != subscribers {
		t.Fatalf("status %v: want %d subscribers", st, subscribers)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing-kubeconfig")
	for _, tc := range []struct {
		name string
		o    Options
		flag string
	}{
		{"no listen address", Options{Kubeconfig: missing}, "--listen"},
		{"negative history", Options{Listen: "127.0.0.1:0", HistorySize: -1}, "--history-size"},
		{"negative resync", Options{Listen: "127.0.0.1:0", ResyncPeriod: -time.Second}, "--resync-period"},
		{"negative burst", Options{Listen: "127.0.0.1:0", KubeBurst: -1}, "--kube-api-burst"},
		{"no TLS", Options{Listen: "127.0.0.1:0", Kubeconfig: missing}, "--tls-ca-file"},
		{"half the TLS files", Options{Listen: "127.0.0.1:0", Kubeconfig: missing, TLS: grpcutil.TLSFiles{CAFile: "ca.crt"}}, "--tls-cert-file"},
		{"certificate without key", Options{Listen: "127.0.0.1:0", Kubeconfig: missing, TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt"}}, "--tls-key-file"},
		{"plaintext and TLS files", Options{Listen: "127.0.0.1:0", Kubeconfig: missing, TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt", KeyFile: "tls.key", InsecurePlaintext: true}}, "--insecure-plaintext"},
		{"no kubeconfig", Options{Listen: "127.0.0.1:0", Kubeconfig: missing, TLS: grpcutil.TLSFiles{InsecurePlaintext: true}}, "--kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(t.Context(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("got %v, want an error naming %s", err, tc.flag)
			}
		})
	}
}
