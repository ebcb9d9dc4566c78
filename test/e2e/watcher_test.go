package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// openWatch opens a raw stream on the real watcher.
func openWatch(t *testing.T, ctx context.Context, req *watcherv1.WatchRequest) watcherv1.WatcherService_WatchClient {
	t.Helper()
	cc, err := cluster.e2e.Dial(cluster.watcherAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := watcherv1.NewWatcherServiceClient(cc).Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A subscriber whose stream breaks resumes after its last event and gets
// exactly what it missed, in order, while another subscriber streams on.
func TestWatcherResumeAfterBrokenStream(t *testing.T) {
	prefix := fmt.Sprintf("resume-%d-", time.Now().UnixNano()%100000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Subscriber B streams throughout.
	b := openWatch(t, ctx, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME}})
	// Subscriber A lists, then its stream breaks.
	actx, acancel := context.WithCancel(ctx)
	a := openWatch(t, actx, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME}})
	var cursor *watcherv1.Cursor
	for {
		ev, err := a.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == watcherv1.EventType_EVENT_TYPE_SYNCED {
			cursor = ev.Cursor
			break
		}
	}
	acancel()

	for i := range 5 {
		createPV(t, fmt.Sprintf("%s%d", prefix, i), "1Gi", "resume")
	}
	if err := cluster.client.CoreV1().PersistentVolumes().Delete(ctx, prefix+"0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	want := []string{"ADDED 0", "ADDED 1", "ADDED 2", "ADDED 3", "ADDED 4", "DELETED 0"}
	collect := func(st watcherv1.WatcherService_WatchClient, allowList bool) []string {
		var got []string
		last := uint64(0)
		for len(got) < len(want) {
			ev, err := st.Recv()
			if err != nil {
				t.Fatalf("recv after %v: %v", got, err)
			}
			switch ev.Type {
			case watcherv1.EventType_EVENT_TYPE_RESET, watcherv1.EventType_EVENT_TYPE_SYNCED:
				if !allowList {
					t.Fatalf("a resumed stream got %v", ev.Type)
				}
				continue
			}
			if ev.Cursor.Sequence <= last && ev.Type != watcherv1.EventType_EVENT_TYPE_ADDED {
				t.Fatalf("sequence %d after %d", ev.Cursor.Sequence, last)
			}
			last = ev.Cursor.Sequence
			if !strings.HasPrefix(ev.Key, prefix) || ev.Type == watcherv1.EventType_EVENT_TYPE_UPDATED {
				continue
			}
			pv, err := kube.DecodeVolume(ev.Object)
			if err != nil || pv.Name != ev.Key || ev.ResourceVersion != pv.ResourceVersion {
				t.Fatalf("event %s: object %v, rv %q: %v", ev.Key, pv, ev.ResourceVersion, err)
			}
			got = append(got, strings.TrimPrefix(ev.Type.String(), "EVENT_TYPE_")+" "+strings.TrimPrefix(ev.Key, prefix))
		}
		return got
	}
	a = openWatch(t, ctx, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME}, ResumeAfter: cursor})
	for name, got := range map[string][]string{"resumed": collect(a, false), "continuous": collect(b, true)} {
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s subscriber saw %v, want %v", name, got, want)
		}
	}
}
