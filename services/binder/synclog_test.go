package binder

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// syncedBuffer is a log sink the worker writes while the test reads.
type syncedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A sync that ends because its object is gone or owned elsewhere says
// which object it was, by UID as well as key: the key alone does not tell
// a recreated claim from the one before (issue 39's loose end).
func TestSyncEndedNamesTheUID(t *testing.T) {
	logs := &syncedBuffer{}
	c := newController(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), fake.NewClientset(), record.NewFakeRecorder(10))
	c.Reset()
	pvc := watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
	if err := c.Event(event(watcherv1.EventType_EVENT_TYPE_ADDED, pvc, "ns/x", testClaim("x"))); err != nil {
		t.Fatal(err)
	}
	c.Synced()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.worker(context.Background(), c.claimQueue, func(context.Context, string) error { return errNotOwner })
	}()
	c.claimQueue.add("ns/x")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "sync ended") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	c.claimQueue.ShutDown()
	<-done
	line := logs.String()
	if !strings.Contains(line, "msg=\"sync ended\" key=ns/x uid=uid-x") {
		t.Errorf("the sync ended line lacks the claim's UID:\n%s", line)
	}
}
