package watcher

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// messages is a slog.Handler that keeps every message logged.
type messages struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newMessages() messages { return messages{mu: &sync.Mutex{}, msgs: &[]string{}} }

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.msgs = append(*m.msgs, r.Message)
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

// count is how many messages so far start with prefix.
func (m messages) count(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range *m.msgs {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// counting is a watchclient.Handler that counts what it is given.
type counting struct {
	mu                    sync.Mutex
	resets, events, syncs int
}

func (c *counting) Reset()  { c.mu.Lock(); c.resets++; c.mu.Unlock() }
func (c *counting) Synced() { c.mu.Lock(); c.syncs++; c.mu.Unlock() }
func (c *counting) Event(*watcherv1.WatchResponse) error {
	c.mu.Lock()
	c.events++
	c.mu.Unlock()
	return nil
}

// A subscriber of claims and classes stays current, and keeps its one
// stream, while thousands of volume events flow that it did not ask for:
// churn of another kind is not a stall (issue 23, item 7).
func TestOtherKindsChurnIsNoStall(t *testing.T) {
	client := fake.NewClientset()
	w := startReplica(t, client, "w")
	const stall = time.Second
	logs := newMessages()
	var st watchclient.Status
	h := &counting{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- watchclient.Run(ctx, w.cc, watchclient.Options{
			Kinds:        []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS},
			StallTimeout: stall, ProbeInterval: 50 * time.Millisecond,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
			Status: &st, Logger: slog.New(logs)}, h)
	}()
	defer func() {
		cancel()
		<-done
	}()
	eventually(t, 10*time.Second, func() string {
		if st.Stale(stall) {
			return "the stream never reported itself fresh"
		}
		return ""
	})

	// Volume churn for at least three stall timeouts, and thousands of
	// events: creates, then updates.
	churn := make(chan error, 1)
	go func() {
		start := time.Now()
		for i := 0; i < 1000 || time.Since(start) < 3*stall; i++ {
			name := fmt.Sprintf("pv-%d", i%500)
			var err error
			if i < 500 {
				_, err = client.CoreV1().PersistentVolumes().Create(context.Background(), pv(name), metav1.CreateOptions{})
			} else {
				v := pv(name)
				v.Labels = map[string]string{"round": fmt.Sprint(i)}
				_, err = client.CoreV1().PersistentVolumes().Update(context.Background(), v, metav1.UpdateOptions{})
			}
			if err != nil {
				churn <- err
				return
			}
		}
		churn <- nil
	}()
	var staleFor time.Duration
	t0 := time.Now()
	last := t0
	for churning := true; churning; {
		select {
		case err := <-churn:
			if err != nil {
				t.Fatal(err)
			}
			churning = false
		case <-time.After(20 * time.Millisecond):
		}
		now := time.Now()
		if st.Stale(stall) {
			staleFor += now.Sub(last)
		}
		last = now
	}
	t.Logf("churn took %s", time.Since(t0).Round(time.Millisecond))
	if staleFor > 0 {
		t.Errorf("the claims-and-classes stream counted as stale for %s of volume churn", staleFor.Round(time.Millisecond))
	}
	if n := logs.count("abandoning the watch stream"); n > 0 {
		t.Errorf("the subscriber abandoned its stream %d times during volume churn", n)
	}
	if n := logs.count("watcher unreachable"); n > 0 {
		t.Errorf("the subscriber reconnected %d times during volume churn", n)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resets != 1 || h.events != 0 {
		t.Errorf("the subscriber got %d lists and %d events, want 1 list and no event", h.resets, h.events)
	}
}
