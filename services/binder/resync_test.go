package binder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/memstat"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// A periodic resync queues every claim and volume once, a slice at a
// time: the queues never hold two slices, and a claim that
// arrives during the pass is synced before the rest of the pass.
func TestResyncIsPaced(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	const n = 1200
	for i := range n {
		c.store.putClaim(testClaim(fmt.Sprintf("c%04d", i)))
		c.store.putVolume(testVolume(fmt.Sprintf("v%04d", i)))
	}
	done := make(chan struct{})
	go func() { defer close(done); c.resyncPaced(t.Context()) }()

	queued := func() int { return c.claimQueue.Len() + c.volumeQueue.Len() }
	deadline := time.Now().Add(10 * time.Second)
	for queued() < resyncSlice && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a resync that did not pace would queue more now
	if got := queued(); got != resyncSlice {
		t.Fatalf("%d keys queued at first, want one slice of %d", got, resyncSlice)
	}
	c.claimQueue.add("ns/arrived")

	seen := map[string]int{}
	arrivedAt, order := -1, 0
	take := func(q *queue) bool {
		if q.Len() == 0 {
			return false
		}
		k, _ := q.get()
		q.Done(k)
		seen[k]++
		if k == "ns/arrived" {
			arrivedAt = order
		}
		order++
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if !take(c.claimQueue) && !take(c.volumeQueue) {
			select {
			case <-done:
				if queued() == 0 {
					deadline = time.Time{}
				}
			case <-time.After(time.Millisecond):
			}
		}
		if queued() >= 2*resyncSlice+1 {
			t.Fatalf("%d keys queued: a slice is added only while fewer than a slice wait", queued())
		}
	}
	if len(seen) != 2*n+1 {
		t.Fatalf("%d distinct keys synced, want %d", len(seen), 2*n+1)
	}
	for k, times := range seen {
		if times != 1 {
			t.Fatalf("%s synced %d times", k, times)
		}
	}
	if arrivedAt < 0 || arrivedAt > 2*resyncSlice {
		t.Errorf("the claim that arrived during the pass was synced %dth of %d, want within the first two slices", arrivedAt+1, 2*n+1)
	}
}

// BenchmarkResyncBoundPair is the binder's work per bound claim and volume
// in a periodic resync (go test -bench ResyncBoundPair ./services/binder/):
// at 100,000 volumes a pass makes 190,000 such syncs every 15s.
func BenchmarkResyncBoundPair(b *testing.B) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	const n = 1000
	for i := range n {
		cl, v := testClaim(fmt.Sprintf("c%04d", i)), testVolume(fmt.Sprintf("v%04d", i))
		cl.Spec.VolumeName = v.Name
		cl.Annotations = map[string]string{kube.AnnBindCompleted: "yes", kube.AnnBoundByController: "yes"}
		cl.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: v.Spec.AccessModes, Capacity: v.Spec.Capacity}
		v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "ns", Name: cl.Name, UID: cl.UID}
		v.Annotations = map[string]string{kube.AnnBoundByController: "yes"}
		v.Status.Phase = corev1.VolumeBound
		c.store.putClaim(cl)
		c.store.putVolume(v)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := fmt.Sprintf("%04d", i%n)
		if err := c.syncClaimKey(b.Context(), "ns/c"+k); err != nil {
			b.Fatal(err)
		}
		if err := c.syncVolumeKey(b.Context(), "v"+k); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResyncPass100k is one periodic resync of 100,000 Bound pairs
// (200,000 keys) through the queues and the workers, as run does it:
// what a pass costs the binder at cluster scale. It reports the pass's
// CPU per key besides its wall time. Run it once:
//
//	go test -run '^$' -bench ResyncPass100k -benchtime 3x ./services/binder/
func BenchmarkResyncPass100k(b *testing.B) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	const n = 100_000
	for i := range n {
		pv, pvc := memstat.BoundPair(i)
		c.store.putVolume(pv)
		c.store.putClaim(pvc)
	}
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { c.worker(ctx, c.claimQueue, c.syncClaimKey) })
		wg.Go(func() { c.worker(ctx, c.volumeQueue, c.syncVolumeKey) })
	}
	b.ReportAllocs()
	var cpu time.Duration
	for b.Loop() {
		before := memstat.CPUTime()
		c.resyncPaced(ctx)
		for c.claimQueue.Len()+c.volumeQueue.Len() > 0 {
			time.Sleep(time.Millisecond)
		}
		cpu += memstat.CPUTime() - before
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/(2*n), "cpu-ns/key")
	c.claimQueue.ShutDown()
	c.volumeQueue.ShutDown()
	wg.Wait()
}
