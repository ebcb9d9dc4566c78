package watcher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// replica is one watcher on a shared fake clientset that the test can stop.
type replica struct {
	name string
	cc   *grpc.ClientConn
	stop func()
}

func startReplica(t *testing.T, client *fake.Clientset, name string) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Listen: "unused", TLS: grpcutil.TLSFiles{InsecurePlaintext: true}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, client, lis) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("watcher %s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &replica{name: name, cc: cc, stop: stop}
}

// mirror is a subscriber's cache with an informer's Replace semantics: a
// full list replaces the cache (objects it does not mention are deleted),
// and an object is updated only by a newer resourceVersion of the same UID.
// It records every phase an object had, to catch flips back in time.
type mirror struct {
	mu       sync.Mutex
	objs     map[string]*corev1.PersistentVolume
	listed   map[string]bool
	phases   map[types.UID][]corev1.PersistentVolumePhase
	backward []string
}

func newMirror() *mirror {
	return &mirror{objs: map[string]*corev1.PersistentVolume{}, phases: map[types.UID][]corev1.PersistentVolumePhase{}}
}

func (m *mirror) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listed = map[string]bool{}
}

func (m *mirror) Synced() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.objs {
		if !m.listed[k] {
			delete(m.objs, k)
		}
	}
	m.listed = nil
}

func (m *mirror) Event(ev *watcherv1.WatchResponse) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.listed != nil {
		m.listed[ev.Key] = true
	}
	if ev.Type == watcherv1.EventType_EVENT_TYPE_DELETED {
		delete(m.objs, ev.Key)
		return nil
	}
	v, err := kube.DecodeVolume(ev.Object)
	if err != nil {
		return err
	}
	old := m.objs[ev.Key]
	if old != nil && old.UID == v.UID {
		a, _ := strconv.Atoi(old.ResourceVersion)
		b, _ := strconv.Atoi(v.ResourceVersion)
		if b < a {
			m.backward = append(m.backward, fmt.Sprintf("%s: resourceVersion %d after %d", ev.Key, b, a))
			return nil
		}
		if b == a {
			return nil
		}
	}
	m.objs[ev.Key] = v
	if p := m.phases[v.UID]; len(p) == 0 || p[len(p)-1] != v.Status.Phase {
		m.phases[v.UID] = append(p, v.Status.Phase)
	}
	return nil
}

// diff compares the mirror with the API's volumes ("" when equal).
func (m *mirror) diff(client *fake.Clientset) string {
	list, err := client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(list.Items) != len(m.objs) {
		return fmt.Sprintf("mirror holds %d volumes, the API %d", len(m.objs), len(list.Items))
	}
	for _, v := range list.Items {
		c := m.objs[v.Name]
		if c == nil || c.UID != v.UID || c.ResourceVersion != v.ResourceVersion {
			return fmt.Sprintf("volume %s: mirror %v, API %s/%s", v.Name, c, v.UID, v.ResourceVersion)
		}
	}
	return ""
}

func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A subscriber of two watchers fails over when its watcher stops: it
// relists from the other (another epoch: no resume), ends up with exactly
// the API's objects (deletions made while it switched included), and no
// object goes back in time.
func TestSubscriberFailsOverBetweenWatchers(t *testing.T) {
	client := fake.NewClientset()
	a := startReplica(t, client, "a")
	b := startReplica(t, client, "b")
	ctx := context.Background()
	volume := func(name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}, Status: corev1.PersistentVolumeStatus{Phase: phase}}
	}
	for i := range 20 {
		create(t, client, volume(fmt.Sprintf("pv-%d", i), corev1.VolumeAvailable))
	}

	m := newMirror()
	var st watchclient.Status
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		// The client starts at a random replica: Status says which.
		done <- watchclient.RunFailover(wctx, []watchclient.Watcher{{Name: "a", Conn: a.cc}, {Name: "b", Conn: b.cc}},
			watchclient.Options{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME}, StallTimeout: time.Second, ProbeInterval: 50 * time.Millisecond,
				MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Status: &st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, m)
	}()
	defer func() {
		cancel()
		<-done
	}()
	eventually(t, 10*time.Second, func() string { return m.diff(client) })
	eventually(t, 5*time.Second, func() string {
		if st.Stale(time.Second) {
			return "the stream never reported itself fresh"
		}
		return ""
	})
	first, epoch := st.Watcher(), st.Epoch()
	active, other := a, b
	if first == "b" {
		active, other = b, a
	}

	// Stop the watcher in use, and change things while the subscriber
	// moves: updates, deletions, new objects.
	active.stop()
	for i := range 20 {
		name := fmt.Sprintf("pv-%d", i)
		switch i % 3 {
		case 0:
			if err := client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		case 1:
			v, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v.Status.Phase = corev1.VolumeBound
			if _, err := client.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	create(t, client, volume("pv-new", corev1.VolumePending))
	eventually(t, 10*time.Second, func() string {
		if w := st.Watcher(); w != other.name {
			return "the subscriber is still on watcher " + w
		}
		return m.diff(client)
	})
	if st.Epoch() == epoch {
		t.Errorf("epoch %s unchanged after moving to another watcher", epoch)
	}
	eventually(t, 5*time.Second, func() string {
		if st.Stale(time.Second) {
			return "the stream on the second watcher is not fresh"
		}
		return ""
	})
	// Keep going on the second watcher.
	create(t, client, volume("pv-after", corev1.VolumeAvailable))
	eventually(t, 10*time.Second, func() string { return m.diff(client) })

	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.backward) > 0 {
		t.Errorf("objects went back in time: %v", m.backward)
	}
	for uid, ph := range m.phases {
		for i := 1; i < len(ph); i++ {
			if ph[i-1] == corev1.VolumeBound && ph[i] != corev1.VolumeBound {
				t.Errorf("volume %s flipped phases %v", uid, ph)
			}
		}
	}
}
