package binder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

func testVolume(name string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: "c",
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable},
	}
}

func testClaim(name string) *corev1.PersistentVolumeClaim {
	cls := "c"
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &cls,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

// Many workers racing for few volumes: every volume goes to one claim.
func TestFindAndReserveNeverHandsAVolumeToTwoClaims(t *testing.T) {
	s := newStore()
	for i := range 10 {
		s.putVolume(testVolume(fmt.Sprintf("pv-%d", i)))
	}
	var (
		mu    sync.Mutex
		taken = map[string]string{}
		wg    sync.WaitGroup
	)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := testClaim(fmt.Sprintf("claim-%d", i))
			v, err := s.findAndReserve(c, false)
			if err != nil {
				t.Error(err)
				return
			}
			if v == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if other, ok := taken[v.Name]; ok {
				t.Errorf("%s reserved for %s and %s", v.Name, other, c.Name)
			}
			taken[v.Name] = c.Name
		}()
	}
	wg.Wait()
	if len(taken) != 10 {
		t.Fatalf("%d of 10 volumes reserved", len(taken))
	}
	if s.reserve("pv-0", "someone-else") {
		t.Fatal("reserve of a reserved volume by another claim succeeded")
	}
}

func event(typ watcherv1.EventType, kind watcherv1.Kind, key string, obj kube.Object) *watcherv1.WatchResponse {
	b, _ := kube.EncodeProto(obj)
	return &watcherv1.WatchResponse{Type: typ, Kind: kind, Key: key, Object: b}
}

// After a full list, objects the list did not mention are gone.
func TestRelistDropsObjectsDeletedWhileDisconnected(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	add := watcherv1.EventType_EVENT_TYPE_ADDED
	pvKind, pvcKind := watcherv1.Kind_KIND_PERSISTENT_VOLUME, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
	c.Reset()
	for _, ev := range []*watcherv1.WatchResponse{
		event(add, pvKind, "a", testVolume("a")), event(add, pvKind, "b", testVolume("b")),
		event(add, pvcKind, "ns/x", testClaim("x")), event(add, pvcKind, "ns/y", testClaim("y")),
	} {
		if err := c.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	c.Reset()
	for _, ev := range []*watcherv1.WatchResponse{event(add, pvKind, "b", testVolume("b")), event(add, pvcKind, "ns/y", testClaim("y"))} {
		if err := c.Event(ev); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	if c.store.volume("a") != nil || c.store.claim("ns/x") != nil {
		t.Fatal("objects missing from the new list are still cached")
	}
	if c.store.volume("b") == nil || c.store.claim("ns/y") == nil {
		t.Fatal("objects in the new list were dropped")
	}
}

func TestAPIValidationAndReadiness(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	a := &api{c: c, memberID: "m", members: func() []string { return []string{"m"} }, workers: 1}
	ctx := context.Background()
	if _, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("before the first list: %v, want Unavailable", err)
	}
	c.Reset()
	for i := range 5 {
		if err := c.Event(event(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, fmt.Sprintf("ns/c%d", i), testClaim(fmt.Sprintf("c%d", i)))); err != nil {
			t.Fatal(err)
		}
	}
	c.Synced()
	for name, tc := range map[string]struct {
		req  *binderv1.ListClaimsRequest
		code codes.Code
	}{
		"negative page": {&binderv1.ListClaimsRequest{PageSize: -1}, codes.InvalidArgument},
		"huge page":     {&binderv1.ListClaimsRequest{PageSize: 1 << 20}, codes.InvalidArgument},
		"unknown phase": {&binderv1.ListClaimsRequest{Phase: "Bonud"}, codes.InvalidArgument},
		"all":           {&binderv1.ListClaimsRequest{}, codes.OK},
	} {
		if _, err := a.ListClaims(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", name, err, tc.code)
		}
	}
	// Pages of 2 cover the 5 claims once each.
	var got []string
	token := ""
	for {
		resp, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, cl := range resp.Claims {
			got = append(got, cl.Name)
		}
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	if fmt.Sprint(got) != "[c0 c1 c2 c3 c4]" {
		t.Fatalf("paged claims %v", got)
	}
	if _, err := a.GetClaim(ctx, &binderv1.GetClaimRequest{Namespace: "ns"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("GetClaim without a name: %v", err)
	}
	if _, err := a.GetClaim(ctx, &binderv1.GetClaimRequest{Namespace: "ns", Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetClaim of an unknown claim: %v", err)
	}
}
